"""Generated text from any model, read into OpenAI's terms.

Engines differ in what their responses carry: the vLLM backend sends each new piece and its
own finish reason and token counts; TensorRT-LLM keeps the stop word in the text, repeats the
prompt unless told not to, sends no finish reason, and its BLS model can send the whole text
so far in every response (``accumulate_tokens``); a hand-written model may send one response
with everything. :class:`TextReader` turns any of them into the same chunks:

- only new text, whole UTF-8 characters (a character split across responses is held back
  until it is complete, whether it arrives as raw bytes or as U+FFFD in cumulative text);
- the prompt the model echoed is dropped;
- text ends before the first stop string the gateway enforces, and :attr:`TextReader.done`
  says so (the caller then cancels the request); a tail that may still become a stop
  string is held back until it cannot; the last chunk names the stop string
  (``stop_sequence``);
- the last chunk has one of OpenAI's finish reasons (derived when the model sends none) and
  every token count the model did not report, counted by ``count`` and flagged estimated.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.backend import grpc_streams as streams
from gateway.backend.base import GenerationChunk, TokenLogprob, TopLogprob

#: OpenAI's finish reasons; an engine's others (vLLM's ``abort``, ...) read as ``stop``.
OPENAI_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter"})
_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class TextRules:
    """How one model's responses carry text (built by its profile per request)."""

    text_output: str
    cumulative: bool = False
    """Every response holds all the text so far (else: only what is new)."""
    echo: str | None = None
    """The prompt, when the model puts it before the answer."""
    stops: tuple[str, ...] = ()
    """Stop strings the gateway cuts the text at (the engine keeps them, or has none)."""
    max_tokens: int | None = None
    """What was asked for: a model that sends no finish reason stopped for ``length`` when
    it generated this many tokens."""
    finish_output: str | None = None
    prompt_tokens_output: str | None = None
    completion_tokens_output: str | None = None
    completion_tokens_cumulative: bool = False
    logprobs_output: str | None = None
    """vLLM's ``logprobs`` output (JSON), read only when log probabilities were asked for."""


