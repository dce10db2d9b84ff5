"""Text generation for chat and legacy completions: one backend request per choice.

``n`` choices (and, for completions, several prompts) are independent Triton requests run
concurrently, so each gets the model's full sampling and a batching engine serves them
together. :meth:`GenerationRun.collect` runs them to the end; :meth:`GenerationRun.stream`
merges their chunks as they come, each tagged with its choice index. Tokens go to the
request's meter as they arrive (``collect`` adds them itself; a consumer of ``stream`` calls
:meth:`GenerationRun.add` for each chunk before it sends the text on), so what was generated
counts even when the client leaves early.

Every caller goes the same way: :func:`reserve_run` reserves the generations' tokens under
the key's ``tpm`` and returns the request's :class:`GenerationRun`; its ``collect`` or
``stream`` runs them, at most ``in_flight`` at a time (``GATEWAY_MAX_INFLIGHT_PER_REQUEST``),
so one request with many choices cannot flood Triton.

A reasoning model's constrained answer is one choice generated in two backend requests
(:attr:`Generation.answer_after`): its chunks come as one generation's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.backend import Backend, ChatImage, GenerationChunk, SamplingOptions, TokenLogprob
from gateway.backend.tokenizer import estimate_tokens
from gateway.serving.protocol import CompletionTokensDetails, Usage
from gateway.serving.reasoning_parsers import ReasoningParser, ReasoningTokens
from gateway.serving.sse import first_or_close
from gateway.state.budgets import prompt_bound
from gateway.state.limits import Meter


@dataclass(frozen=True)
class Generation:
    """One choice to generate, one backend request: a rendered prompt and its options
    (and the images the prompt's placeholders stand for)."""

    prompt: str
    options: SamplingOptions
    answer_after: str | None = None
    """A reasoning model's constrained answer: the marker that ends its reasoning. The
    reasoning is generated first, without the constraint, up to the marker (``stop``), then
    the answer under the constraint (and the request's own ``stop``), continuing the prompt,
    the reasoning and the marker with the tokens left: an engine behind Triton would
    constrain the reasoning too. The marker is sent between the two as a chunk of its own."""
    images: tuple[ChatImage, ...] = ()


def generations_for(
    prompts: list[str],
    options: SamplingOptions,
    n: int,
    answer_after: str | None = None,
    images: tuple[ChatImage, ...] = (),
) -> list[Generation]:
    """``n`` generations per prompt, in choice order. With a seed, choice ``i`` of a prompt
    samples with ``seed + i``: the choices differ, and the same request gives the same choices."""
    generations = []
    for prompt in prompts:
        for i in range(n):
            seeded = options
            if i and options.seed is not None:
                seeded = replace(options, seed=options.seed + i)
            generations.append(Generation(prompt, seeded, answer_after, images))
    return generations


@dataclass
class Generated:
    """One choice, generated to the end."""

    text: str = ""
    finish_reason: str = "stop"
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    pieces: list[tuple[str, int]] = field(default_factory=list)
    """The text as the model sent it, piece by piece, with each piece's tokens."""
    stop_sequence: str | None = None
    """The stop string the text ended at, when the gateway cut it there."""


#: What :meth:`GenerationRun.stream` yields: a choice index and its next chunk, or None when
#: it ended.
ChoiceChunk = tuple[int, GenerationChunk | None]


#: A stream whose first chunk is not awaited before the response starts.
_LATER: Any = object()


class GenerationRun:
    """The run of one request's generations on ``model``: :meth:`collect` or :meth:`stream`
    runs them, at most ``in_flight`` at a time, and the tokens they generate are counted
    into the request's meter as they arrive: the prompt once per distinct prompt, every
    choice's completion tokens. Made by :func:`reserve_run`."""

    def __init__(
        self,
        backend: Backend,
        model: str,
        meter: Meter,
        generations: list[Generation],
        in_flight: int = 16,
    ) -> None:
        self.backend = backend
        self.model = model
        self.meter = meter
        self.generations = generations
        self.in_flight = in_flight
        """How many of the generations may run at once."""
        self.gate = asyncio.Semaphore(in_flight)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reasons: dict[int, str] = {}
        """Each choice's finish reason, once it has one."""
        self.estimated = False
        """A count came from the gateway, not the model (see ``GenerationChunk``)."""
        self.reasoning_tokens: int | None = None
        """Of the completion tokens, a reasoning model's reasoning (set by the caller,
        which reads the text apart)."""
        self._prompts_seen: set[str] = set()

    def add(self, index: int, chunk: GenerationChunk) -> None:
        prompt = self.generations[index].prompt
        if chunk.prompt_tokens and prompt not in self._prompts_seen:
            self._prompts_seen.add(prompt)
            self.prompt_tokens += chunk.prompt_tokens
            self.meter.add_tokens(chunk.prompt_tokens, 0)
        if chunk.completion_tokens:
            self.completion_tokens += chunk.completion_tokens
            self.meter.add_tokens(0, chunk.completion_tokens)
        if chunk.finish_reason:
            self.finish_reasons[index] = chunk.finish_reason
        self.estimated = self.estimated or chunk.estimated

    def include(self, other: GenerationRun) -> None:
        """Counts ``other``'s tokens in this run's usage: a generation made again for one of
        this run's choices (both runs count into the same meter already)."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.estimated = self.estimated or other.estimated

    def usage(self) -> Usage:
        details = None
        if self.reasoning_tokens is not None:
            details = CompletionTokensDetails(reasoning_tokens=self.reasoning_tokens)
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            completion_tokens_details=details,
            estimated=self.estimated or None,
        )

    async def collect(self, pieces: bool = False) -> list[Generated]:
        """Runs every generation to the end, concurrently (``in_flight`` at a time); the
        first failure cancels the others. ``pieces``: the model is asked to stream (when it
        can), so that each choice's ``pieces`` are its steps (a reasoning model's reasoning
        tokens told apart from its answer's)."""
        generations = self.generations
        if len(generations) == 1:
            return [await self._generated(generations[0], 0, pieces)]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._one(g, i, pieces)) for i, g in enumerate(generations)]
        return [task.result() for task in tasks]

    async def _one(self, generation: Generation, index: int, pieces: bool) -> Generated:
        async with self.gate:
            return await self._generated(generation, index, pieces)

    async def _generated(self, generation: Generation, index: int, pieces: bool) -> Generated:
        result = Generated()
        finish = None
        chunks = self._chunks(generation, stream=pieces)
        async with aclosing(chunks):
            async for chunk in chunks:
                self.add(index, chunk)
                result.pieces.append((chunk.text, chunk.completion_tokens))
                result.logprobs.extend(chunk.logprobs)
                finish = chunk.finish_reason or finish
                result.stop_sequence = chunk.stop_sequence or result.stop_sequence
                result.completion_tokens += chunk.completion_tokens
        result.text = "".join(text for text, _ in result.pieces)
        result.finish_reason = finish or "stop"
        return result

    def _chunks(self, one: Generation, stream: bool) -> AsyncGenerator[GenerationChunk, None]:
        if one.answer_after is None:
            return self.backend.generate(self.model, one.prompt, one.options, stream, one.images)
        return _reason_then_answer(self.backend, self.model, one, stream)

    async def stream(self) -> AsyncGenerator[ChoiceChunk, None]:
        """Starts the generations and awaits each one's first chunk (so a request that fails
        up front raises before the HTTP response starts), then yields the chunks of all of
        them as they come. Generations beyond ``in_flight`` start as earlier ones end (their
        failures come in the stream). Closing the generator cancels every generation still
        running."""
        streams = [self._chunks(g, stream=True) for g in self.generations]
        if len(streams) > self.in_flight:
            streams = [_gated(self.gate, s) for s in streams]
        started = streams[: self.in_flight]
        try:
            firsts = await asyncio.gather(*(first_or_close(s) for s in started))
        except BaseException:
            await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
            raise
        if len(streams) == 1:
            return Started(_single(streams[0], firsts[0]), streams)
        merged = _merged(streams, firsts + [_LATER] * (len(streams) - len(started)))
        return Started(merged, streams)


