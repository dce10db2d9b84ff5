"""An in-memory :class:`gateway.backend.Backend` for fast unit tests.

It echoes the last line of the prompt's user message as words, honours ``max_tokens`` and
``stop``, records every call, and can be told to fail before or during a stream, or to be
unreachable. It never replaces the real Triton in an end-to-end test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.backend import scheduling
from gateway.backend.base import (
    AudioChunk,
    ChatImage,
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
from gateway.config import CHATML_TEMPLATE
from gateway.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    ModelNotFoundError,
)

#: ChatML that also shows the tools and the calls, for tests that read the prompt.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: A reasoning model's template (Qwen3's convention): ``enable_thinking`` false closes an
#: empty reasoning in the prompt, so the model answers at once.
THINKING_TEMPLATE = TOOLS_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}",
)

#: The length of the fake embedding models' vectors.
EMBED_DIMENSIONS = 8


@dataclass
class GenerateCall:
    model: str
    prompt: str
    options: SamplingOptions
    stream: bool
    cancelled: bool = False
    tokens_sent: int = 0
    images: tuple[ChatImage, ...] = ()
    priority: int = 0
    """The request's scheduling priority (gateway.backend.scheduling) when it was made."""


@dataclass
class FakeBackend:
    """A backend whose answers are the words of :attr:`reply`."""

    reply: str = "Hello from the fake backend."
    replies: list[str] = field(default_factory=list)
    """Answers of the next generations, in order (taken one each), before :attr:`reply`."""
    model_list: list[ModelInfo] = field(
        default_factory=lambda: [
            ModelInfo(
                "fake-chat",
                "chat",
                True,
                TOOLS_TEMPLATE,
                2048,
                tool_call_parser="hermes",
                structured_outputs=("json", "json_object"),
                logprobs=True,
                max_logprobs=5,
            ),
            ModelInfo("fake-plain", "chat", True, CHATML_TEMPLATE, 2048),
            ModelInfo(
                "fake-reasoner",
                "chat",
                True,
                THINKING_TEMPLATE,
                2048,
                tool_call_parser="hermes",
                structured_outputs=("json", "json_object"),
                reasoning_parser="qwen3",
            ),
            # Like piper_tts: one style of speaking, so instructions are accepted unheeded.
            ModelInfo(
                "fake-tts",
                "speech",
                True,
                voices=("joe", "amy"),
                ignores=frozenset({"instructions"}),
            ),
            ModelInfo("fake-stt", "transcription", True, languages=("en",)),
            ModelInfo(
                "fake-embed",
                "embeddings",
                True,
                dimensions=EMBED_DIMENSIONS,
                max_input_tokens=32,
                matryoshka=True,
                input_types=("query", "passage"),
                max_batch_size=4,
            ),
            ModelInfo("fake-embed-fixed", "embeddings", True, dimensions=EMBED_DIMENSIONS),
            ModelInfo("fake-unloaded", None, False),
        ]
    )
    up: bool = True
    fail_after_tokens: int | None = None
    """Raise a model error after this many tokens (0: before the first one)."""
    token_delay_s: float = 0.0
    whole_delay_s: float = 0.0
    """How long a non-streamed answer takes (a batch's lines are)."""
    calls: list[GenerateCall] = field(default_factory=list)
    speech_calls: list[tuple[str, str, str, float]] = field(default_factory=list)
    speech_instructions: list[str | None] = field(default_factory=list)
    """The ``instructions`` of each speech call (None: none reached the model)."""
    transcribe_calls: list[tuple[str, Any, TranscriptionOptions]] = field(default_factory=list)
    embed_calls: list[tuple[str, list[str], str | None]] = field(default_factory=list)

    async def live(self) -> bool:
        return self.up

    async def models(self) -> list[ModelInfo]:
        self._check_up()
        return list(self.model_list)

    async def repository(self) -> list[RepositoryModel]:
        self._check_up()
        return [
            RepositoryModel(m.name, "READY" if m.ready else m.state, reason=m.reason)
            for m in self.model_list
        ]

    def fail(self, name: str, reason: str = "initialize() raised") -> None:
        """Makes ``name`` a model whose load failed, as Triton shows one (``UNAVAILABLE``
        with the error as its reason); a new name is added to the repository."""
        failed = ModelInfo(name, None, False, state="UNAVAILABLE", reason=reason)
        self.model_list = [m for m in self.model_list if m.name != name] + [failed]

    def _index(self, name: str) -> int:
        for index, model in enumerate(self.model_list):
            if model.name == name:
                return index
        raise ModelNotFoundError(name)

    async def load_model(self, name: str) -> None:
        self._check_up()
        index = self._index(name)
        model = self.model_list[index]
        # A model the fake "loads" serves chat unless it already had a task.
        self.model_list[index] = replace(model, ready=True, task=model.task or "chat", reason="")

    async def unload_model(self, name: str) -> None:
        self._check_up()
        index = self._index(name)
        self.model_list[index] = replace(self.model_list[index], ready=False, state="", reason="")

    async def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        self._check_up()
        call = GenerateCall(
            model, prompt, options, stream, images=images, priority=scheduling.current().priority
        )
        self.calls.append(call)
        words = (self.replies.pop(0) if self.replies else self.reply).split(" ")
        limit = options.max_tokens if options.max_tokens is not None else len(words)
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words[:limit])]
        logprobs = [_logprobs(p, i, options.logprobs) for i, p in enumerate(pieces)]
        finish = "length" if limit < len(words) else "stop"
        text = "".join(pieces)
        matched = None  # the stop string cut at, as the gateway's TextReader tells it
        for stop in options.stop:
            if stop in text:
                cut = text.index(stop)
                pieces, finish = [text[:cut]], "stop"
                text, matched = text[:cut], stop
        prompt_tokens = len(prompt.split())
        try:
            if not stream:
                self._maybe_fail(0)
                if self.whole_delay_s:
                    await asyncio.sleep(self.whole_delay_s)
                call.tokens_sent = len(pieces)
                yield GenerationChunk(
                    text,
                    finish,
                    prompt_tokens,
                    len(pieces),
                    tuple(filter(None, logprobs)),
                    stop_sequence=matched,
                )
                return
            for i, piece in enumerate(pieces):
                self._maybe_fail(i)
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                call.tokens_sent += 1
                last = i == len(pieces) - 1
                lp = logprobs[i]
                yield GenerationChunk(
                    piece,
                    finish if last else None,
                    prompt_tokens,
                    1,
                    (lp,) if lp else (),
                    stop_sequence=matched if last else None,
                )
            if not pieces:
                yield GenerationChunk("", finish, prompt_tokens, 0, stop_sequence=matched)
        except (GeneratorExit, asyncio.CancelledError):
            call.cancelled = True
            raise

    async def synthesize(
        self, model: str, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> AsyncGenerator[AudioChunk, None]:
        """A 440 Hz tone of ``0.5 / speed`` seconds per sentence, at 22,050 Hz. The
        ``instructions`` that reached it are kept in :attr:`speech_instructions`."""
        self._check_up()
        sentences = [s for s in text.split(".") if s.strip()]
        self.speech_calls.append((model, text, voice, speed))
        self.speech_instructions.append(instructions)
        rate = 22_050
        length = int(rate * 0.5 / speed)
        tone = (np.sin(2 * np.pi * 440 * np.arange(length) / rate) * 8000).astype(np.int16)
        for index, _ in enumerate(sentences):
            self._maybe_fail(index)
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            yield AudioChunk(tone, rate)

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        """One segment per started second of audio: "Segment N says hello." with words."""
        self._check_up()
        self.transcribe_calls.append((model, audio, options))
        seconds = max(1, int(np.ceil(audio.size / 16_000)))
        for index in range(seconds):
            self._maybe_fail(index)
            start, end = float(index), float(min(index + 1, audio.size / 16_000))
            text = f" Segment {index + 1} says hello."
            step = (end - start) / 4
            words = tuple(
                Word(w, round(start + i * step, 3), round(start + (i + 1) * step, 3))
                for i, w in enumerate(text.split())
            )
            language = options.language or "en"  # the language given, else "detected"
            yield Segment(
                text,
                start,
                end,
                words if options.word_timestamps else (),
                -0.2,
                0.01,
                language,
                # Whisper's window of 30 s (3,000 frames) the segment falls in; its text's
                # bytes as token ids; no compression ratio (the gateway computes it).
                seek=int(start // 30) * 3000,
                tokens=tuple(text.encode()),
                temperature=options.temperature,
            )

    async def count_tokens(self, model: str, text: str) -> tuple[int, bool]:
        """A word is a token, as the fake counts a prompt."""
        self._check_up()
        if not any(m.name == model for m in self.model_list):
            raise ModelNotFoundError(model)
        return len(text.split()), False

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        """A bag of words hashed into :data:`EMBED_DIMENSIONS` values, normalized: texts that
        share words point the same way. A word is a token, plus two for the ends."""
        self._check_up()
        self.embed_calls.append((model, texts, input_type))
        self._maybe_fail(0)
        info = next(m for m in self.model_list if m.name == model)
        vectors = np.zeros((len(texts), EMBED_DIMENSIONS), dtype=np.float32)
        tokens = []
        for row, text in enumerate(texts):
            words = text.lower().split()
            tokens.append(len(words) + 2)
            if info.max_input_tokens and tokens[-1] > info.max_input_tokens:
                raise InvalidRequestError(
                    f"input {row} has {tokens[-1]} tokens; the model takes at most "
                    f"{info.max_input_tokens}"
                )
            for word in words:
                vectors[row, sum(word.encode()) % EMBED_DIMENSIONS] += 1.0
            vectors[row] += 0.01  # never all zeros
            vectors[row] /= np.linalg.norm(vectors[row])
        return Embeddings(vectors, tuple(tokens))

    def _maybe_fail(self, index: int) -> None:
        if self.fail_after_tokens is not None and index >= self.fail_after_tokens:
            raise BackendError("Model 'fake-chat' failed: injected failure")

    def _check_up(self) -> None:
        if not self.up:
            raise BackendUnavailableError("Triton is unavailable: connection refused")

    async def close(self) -> None:
        return None


def _logprobs(piece: str, index: int, top: int | None) -> TokenLogprob | None:
    """Made-up but consistent log probabilities: word ``i`` has ``-0.1 * (i + 1)``, its
    alternatives are lower."""
    if top is None:
        return None
    logprob = -0.1 * (index + 1)
    others = [TopLogprob(f"alt{k}", logprob - k) for k in range(1, top)]
    return TokenLogprob(piece, logprob, (TopLogprob(piece, logprob), *others))
