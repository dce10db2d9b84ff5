"""The Triton implementation of :class:`gateway.backend.Backend`, over gRPC streaming.

With :mod:`gateway.backend.grpc_streams` (its kept calls), the only module that talks to
Triton. Each model's requests are built, and its responses read, by the profile its config
picks (:mod:`gateway.backend.profiles`: the vLLM
backend of any release, TensorRT-LLM, or a model's own tensors). A decoupled model's
requests go over ``ModelStreamInfer`` calls that are kept open and lent to one request at a
time (:mod:`gateway.backend.grpc_streams`), another's over one plain ``ModelInfer`` call;
cancelling the call cancels that request in Triton, which the model sees through
``is_cancelled()``. Admin calls use
``tritonclient.grpc.aio``.

Errors: how Triton's failures read as gateway errors is :mod:`gateway.backend.triton_errors`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from opentelemetry.trace import Span
from tritonclient.utils import InferenceServerException

from gateway import tracing
from gateway.backend import grpc_streams as streams
from gateway.backend.base import (
    AudioChunk,
    ChatImage,
    Embeddings,
    GenerationChunk,
    ModelInfo,
    RepositoryModel,
    SamplingOptions,
    Segment,
    TranscriptionOptions,
)
from gateway.backend.profiles import Contract, ModelConfig, contract_for
from gateway.backend.tokenizer import Tokenizers
from gateway.backend.triton_errors import (
    SERVER_BUSY,
    check_control,
    from_client_error,
    from_rpc_error,
    model_error,
)
from gateway.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GatewayError,
    ModelNotFoundError,
)
from gateway.outages import Attempt, Outage


def _end_span(span: Span, responses: int, exc: BaseException | None) -> None:
    """Ends a Triton request's span with its outcome: ok, the error it raised, or
    ``cancelled`` when the gateway stopped reading before the final response (a stop
    string it cut at, a client gone: Triton was told to cancel it)."""
    span.set_attribute("triton.responses", responses)
    if exc is None:
        span.set_attribute("gateway.outcome", "ok")
    elif isinstance(exc, GeneratorExit):
        span.set_attribute("gateway.outcome", "cancelled")
    else:
        tracing.failed(span, exc)
    span.end()


def model_info_from_config(
    name: str,
    config: dict[str, Any],
    configs: dict[str, ModelConfig] | None = None,
    tokenizers: Tokenizers | None = None,
) -> ModelInfo:
    """What a model serves and takes, read from its config (Triton's JSON form) by its
    profile; a model no profile serves (an ensemble's step) has no task."""
    contract = _contract(ModelConfig.from_json(name, config), configs, tokenizers)
    return contract.info() if contract is not None else ModelInfo(name, None, True)


def _contract(
    config: ModelConfig,
    configs: dict[str, ModelConfig] | None,
    tokenizers: Tokenizers | None,
) -> Contract | None:
    tokenizer = tokenizers.get(config.name) if tokenizers is not None else None
    return contract_for(config, configs, tokenizer)


logger = logging.getLogger(__name__)
#: Stop requests under way (a task must be referenced until it ends), at most
#: :data:`MAX_STOPPING` at once (past it, a left request is only cancelled: the model also
#: polls its call's cancellation), each answered within :data:`STOP_TIMEOUT_S`.
_STOPPING: set[asyncio.Future[None]] = set()
MAX_STOPPING = 64
STOP_TIMEOUT_S = 2.0


class TritonBackend:
    """Talks to one Triton server over ``tritonclient.grpc.aio``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        load_timeout_s: float = 300.0,
        on_error: Callable[[str, str | None], None] | None = None,
        tokenizers: Tokenizers | None = None,
        outage: Outage | None = None,
        on_engine: Callable[[str, dict[str, float]], None] | None = None,
    ) -> None:
        """``on_error(model, code)`` hears of every failed inference (for metrics);
        ``on_engine(model, stats)`` of an engine's measurements of a request
        (:meth:`Contract.engine_stats`);
        ``tokenizers`` are the models' tokenizer files (templates, token counts);
        ``outage`` is what this process knows of Triton's outages (none given: calls never
        wait for a Triton coming back, as in a pool, which routes around it instead)."""
        self.outage = outage
        self.tokenizers = tokenizers or Tokenizers()
        self._contracts: dict[str, Contract] = {}
        self.url = url
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.on_error = on_error
        self.on_engine = on_engine
        self.client = triton_grpc.InferenceServerClient(url, channel_args=streams.CHANNEL_OPTIONS)
        self.streams = streams.StreamPool(url)

    async def live(self) -> bool:
        """Whether Triton serves now (never waits: a probe wants the answer of now): it is
        live. Not Triton's own readiness, which its strict mode (the default) makes false
        while any model of the repository failed to load, although every other model
        serves; :meth:`models` tells each model's state. Triton answers live only once
        the models it was started with are loaded, and not while it shuts down."""
        try:
            live = bool(await self.client.is_server_live(client_timeout=self.timeout_s))
        except InferenceServerException:
            return False
        if live and self.outage is not None:
            self.outage.up()
        return live

    def _attempt(self) -> Attempt | None:
        """A call's tries (none without ``outage``: it never waits)."""
        return Attempt(self.outage) if self.outage is not None else None

    async def _again(self, error: GatewayError, call: Attempt | None) -> bool:
        """After a call Triton never began to serve failed with ``error``: whether to try it
        again, after a wait for a Triton coming back (:mod:`gateway.outages`). When not,
        an unreachable Triton's error says in its ``Retry-After`` when to come back."""
        if call is None or not isinstance(error, BackendUnavailableError):
            return False
        if any(sign in (error.detail or "") for sign in SERVER_BUSY):
            call.outage.up()  # it answered: busy, not gone
            return False
        if await call.failed():
            return True
        error.headers["Retry-After"] = str(call.outage.retry_after())
        return False

    @staticmethod
    def _reached(call: Attempt | None) -> None:
        """Triton answered ``call``."""
        if call is not None:
            call.reached()

    async def _index(self) -> list[dict[str, Any]]:
        call = self._attempt()
        while True:
            try:
                index = await self.client.get_model_repository_index(
                    as_json=True, client_timeout=self.timeout_s
                )
            except InferenceServerException as exc:
                error = from_client_error(exc)
                if await self._again(error, call):
                    continue
                raise error from exc
            self._reached(call)
            return list(index.get("models", []))

    async def repository(self) -> list[RepositoryModel]:
        return [
            RepositoryModel(
                name=e["name"],
                state=e.get("state", ""),
                version=e.get("version", ""),
                reason=e.get("reason", ""),
            )
            for e in await self._index()
        ]

    async def _known(self, name: str) -> None:
        if name not in {e["name"] for e in await self._index()}:
            raise ModelNotFoundError(name)

    async def load_model(self, name: str) -> None:
        await self._known(name)
        try:
            await self.client.load_model(name, client_timeout=self.load_timeout_s)
        except InferenceServerException as exc:
            check_control(exc)
            error = from_client_error(exc, name)
            if not isinstance(error, BackendUnavailableError | BackendTimeoutError):
                error = BackendError(
                    f"Triton could not load '{name}': {exc.message() or exc}",
                    code="model_load_failed",
                )
            raise error from exc

    async def unload_model(self, name: str) -> None:
        await self._known(name)
        try:
            await self.client.unload_model(name, client_timeout=self.load_timeout_s)
        except InferenceServerException as exc:
            check_control(exc)
            raise from_client_error(exc, name) from exc
        # Triton answers while the model is still UNLOADING (its requests in flight finish
        # first); wait a little for the end, so the answer shows where it landed.
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            states = {e["name"]: e.get("state", "") for e in await self._index()}
            if states.get(name) != "UNLOADING":
                return
            await asyncio.sleep(0.1)

    async def models(self) -> list[ModelInfo]:
        entries = await self._index()
        ready = [e["name"] for e in entries if e.get("state") == "READY"]
        read = await asyncio.gather(*(self._read_config(name) for name in ready))
        configs = {c.name: c for c in read if c is not None}
        # Profiles are picked with every config at hand: an ensemble's steps tell its kind.
        self._contracts = {
            name: contract
            for name, config in configs.items()
            if (contract := _contract(config, configs, self.tokenizers)) is not None
        }
        infos = {name: c.info() for name, c in self._contracts.items()}
        for entry in entries:
            name, state, reason = entry["name"], entry.get("state", ""), entry.get("reason", "")
            info = infos.get(name) or ModelInfo(name, None, ready=name in configs)
            # A model READY in the index whose config could not be read (unloaded between
            # the two calls) is not ready: its state says so too.
            infos[name] = dataclasses.replace(
                info, state=state if info.ready or state != "READY" else "", reason=reason
            )
        return sorted(infos.values(), key=lambda info: info.name)

    async def _read_config(self, name: str) -> ModelConfig | None:
        try:
            reply = await self.client.get_model_config(
                name, as_json=True, client_timeout=self.timeout_s
            )
        except InferenceServerException:
            return None  # unloaded between the index and this call
        return ModelConfig.from_json(name, reply.get("config", {}))

    async def contract(self, model: str) -> Contract:
        """How to talk to ``model``: from the last model list, or read now."""
        found = self._contracts.get(model)
        if found is None:
            await self.models()
            found = self._contracts.get(model)
        if found is None:
            raise ModelNotFoundError(model)
        return found

    async def _stream(
        self,
        model: str,
        inputs: list[streams.Input],
        decoupled: bool = True,
        request_id: str = "",
    ) -> AsyncGenerator[streams.Outputs, None]:
        """One request: yields each response's outputs up to the final one. A decoupled
        model's goes on a kept gRPC stream, another's is one plain call. Leaving early
        cancels the request in Triton. A request that fails on an unreachable Triton before
        its first response is sent again once a Triton coming back is (within the
        request's wait allowance, :mod:`gateway.outages`); after its first response a
        failure is the request's."""
        message = streams.request(model, inputs, request_id)
        # Traced (the request is sampled): a span of its own, whose context Triton reads
        # from the call's metadata, so its spans join the trace under this one.
        span, metadata = tracing.client_span("triton.infer"), None
        if span is not None:
            span.set_attributes(
                {
                    "rpc.system": "grpc",
                    "rpc.service": "inference.GRPCInferenceService",
                    "rpc.method": "ModelStreamInfer" if decoupled else "ModelInfer",
                    "server.address": self.url,
                    "triton.model_name": model,
                }
            )
            metadata = tracing.metadata(span)
        responses, failure = 0, None
        call = self._attempt()
        try:
            while True:
                answered = False
                try:
                    if not decoupled:
                        outputs = await self.streams.infer_once(message, metadata)
                        answered = True
                        responses = 1
                        self._reached(call)
                        yield outputs
                        return
                    async with aclosing(self.streams.infer(message, metadata)) as results:
                        async for outputs in results:
                            responses += 1
                            if not answered:
                                answered = True
                                self._reached(call)
                                if span is not None:
                                    span.add_event("first_response")  # time to first token
                            yield outputs
                    return
                except grpc.aio.AioRpcError as exc:
                    error = from_rpc_error(exc, model)
                    if answered:
                        if self.outage is not None and isinstance(error, BackendUnavailableError):
                            self.outage.down()
                            error.headers["Retry-After"] = str(self.outage.retry_after())
                    elif await self._again(error, call):
                        continue
                    raise self._failed(model, error) from exc
                except streams.ModelError as exc:
                    if self.outage is not None:
                        self.outage.up()  # Triton answered, with an error
                    if not answered and not await self._model_ready(model):
                        # Unloaded since the catalog last looked (by another replica's
                        # admin call, say): Triton's in-stream error says so only in words.
                        raise ModelNotFoundError(model) from None
                    raise self._failed(model, model_error(model, str(exc))) from None
        except BaseException as exc:  # what the span ends with
            failure = exc
            raise
        finally:
            if span is not None:
                _end_span(span, responses, failure)

    async def _model_ready(self, model: str) -> bool:
        try:
            return bool(await self.client.is_model_ready(model, client_timeout=self.timeout_s))
        except InferenceServerException:
            return False

    def _failed(self, model: str, error: GatewayError) -> GatewayError:
        if self.on_error is not None:
            self.on_error(model, error.code)
        return error

    async def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        contract = await self.contract(model)
        inputs, rules = contract.generate(prompt, options, stream, images)
        reader = contract.reader(prompt, rules)
        stop = contract.stop_request()
        request_id = uuid.uuid4().hex if stop is not None else ""
        finished = False
        stats: dict[str, float] = {}
        try:
            async with aclosing(
                self._stream(model, inputs, contract.config.decoupled, request_id)
            ) as results:
                async for outputs in results:
                    chunk = reader.read(outputs)
                    # The engine's measurements, as its last response with them has them
                    # (a stream repeats them on every response): recorded once a request.
                    stats = contract.engine_stats(outputs) or stats
                    if chunk is not None:
                        yield chunk
                    if reader.done:
                        break  # a stop string the gateway cut at: leaving cancels the request
                else:
                    finished = True
        except Exception:
            finished = True  # the request failed: there is nothing to stop
            raise
        finally:
            # Left early (a stop string cut at, the client gone): stop the engine too.
            if stop is not None and not finished:
                self._stop(model, stop, request_id)
            if stats:
                self._engine(model, stats)
        yield reader.finish()

    def _engine(self, model: str, stats: dict[str, float]) -> None:
        """An engine's measurements of a request: on the request's trace span, and to
        ``on_engine`` (the metrics)."""
        tracing.record("triton.engine", stats)
        if self.on_engine is not None:
            self.on_engine(model, stats)

    def _stop(self, model: str, inputs: list[streams.Input], request_id: str) -> None:
        """Tells a model that is not stopped by its cancelled call to stop the request
        ``request_id`` (its ``stop`` flag), in a task of its own: the request that left may
        be being cancelled. Best effort, bounded by the call timeout: the model answers the
        stop request with an error (what it does), and a failure is only logged."""

        async def send() -> None:
            message = streams.request(model, inputs, request_id)
            try:
                await asyncio.wait_for(self.streams.infer_once(message), STOP_TIMEOUT_S)
            except (grpc.aio.AioRpcError, streams.ModelError, TimeoutError):
                pass  # answered (the stop's own CANCELLED reply), or nothing left to stop
            except Exception:
                logger.warning("model %s: stopping request %s failed", model, request_id)

        if len(_STOPPING) >= MAX_STOPPING:
            logger.warning(
                "model %s: request %s not stopped: too many stops under way", model, request_id
            )
            return
        task = asyncio.ensure_future(send())
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)

    async def synthesize(
        self, model: str, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> AsyncGenerator[AudioChunk, None]:
        contract = await self.contract(model)
        inputs = contract.synthesize(text, voice, speed, instructions)
        async with aclosing(self._stream(model, inputs, contract.config.decoupled)) as results:
            async for outputs in results:
                chunk = contract.audio(outputs)
                if chunk is not None:
                    yield chunk

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        contract = await self.contract(model)
        inputs = contract.transcribe(audio, options)
        duration = audio.size / 16_000
        async with aclosing(self._stream(model, inputs, contract.config.decoupled)) as results:
            async for outputs in results:
                segment = contract.segment(outputs, duration)
                if segment is not None:
                    yield segment

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        contract = await self.contract(model)
        requests = contract.embed(texts, input_type)

        async def answer(inputs: list[streams.Input]) -> streams.Outputs:
            last = None
            async with aclosing(self._stream(model, inputs, contract.config.decoupled)) as results:
                async for outputs in results:
                    if outputs.has_data:
                        last = outputs
            if last is None:
                raise self._failed(model, BackendError(f"Model '{model}' sent no embedding."))
            return last

        replies = await asyncio.gather(*(answer(inputs) for inputs in requests))
        vectors, tokens = contract.embeddings(list(replies))
        if len(vectors) != len(texts):
            raise self._failed(
                model,
                BackendError(f"Model '{model}' sent {len(vectors)} vectors for {len(texts)}."),
            )
        if not any(tokens):  # the model reports no counts: its tokenizer's, or an estimate
            tokens = [contract.count(text) for text in texts]
        return Embeddings(
            vectors=np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1),
            tokens=tuple(tokens),
        )

    async def count_tokens(self, model: str, text: str) -> tuple[int, bool]:
        contract = await self.contract(model)
        # A tokenizer takes about a second a megabyte: off the event loop.
        return await asyncio.to_thread(contract.count, text), contract.tokenizer is None

    async def close(self) -> None:
        await self.streams.close()
        await self.client.close()
