"""The base of every reasoning parser: :class:`ReasoningParser`, and what reads a whole
reply (:func:`split`) or counts its reasoning tokens (:class:`ReasoningTokens`).

A parser is made for one generation, knowing its prompt (a template may open or close the
reasoning itself), and fed the generated text piece by piece: :meth:`ReasoningParser.feed`
returns what can be told now, reasoning and answer apart; :meth:`ReasoningParser.finish`
flushes what was held back (the start of what may be a marker). The answer is what the
tool-call parser and the JSON of ``response_format`` see; ``content_at`` says where it starts
in the text fed, so that a position in the answer is one in the whole text.
:class:`ReasoningTokens` counts the completion tokens that went to the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReasoningDelta", "ReasoningParser", "ReasoningTokens", "split"]


@dataclass
class ReasoningDelta:
    """What one step of parsing lets through: reasoning text and answer text."""

    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    """Splits one generation's text. ``prompt``: the rendered prompt it continues. The name
    a model's config gives a format is the parser's key in
    :data:`gateway.serving.reasoning_parsers.PARSERS`."""

    end = ""
    """The marker that ends the reasoning: what the answer's constraint waits for
    (:attr:`gateway.serving.generation.Generation.answer_after`)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.fed = 0
        """How many characters were fed."""
        self.content_at: int | None = None
        """Where the answer starts in the text fed (None while it has not started)."""

    @property
    def reasoning(self) -> bool:
        """The text fed so far is still reasoning."""
        raise NotImplementedError

    def feed(self, text: str) -> ReasoningDelta:
        self.fed += len(text)
        return self._step(text)

    def _step(self, text: str) -> ReasoningDelta:
        """What ``text``, just fed (``fed`` counts it already), lets through."""
        raise NotImplementedError

    def finish(self) -> ReasoningDelta:
        return ReasoningDelta()


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """A whole reply read by ``parser``: its reasoning and its answer (each None when empty)."""
    delta = parser.feed(text)
    rest = parser.finish()
    reasoning, content = delta.reasoning + rest.reasoning, delta.content + rest.content
    return reasoning or None, content or None


class ReasoningTokens:
    """Counts the completion tokens of one choice that went to its reasoning: every token of
    a piece fed while the reasoning went on. A piece that holds the end of the reasoning
    and some of the answer (a reply not streamed token by token) is split by its characters
    on each side of where the answer starts."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, parser: ReasoningParser, text: str, tokens: int) -> ReasoningDelta:
        """Feeds ``text`` to ``parser`` and counts its ``tokens``."""
        before = parser.content_at is None and parser.reasoning
        fed = parser.fed
        delta = parser.feed(text)
        if before and tokens:
            if parser.content_at is None or not text:
                self.count += tokens
            else:
                # The part of this piece up to where the answer starts is reasoning.
                share = (parser.content_at - fed) / len(text)
                self.count += round(tokens * min(max(share, 0.0), 1.0))
        return delta