@dataclass
class TextReader:
    rules: TextRules
    prompt: str
    count: Callable[[str], int]
    """Counts the tokens of a text when the model does not (the model's tokenizer, or an
    estimate)."""
    done: bool = False
    """A stop string appeared: the text is complete and the request can be cancelled."""
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _whole: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    """Decodes a cumulative model's text (:meth:`_decode_whole`)."""
    _raw: bytes = b""
    _decoded: str = ""
    _text: str = ""
    """Everything read so far (echo removed, cut at a stop string)."""
    _sent: int = 0
    _echo_left: str | None = None
    _finish: str | None = None
    _stopped: bool = False
    _stop_sequence: str | None = None
    _prompt_tokens: int | None = None
    _completion_tokens: int = 0
    _counted_tokens: bool = False

    def __post_init__(self) -> None:
        self._echo_left = self.rules.echo

    def read(self, outputs: streams.Outputs) -> GenerationChunk | None:
        """The new text of one response (None when it adds nothing to tell)."""
        rules = self.rules
        reason = outputs.first_bytes(rules.finish_output) if rules.finish_output else None
        if reason and reason != b"None":  # vLLM sends "None" until the sequence ends
            self._finish = reason.decode("utf-8", errors="replace")
        prompt_tokens = None
        if rules.prompt_tokens_output and self._prompt_tokens is None:
            reported = outputs.first_number(rules.prompt_tokens_output)
            if reported is not None:
                self._prompt_tokens = prompt_tokens = int(reported)
        completion_tokens = 0
        if rules.completion_tokens_output:
            reported = outputs.first_number(rules.completion_tokens_output)
            if reported is not None:
                self._counted_tokens = True
                total = int(reported)
                if rules.completion_tokens_cumulative:
                    completion_tokens = max(total - self._completion_tokens, 0)
                else:
                    completion_tokens = total
                self._completion_tokens += completion_tokens
        logprobs: tuple[TokenLogprob, ...] = ()
        if rules.logprobs_output:
            logprobs = vllm_logprobs(outputs.first_bytes(rules.logprobs_output))
        raw = outputs.first_bytes(rules.text_output)
        if raw and not self.done:
            self._add(raw)
        piece = self._ready(final=False)
        if not (piece or prompt_tokens or completion_tokens or logprobs):
            return None
        return GenerationChunk(
            text=piece,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            logprobs=logprobs,
        )

    def _add(self, raw: bytes) -> None:
        if self.rules.cumulative:
            # An incomplete last character (raw bytes, or U+FFFD from a model that decoded
            # it alone) waits for the next response.
            text = self._decode_whole(raw).rstrip(_REPLACEMENT)
            text = self._strip_echo_whole(text)
            if len(text) >= len(self._text):
                self._text = text
            elif self._text.startswith(text):
                # An engine that drops a stop string once it matched it whole (TensorRT-LLM's
                # LLM API) may end with a shorter text: what was not sent is taken back.
                self._text = self._text[: max(len(text), self._sent)]
        else:
            self._text += self._strip_echo(self._decoder.decode(raw, final=False))
        self._cut()

    def _decode_whole(self, raw: bytes) -> str:
        """The whole text of a cumulative response. A text that continues the last one is
        decoded from where that one ended (a long stream costs its length once, not once
        a response); any other is decoded afresh."""
        if self._raw and raw.startswith(self._raw):
            self._decoded += self._whole.decode(raw[len(self._raw) :], final=False)
        else:
            self._whole = codecs.getincrementaldecoder("utf-8")("replace")
            self._decoded = self._whole.decode(raw, final=False)
        self._raw = raw
        return self._decoded

    def _strip_echo_whole(self, text: str) -> str:
        echo = self.rules.echo
        if echo and text.startswith(echo):
            return text[len(echo) :]
        return text if not echo or not echo.startswith(text) else ""

    def _strip_echo(self, piece: str) -> str:
        """Drops the echoed prompt from the start of the delta stream."""
        if not self._echo_left:
            return piece
        common = min(len(piece), len(self._echo_left))
        if piece[:common] != self._echo_left[:common]:
            self._echo_left = None  # the model did not echo after all
            return piece
        self._echo_left = self._echo_left[common:]
        return piece[common:]

    def _cut(self) -> None:
        stops = self.rules.stops
        if not stops:
            return
        # No stop string starts before what was sent (its start would have been held back).
        found = [(i, s) for s in stops if (i := self._text.find(s, self._sent)) >= 0]
        if found:
            at, self._stop_sequence = min(found, key=lambda f: f[0])
            self._text = self._text[:at]
            self.done = self._stopped = True

    def _ready(self, final: bool) -> str:
        end = len(self._text)
        if not final and not self.done:
            # Only the unsent tail can hold back: the cost per chunk is bounded by the stop
            # strings' length, not the text's.
            end -= _stop_prefix(self._text[self._sent :], self.rules.stops)
        if end <= self._sent:
            return ""
        piece = self._text[self._sent : end]
        self._sent = end
        return piece

    def finish(self) -> GenerationChunk:
        """The last chunk: what was held back, the finish reason and the counts the model
        did not report."""
        if not self.done and not self.rules.cumulative:
            self._text += self._strip_echo(self._decoder.decode(b"", final=True))
            self._cut()
        piece = self._ready(final=True)
        estimated = False
        prompt_tokens = None
        if self._prompt_tokens is None:
            prompt_tokens = self._prompt_tokens = self.count(self.prompt)
            estimated = True
        completion_tokens = 0
        if not self._counted_tokens:
            completion_tokens = self.count(self._text)
            self._completion_tokens = completion_tokens
            estimated = True
        return GenerationChunk(
            text=piece,
            finish_reason=self._finish_reason(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            estimated=estimated,
            stop_sequence=self._stop_sequence if self._finish_reason() == "stop" else None,
        )

    def _finish_reason(self) -> str:
        if self._stopped:
            return "stop"
        if self._finish is not None:
            reason = self._finish.lower()
            return reason if reason in OPENAI_FINISH else "stop"
        limit = self.rules.max_tokens
        return "length" if limit and self._completion_tokens >= limit else "stop"


def _stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def vllm_logprobs(raw: bytes | None) -> tuple[TokenLogprob, ...]:
    """The ``logprobs`` output of Triton's vLLM backend: JSON, a list with one object per new
    token mapping token ids to ``{"logprob", "rank", "decoded_token"}``; the sampled token
    comes first (vLLM's order), the alternatives by rank."""
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
