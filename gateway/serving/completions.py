"""Legacy completions (``/v1/completions``): a raw prompt, no chat template.

Eval harnesses and routers still use it. Chat models serve it: the prompt goes to the model
as it is. Several prompts and ``n`` choices are one backend request each, run concurrently;
choice ``i * n + j`` is choice ``j`` of prompt ``i``. ``echo`` puts the prompt before the
text; ``logprobs`` gives the legacy shape (parallel lists of tokens, log probabilities,
alternatives and text offsets). ``suffix``, ``best_of`` other than ``n`` and token-array
prompts are refused with a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace

from gateway.backend import Backend, SamplingOptions, TokenLogprob
from gateway.errors import InvalidRequestError
from gateway.serving import generation
from gateway.serving.catalog import ModelCatalog
from gateway.serving.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from gateway.serving.sampling import (
    check_fan_out,
    check_max_tokens,
    check_prompt,
    fit_to_model,
    logprob_options,
)
from gateway.serving.sse import ChunkWriter, with_done
from gateway.serving.structured import DEFAULT_MAX_SCHEMA_KB, response_constraint
from gateway.state.limits import Meter


@dataclass(frozen=True)
class PreparedCompletion:
    id: str
    created: int
    model: str
    runs_on: str
    """The Triton model that generates (the base of a LoRA adapter's id, else ``model``)."""
    prompts: list[str]
    options: SamplingOptions
    n: int
    echo: bool
    logprobs: int | None
    include_usage: bool


class _Offsets:
    """Builds the legacy logprobs of one choice, token by token (offsets run on)."""

    def __init__(self, start: int, top: int) -> None:
        self.offset = start
        self.top = top

    def add(self, tokens: list[TokenLogprob]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token in tokens:
            out.tokens.append(token.token)
            out.token_logprobs.append(token.logprob)
            out.top_logprobs.append({a.token: a.logprob for a in token.top[: self.top]})
            out.text_offset.append(self.offset)
            self.offset += len(token.token)
        return out


class CompletionService:
    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        max_prompts: int = 128,
        max_choices: int = 128,
        in_flight: int = 16,
        max_schema_kb: int = DEFAULT_MAX_SCHEMA_KB,
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.max_prompts = max_prompts
        self.max_choices = max_choices
        self.in_flight = in_flight
        self.max_schema_kb = max_schema_kb

    async def prepare(self, request: CompletionRequest) -> PreparedCompletion:
        problem = request.unsupported()
        if problem is not None:
            param, message = problem
            raise InvalidRequestError(message, param=param, code="unsupported_parameter")
        prompts = request.prompts()
        check_fan_out(len(prompts), self.max_prompts, request.n, self.max_choices)
        model = await self.catalog.get(request.model, "chat")
        check_max_tokens(model, request.max_tokens, "max_tokens")
        top = logprob_options(
            model, request.logprobs is not None, request.logprobs, "logprobs", "logprobs"
        )
        # OpenAI's default of 16 tokens is the API's, not the client's: a model that takes
        # no max_tokens serves a request that did not set it.
        max_tokens = request.max_tokens
        if "max_tokens" not in request.model_fields_set and "max_tokens" not in model.takes:
            max_tokens = None
        options = replace(
            fit_to_model(model, request.to_sampling_options(max_tokens)),
            logprobs=top,
            constraint=response_constraint(request.response_format, model, self.max_schema_kb),
            constraint_key=model.structured_outputs_key,
            lora_name=model.lora_adapter,
        )
        for prompt in prompts:
            if not prompt:
                raise InvalidRequestError("A prompt must not be empty.", param="prompt")
            check_prompt(model, prompt, request.max_tokens, "prompt")
        return PreparedCompletion(
            id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=request.model,
            runs_on=model.runs_on,
            prompts=prompts,
            options=options,
            n=request.n,
            echo=request.echo,
            logprobs=top,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
        )

    async def reserve_run(
        self, job: PreparedCompletion, meter: Meter | None
    ) -> generation.GenerationRun:
        """The request's generations (one backend request per prompt and choice), their
        tokens reserved under the key's limits; its ``collect`` or ``stream`` runs them."""
        return await generation.reserve_run(
            self.backend,
            job.runs_on,
            meter or Meter(),
            job.prompts,
            job.options,
            job.n,
            in_flight=self.in_flight,
        )

    async def complete(self, job: PreparedCompletion, meter: Meter | None = None) -> Completion:
        run = await self.reserve_run(job, meter)
        results = await run.collect()
        choices = []
        for index, (g, result) in enumerate(zip(run.generations, results, strict=True)):
            echoed = g.prompt if job.echo else ""
            logprobs = None
            if job.logprobs is not None:
                logprobs = _Offsets(len(echoed), job.logprobs).add(result.logprobs)
            choices.append(
                CompletionChoice(
                    index=index,
                    text=echoed + result.text,
                    finish_reason=result.finish_reason,
                    logprobs=logprobs,
                )
            )
        return Completion(
            id=job.id,
            created=job.created,
            model=job.model,
            choices=choices,
            usage=run.usage(),
        )

    async def stream(
        self, job: PreparedCompletion, meter: Meter | None = None
    ) -> AsyncIterator[str]:
        """Starts generating and returns the SSE body (see the chat service for the
        contract)."""
        run = await self.reserve_run(job, meter)
        pieces = await run.stream()
        return with_done(self._events(job, run.generations, pieces, run), "completions")

    async def _events(
        self,
        job: PreparedCompletion,
        generations: list[generation.Generation],
        pieces: AsyncGenerator[generation.ChoiceChunk, None],
        run: generation.GenerationRun,
    ) -> AsyncGenerator[str, None]:
        writer = ChunkWriter.completion(job.id, job.created, job.model, job.include_usage)
        offsets = [
            _Offsets(len(g.prompt) if job.echo else 0, job.logprobs or 0) for g in generations
        ]
        finishes: list[str | None] = [None] * len(generations)
        async with aclosing(pieces):
            if job.echo:
                for index, g in enumerate(generations):
                    yield writer.text(index, g.prompt)
            async for index, piece in pieces:
                if piece is None:
                    yield writer.text(index, "", finishes[index] or "stop")
                    continue
                run.add(index, piece)
                finishes[index] = piece.finish_reason or finishes[index]
                if piece.text or piece.logprobs:
                    logprobs = "null"
                    if job.logprobs is not None:
                        added = offsets[index].add(list(piece.logprobs))
                        logprobs = json.dumps(added.model_dump())
                    yield writer.text(index, piece.text, None, logprobs)
        if job.include_usage:
            yield writer.usage(run.usage())