async def reserve_run(
    backend: Backend,
    model: str,
    meter: Meter,
    prompts: list[str],
    options: SamplingOptions,
    n: int = 1,
    flexible: bool = False,
    in_flight: int = 16,
    answer_after: str | None = None,
    images: tuple[ChatImage, ...] = (),
) -> GenerationRun:
    """The run of ``n`` generations of each prompt on ``model``
    (:func:`generations_for`), their tokens reserved under the key's ``tpm`` (429 when
    they do not fit, see :meth:`Meter.reserve`): the distinct prompts, estimated, and every
    generation's ``max_tokens``. ``flexible`` (the client set no ``max_tokens``): the
    generations may be given fewer tokens, as many as the key has left. A model that takes
    no ``max_tokens`` is reserved one token per generation and counted in full when it
    ends. ``answer_after``: see :attr:`Generation.answer_after`. ``images`` go with every
    prompt (chat has one)."""
    generations = generations_for(prompts, options, n, answer_after, images)
    per = options.max_tokens
    prompt = sum(estimate_tokens(p) for p in set(prompts))
    bound = sum(prompt_bound(p) for p in set(prompts))  # for budgets: the most it can be
    granted = await meter.reserve(
        prompt, per or 1, len(generations), flexible and per is not None, bound
    )
    if per is not None and granted < per:
        generations = [
            replace(g, options=replace(g.options, max_tokens=granted)) for g in generations
        ]
    return GenerationRun(backend, model, meter, generations, in_flight)


