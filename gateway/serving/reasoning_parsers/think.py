"""Reasoning between ``<think>`` and ``</think>``: DeepSeek-R1 (``deepseek_r1``) and Qwen3
(``qwen3``), as vLLM's parsers of those names read them.

The reasoning is everything up to ``</think>``; the answer is what follows. The opening
``<think>`` is optional: DeepSeek-R1's template writes it into the prompt, so the model
never does, and a Qwen3 model writes it itself. A text with no ``</think>`` is all
reasoning (a reply cut by ``max_tokens`` in the middle of its thoughts). A prompt that
already ends with ``</think>`` (Qwen3's template with ``enable_thinking`` false closes an
empty reasoning itself) starts in the answer, so thinking that was switched off leaves the
whole text as the answer, as vLLM's ``qwen3`` parser does given ``enable_thinking: false``.
Whitespace around the reasoning and at the start of the answer is left out (the newlines
models write around the markers); anything else is told as written.

Each piece costs time in its own length (plus the markers'), never in the text so far: a
model stuck writing blank lines holds back a run of whitespace, kept as a list of pieces.
"""

from __future__ import annotations

from gateway.serving.reasoning_parsers.base import ReasoningDelta, ReasoningParser


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is the start of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ThinkTags(ReasoningParser):
    start = "<think>"
    end = "</think>"

    def __init__(self, prompt: str) -> None:
        super().__init__(prompt)
        self._reasoning = not prompt.rstrip().endswith(self.end)
        self._opening = self._reasoning
        """A leading ``<think>`` may still come (it is not reasoning)."""
        self._held = ""
        """What may be the start of a marker (shorter than the marker)."""
        self._space: list[str] = []
        """Whitespace held back in the reasoning: told if more reasoning follows it."""
        self._started = False
        """The current part (reasoning or answer) has told text."""
        if not self._reasoning:
            self.content_at = 0

    @property
    def reasoning(self) -> bool:
        return self._reasoning

    def _step(self, text: str) -> ReasoningDelta:
        held = self._held + text
        self._held = ""
        out = ReasoningDelta()
        if self._opening:
            held = held.lstrip()  # whitespace before the reasoning is left out anyway
            if held.startswith(self.start):
                held = held[len(self.start) :]
                self._opening = False
            elif not held or self.start.startswith(held):
                self._held = held  # may still be the opening marker
                return out
            else:
                self._opening = False
        if self._reasoning:
            at = held.find(self.end)
            if at < 0:
                keep = _partial(held, self.end)
                body = held[: len(held) - keep]
                self._held = held[len(held) - keep :]
                said = body.rstrip()
                if said:
                    out.reasoning = self._told("".join(self._space) + said)
                    self._space = []
                if len(said) < len(body):
                    self._space.append(body[len(said) :])
                return out
            said = held[:at].rstrip()
            if said:
                out.reasoning = self._told("".join(self._space) + said)
            self._space = []
            rest = held[at + len(self.end) :]
            self._reasoning, self._started = False, False
            self.content_at = self.fed - len(rest)
            held = rest
        out.content = self._told(held)
        return out

    def _told(self, text: str) -> str:
        """``text`` of the current part, less the whitespace it starts with."""
        if self._started:
            return text
        stripped = text.lstrip()
        if not self._reasoning and self.content_at is not None:
            self.content_at += len(text) - len(stripped)
        self._started = bool(stripped)
        return stripped

    def finish(self) -> ReasoningDelta:
        held, self._held, self._space = self._held, "", []
        if self._reasoning:
            return ReasoningDelta(reasoning=self._told(held.rstrip()))
        return ReasoningDelta(content=self._told(held))


class DeepSeekR1(ThinkTags):
    """vLLM's ``deepseek_r1``: the template opens the reasoning, the model closes it."""


class Qwen3(ThinkTags):
    """vLLM's ``qwen3``: the model opens and closes its reasoning, unless the template closed
    it (thinking switched off)."""
