"""The Triton implementation of :class:`gateway.backend.Backend`, over gRPC streaming.

This is the only module that talks to Triton. Chat requests use the vLLM-backend tensors
(see ``triton_repo/README.md``). Streamed requests go over ``ModelStreamInfer`` calls that
are kept open and lent to one request at a time (:mod:`gateway.backend.grpc_streams`);
cancelling the call cancels that request in Triton, which the model sees through
``is_cancelled()``. Admin calls and embeddings use ``tritonclient.grpc.aio``.

Errors: gRPC status codes of the call map to gateway errors by kind (UNAVAILABLE -> 503,
DEADLINE_EXCEEDED -> 504, ...). An error a model sends inside the stream reaches the client
as text only (Triton 2.51's ``triton_grpc_error`` mode, which would carry the code, crashes
the server on an error after the first response), so it becomes a 500 ``model_error``
carrying the model's message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from tritonclient.utils import InferenceServerException

from gateway.backend import grpc_streams as streams
from gateway.backend.base import (
    AudioChunk,
    Embeddings,
    GenerationChunk,
    ModelInfo,
    RepositoryModel,
    SamplingOptions,
    Segment,
    TokenLogprob,
    TopLogprob,
    TranscriptionOptions,
    Word,
)
from gateway.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
)

_CHAT_INPUTS = {"text_input", "sampling_parameters"}

# The switches are the same on every chat request, so they are built once.
_STREAM = {True: streams.flag("stream", True), False: streams.flag("stream", False)}
_LOGPROBS = streams.flag("return_logprobs", True)
_SWITCHES = [
    streams.flag(name, True)
    for name in (
        "exclude_input_in_output",
        "return_finish_reason",
        "return_num_input_tokens",
        "return_num_output_tokens",
    )
]


def _string(outputs: streams.Outputs, name: str) -> str:
    value = outputs.first_bytes(name)
    return value.decode("utf-8") if value is not None else ""


def _status_error(code: str, message: str, model: str | None = None) -> GatewayError:
    """Maps a gRPC status (name, e.g. ``UNAVAILABLE``) to the gateway error of that kind."""
    if code in ("UNAVAILABLE", "CANCELLED"):
        return BackendUnavailableError(f"Triton is unavailable: {message}")
    if code == "DEADLINE_EXCEEDED":
        return BackendTimeoutError(f"Triton did not answer in time: {message}")
    if code == "NOT_FOUND" and model is not None:
        return ModelNotFoundError(model)
    if code == "INVALID_ARGUMENT":
        return InvalidRequestError(message)
    return BackendError(f"Triton error ({code}): {message}")


#: How vLLM (and the models here, which copy its wording) refuse a prompt too long for the
#: context; errors on a stream carry no status code, so the message is the only sign.
_CONTEXT_EXCEEDED = "maximum context length"


def _model_error(model: str, message: str) -> GatewayError:
    """An error response of a model on a stream."""
    if _CONTEXT_EXCEEDED in message:
        return InvalidRequestError(message, code="context_length_exceeded")
    return BackendError(f"Model '{model}' failed: {message}")


def _from_client_error(exc: InferenceServerException, model: str | None = None) -> GatewayError:
    status = exc.status() or ""
    return _status_error(status.removeprefix("StatusCode."), exc.message() or str(exc), model)


def _from_rpc_error(exc: grpc.aio.AioRpcError, model: str | None = None) -> GatewayError:
    return _status_error(exc.code().name, exc.details() or "", model)


def _parameters(config: dict[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


#: What a stock vLLM-backend model (``backend: "vllm"``) enforces when its config says
#: nothing: every kind of vLLM's structured outputs.
_VLLM_CONSTRAINTS = ("json", "json_object", "regex", "choice", "grammar")


def model_info_from_config(name: str, config: dict[str, Any]) -> ModelInfo:
    """Reads the OpenAI task and the chat capabilities from a model's config.

    A model without an ``openai_task`` parameter whose inputs are the vLLM backend's is a
    chat model, so a stock vLLM Triton is served without editing its configs; one whose
    backend is ``vllm`` enforces structured outputs unless its config says otherwise. A
    model reports log probabilities when its config has the ``logprobs`` output."""
    params = _parameters(config)
    task = params.get("openai_task") or None
    inputs = {i.get("name") for i in config.get("input", [])}
    outputs = {o.get("name") for o in config.get("output", [])}
    if task is None and inputs >= _CHAT_INPUTS:
        task = "chat"
    context = params.get("context_length") or params.get("max_model_len")
    max_logprobs = params.get("max_logprobs", "")

    def names(key: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in params.get(key, "").split(",") if v.strip())

    constraints = names("structured_outputs")
    if "structured_outputs" not in params and config.get("backend") == "vllm":
        constraints = _VLLM_CONSTRAINTS
    return ModelInfo(
        name=name,
        task=task,
        ready=True,
        chat_template=params.get("chat_template") or None,
        context_length=_integer(context),
        voices=names("voices"),
        languages=names("languages"),
        tool_call_parser=params.get("tool_call_parser") or None,
        structured_outputs=constraints,
        structured_outputs_key=params.get("structured_outputs_key") or "structured_outputs",
        logprobs="logprobs" in outputs and "return_logprobs" in inputs,
        max_logprobs=int(max_logprobs) if max_logprobs.isdigit() else 20,
        dimensions=_integer(params.get("dimensions")),
        max_input_tokens=_integer(params.get("max_input_tokens")),
        matryoshka=params.get("matryoshka", "").lower() == "true",
        input_types=_input_types(params),
        max_batch_size=int(config.get("max_batch_size") or 0),
    )


def _integer(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _input_types(params: dict[str, str]) -> tuple[str, ...]:
    """``input_types`` of an embedding model, its ``default_input_type`` first."""
    kinds = [v.strip() for v in params.get("input_types", "").split(",") if v.strip()]
    default = params.get("default_input_type", "").strip()
    if default in kinds:
        kinds.remove(default)
        kinds.insert(0, default)
    return tuple(kinds)


def _logprobs(outputs: streams.Outputs) -> tuple[TokenLogprob, ...]:
    """The ``logprobs`` output of Triton's vLLM backend: JSON, a list with one object per new
    token mapping token ids to ``{"logprob", "rank", "decoded_token"}``; the sampled token
    comes first (vLLM's order), the alternatives by rank."""
    raw = outputs.first_bytes("logprobs")
    if not raw:
        return ()
    positions = json.loads(raw)
    tokens = []
    for position in positions or ():
        entries = list(position.values())
        if not entries:
            continue
        chosen = entries[0]
        ranked = sorted(
            {e["rank"]: e for e in entries if e.get("rank") is not None}.values(),
            key=lambda e: e["rank"],
        )
        tokens.append(
            TokenLogprob(
                token=chosen.get("decoded_token") or "",
                logprob=float(chosen["logprob"]),
                top=tuple(
                    TopLogprob(e.get("decoded_token") or "", float(e["logprob"])) for e in ranked
                ),
            )
        )
    return tuple(tokens)


class TritonBackend:
    """Talks to one Triton server over ``tritonclient.grpc.aio``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        load_timeout_s: float = 300.0,
        on_error: Callable[[str, str | None], None] | None = None,
    ) -> None:
        """``on_error(model, code)`` hears of every failed inference (for metrics)."""
        self.url = url
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.on_error = on_error
        self.client = triton_grpc.InferenceServerClient(url, channel_args=streams.CHANNEL_OPTIONS)
        self.streams = streams.StreamPool(url)

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready(client_timeout=self.timeout_s))
        except InferenceServerException:
            return False

    async def _index(self) -> list[dict[str, Any]]:
        try:
            index = await self.client.get_model_repository_index(
                as_json=True, client_timeout=self.timeout_s
            )
        except InferenceServerException as exc:
            raise _from_client_error(exc) from exc
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
            error = _from_client_error(exc, name)
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
            raise _from_client_error(exc, name) from exc
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
        configs = await asyncio.gather(*(self._config(name) for name in ready))
        infos = {info.name: info for info in configs if info is not None}
        for entry in entries:
            infos.setdefault(entry["name"], ModelInfo(name=entry["name"], task=None, ready=False))
        return sorted(infos.values(), key=lambda info: info.name)

    async def _config(self, name: str) -> ModelInfo | None:
        try:
            reply = await self.client.get_model_config(
                name, as_json=True, client_timeout=self.timeout_s
            )
        except InferenceServerException:
            return None  # unloaded between the index and this call
        return model_info_from_config(name, reply.get("config", {}))

    async def _stream(
        self, model: str, inputs: list[streams.Input]
    ) -> AsyncGenerator[streams.Outputs, None]:
        """One request on a kept gRPC stream: yields each response's outputs up to the final
        one. Leaving early cancels the request in Triton."""
        answered = False
        try:
            async with aclosing(self.streams.infer(streams.request(model, inputs))) as results:
                async for outputs in results:
                    answered = True
                    yield outputs
        except grpc.aio.AioRpcError as exc:
            raise self._failed(model, _from_rpc_error(exc, model)) from exc
        except streams.ModelError as exc:
            if not answered and not await self._model_ready(model):
                # Unloaded since the catalog last looked (by another replica's admin call,
                # say): Triton's in-stream error says so only in words.
                raise ModelNotFoundError(model) from None
            raise self._failed(model, _model_error(model, str(exc))) from None

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
        self, model: str, prompt: str, options: SamplingOptions, stream: bool
    ) -> AsyncGenerator[GenerationChunk, None]:
        async with aclosing(
            self._stream(model, self._chat_inputs(prompt, options, stream))
        ) as results:
            async for result in results:
                yield self._chunk(result, options.logprobs is not None)

    async def synthesize(
        self, model: str, text: str, voice: str, speed: float
    ) -> AsyncGenerator[AudioChunk, None]:
        inputs = [
            streams.text("text", text),
            streams.text("voice", voice),
            streams.array("speed", np.array([speed]), "FP32"),
        ]
        async with aclosing(self._stream(model, inputs)) as results:
            async for outputs in results:
                samples = outputs.array("audio")
                rate = outputs.first_number("sample_rate")
                if samples is not None and rate is not None and samples.size:
                    yield AudioChunk(samples.reshape(-1), int(rate))

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        inputs = [
            streams.array("audio", audio.reshape(-1), "FP32"),
            streams.array("temperature", np.array([options.temperature]), "FP32"),
            streams.flag("word_timestamps", options.word_timestamps),
        ]
        if options.language:
            inputs.append(streams.text("language", options.language))
        if options.prompt:
            inputs.append(streams.text("prompt", options.prompt))
        async with aclosing(self._stream(model, inputs)) as results:
            async for outputs in results:
                text = outputs.first_bytes("text")
                if text is None:
                    continue  # the empty final response

                def number(name: str, outputs: streams.Outputs = outputs) -> float:
                    return outputs.first_number(name) or 0.0

                words = json.loads(_string(outputs, "words") or "[]")
                yield Segment(
                    text=text.decode("utf-8"),
                    start=number("start"),
                    end=number("end"),
                    words=tuple(Word(w["word"], w["start"], w["end"]) for w in words),
                    avg_logprob=number("avg_logprob"),
                    no_speech_prob=number("no_speech_prob"),
                    language=_string(outputs, "language"),
                )

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        count = len(texts)
        encoded = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        item = triton_grpc.InferInput("text_input", [count, 1], "BYTES")
        item.set_data_from_numpy(encoded)
        inputs = [item]
        if input_type is not None:
            kinds = triton_grpc.InferInput("input_type", [count, 1], "BYTES")
            kinds.set_data_from_numpy(np.full((count, 1), input_type.encode(), dtype=np.object_))
            inputs.append(kinds)
        try:
            result = await self.client.infer(model, inputs, client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            raise self._failed(model, _from_client_error(exc, model)) from exc
        vectors = result.as_numpy("embedding")
        tokens = result.as_numpy("num_input_tokens")
        if vectors is None or tokens is None:
            raise self._failed(model, BackendError(f"Model '{model}' sent no embedding."))
        return Embeddings(
            vectors=vectors.astype(np.float32, copy=False).reshape(count, -1),
            tokens=tuple(int(t) for t in tokens.reshape(-1)),
        )

    @staticmethod
    def _chat_inputs(prompt: str, options: SamplingOptions, stream: bool) -> list[streams.Input]:
        inputs = [
            streams.text("text_input", prompt),
            _STREAM[stream],
            streams.text("sampling_parameters", options.to_json()),
            *_SWITCHES,
        ]
        if options.logprobs is not None:
            inputs.append(_LOGPROBS)
        return inputs

    @staticmethod
    def _chunk(outputs: streams.Outputs, logprobs: bool) -> GenerationChunk:
        text = outputs.first_bytes("text_output")
        reason = outputs.first_bytes("finish_reason")
        prompt_tokens = outputs.first_number("num_input_tokens")
        output_tokens = outputs.first_number("num_output_tokens")
        return GenerationChunk(
            text=text.decode("utf-8", errors="replace") if text else "",
            # vLLM sends the string "None" until the sequence finishes.
            finish_reason=reason.decode("utf-8") if reason and reason != b"None" else None,
            prompt_tokens=int(prompt_tokens) if prompt_tokens is not None else None,
            completion_tokens=int(output_tokens) if output_tokens is not None else 0,
            # Looked up only when asked for: this runs once per token.
            logprobs=_logprobs(outputs) if logprobs else (),
        )

    async def close(self) -> None:
        await self.streams.close()
        await self.client.close()