async def _reason_then_answer(
    backend: Backend, model: str, generation: Generation, stream: bool
) -> AsyncGenerator[GenerationChunk, None]:
    """One choice of a reasoning model's constrained answer (see
    :attr:`Generation.answer_after`): the reasoning's chunks, the marker, the answer's. The
    reasoning ends at the marker whether the engine stops there or not (one that keeps
    generating is stopped: the rest is dropped); ``min_tokens`` applies to the whole choice
    (an engine that honours it ignores stop strings until then, so the reasoning step has
    none, and the answer what is left of it)."""
    marker = generation.answer_after
    assert marker is not None
    options = generation.options
    thinking = replace(options, constraint=None, stop=[marker], min_tokens=None)
    texts: list[str] = []
    used, finish, said, ended = 0, None, "", False
    chunks = backend.generate(model, generation.prompt, thinking, stream, generation.images)
    async with aclosing(chunks):
        async for chunk in chunks:
            used += chunk.completion_tokens
            finish = chunk.finish_reason or finish
            window = said + chunk.text  # a marker may be split over chunks
            at = window.find(marker)
            if at >= 0:
                chunk = replace(chunk, text=chunk.text[: at + len(marker) - len(said)])
                ended = True
            texts.append(chunk.text)
            said = window[-(len(marker) - 1) :]
            yield replace(chunk, finish_reason=None) if chunk.finish_reason else chunk
            if ended:
                break  # leaving closes the request
    budget = options.max_tokens
    if (not ended and finish == "length") or (budget is not None and used >= budget):
        yield GenerationChunk("", finish_reason="length")  # no token left for the answer
        return
    reasoning = "".join(texts)
    if not ended:  # engines leave out the stop string they met
        reasoning += marker
        yield GenerationChunk(marker)
    left = budget - used if budget is not None else None
    least = max((options.min_tokens or 0) - used, 0)
    if left is not None:
        least = min(least, left)
    answer = replace(options, max_tokens=left, min_tokens=least or None)
    prompt = generation.prompt + reasoning
    chunks = backend.generate(model, prompt, answer, stream, generation.images)
    async with aclosing(chunks):
        async for chunk in chunks:
            # The prompt was counted with the reasoning; this one only continues it.
            yield replace(chunk, prompt_tokens=None)


async def _gated(
    gate: asyncio.Semaphore, chunks: AsyncGenerator[GenerationChunk, None]
) -> AsyncGenerator[GenerationChunk, None]:
    """``chunks`` once one of the request's ``in_flight`` places is free, held to its end."""
    async with gate, aclosing(chunks):
        async for chunk in chunks:
            yield chunk


async def texts(
    pieces: AsyncGenerator[ChoiceChunk, None],
    run: GenerationRun,
    reasoner: ReasoningParser | None = None,
) -> AsyncGenerator[str, None]:
    """The text of a one-choice stream, its tokens counted into ``run`` (which also keeps
    its finish reason). With a reasoning model's ``reasoner``: the answer's text only (what
    is spoken), its reasoning tokens counted into ``run``."""
    tokens = ReasoningTokens()
    async with aclosing(pieces):
        async for _, chunk in pieces:
            if chunk is None:
                continue
            run.add(0, chunk)
            text = chunk.text
            if reasoner is not None:
                text = tokens.add(reasoner, text, chunk.completion_tokens).content
                run.reasoning_tokens = tokens.count
            if text:
                yield text
    if reasoner is not None and (rest := reasoner.finish().content):
        yield rest


class Started(AsyncGenerator[ChoiceChunk, None]):
    """The chunks of generations that already run (their first chunk was awaited):
    closing them stops every generation, even before the first chunk is read. An async
    generator closed before it started runs none of its cleanup, so one returned unstarted
    would leave the running streams to the garbage collector: a background response
    stopped while its first events were logged went on generating."""

    def __init__(
        self, chunks: AsyncGenerator[ChoiceChunk, None], streams: list[AsyncGenerator[Any, None]]
    ) -> None:
        self._chunks = chunks
        self._streams = streams

    async def asend(self, value: None) -> ChoiceChunk:
        return await self._chunks.asend(value)

    async def athrow(self, *args: Any) -> ChoiceChunk:
        return await self._chunks.athrow(*args)

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await asyncio.gather(*(s.aclose() for s in self._streams), return_exceptions=True)


async def _single(
    chunks: AsyncGenerator[GenerationChunk, None], first: GenerationChunk | None
) -> AsyncGenerator[ChoiceChunk, None]:
    """One choice: no task or queue on the hot path."""
    async with aclosing(chunks):
        chunk = first
        while chunk is not None:
            yield 0, chunk
            chunk = await anext(chunks, None)
    yield 0, None


async def _merged(
    streams: list[AsyncGenerator[GenerationChunk, None]], firsts: list[GenerationChunk | None]
) -> AsyncGenerator[ChoiceChunk, None]:
    queue: asyncio.Queue[ChoiceChunk | BaseException] = asyncio.Queue()

    async def pump(index: int) -> None:
        chunks = streams[index]
        try:
            async with aclosing(chunks):
                chunk = firsts[index]
                if chunk is _LATER:
                    chunk = await anext(chunks, None)
                while chunk is not None:
                    await queue.put((index, chunk))
                    chunk = await anext(chunks, None)
            await queue.put((index, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item[1] is None:
                running -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
