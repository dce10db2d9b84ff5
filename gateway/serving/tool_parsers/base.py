"""The base of every tool-call parser: :class:`ToolParser` and the deltas it returns.

Every parser works incrementally: :meth:`ToolParser.feed` takes each new piece of text and
returns what can be told to the client now (content, and calls as OpenAI's stream deltas:
first the call's ``id`` and ``function.name``, then ``function.arguments`` in pieces);
:meth:`ToolParser.finish` flushes what was held back. A non-streamed reply is the same deltas
assembled (:func:`assemble`), so both give the same answer for the same text.

A parser only announces a call once it has read the call's name and the name is one of the
request's tools. Text that does not turn into a well-formed call stays content: a model that
half-writes a call never causes a server error.

A parser given ``max_calls`` (``parallel_tool_calls: false``) calls
:meth:`ToolParser._completed` whenever it has read a call whole, and once that many were
read it is :attr:`~ToolParser.closed`: the rest of the text is dropped, so the caller can
stop generating. Where a call's arguments start in the text is told with its announcement
(``ToolCallDelta.at``), so the arguments can be generated again from there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "ParsedCall",
    "ParserDelta",
    "ToolCallDelta",
    "ToolParser",
    "assemble",
    "new_call_id",
]


def new_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 random hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallDelta:
    """A piece of one call: the first piece of a call has its ``id`` and ``name``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    at: int | None = None
    """The first piece only: where the arguments value starts in the text the parser was
    fed (None when the parser cannot tell)."""


@dataclass
class ParserDelta:
    """What one step of parsing lets through: content text and pieces of calls."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)

    def extend(self, other: ParserDelta) -> ParserDelta:
        self.content += other.content
        self.calls.extend(other.calls)
        return self


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str
    at: int | None = None
    """Where its arguments start in the parsed text (see ``ToolCallDelta.at``)."""


class ToolParser:
    """Reads calls out of a model's text. ``tools`` are the names the request allows. The
    name a model's config gives a format is the parser's key in
    :data:`gateway.serving.tool_parsers.PARSERS`."""

    def __init__(self, tools: Iterable[str], max_calls: int | None = None) -> None:
        self.tools = frozenset(tools)
        self.calls = 0
        """How many calls were announced so far."""
        self.max_calls = max_calls
        self.closed = False
        """``max_calls`` calls were read whole: the text after them is dropped."""

    def feed(self, text: str) -> ParserDelta:
        raise NotImplementedError

    def finish(self) -> ParserDelta:
        return ParserDelta()

    def _announce(self, name: str, at: int | None = None) -> ToolCallDelta:
        delta = ToolCallDelta(self.calls, id=new_call_id(), name=name, at=at)
        self.calls += 1
        return delta

    def _completed(self) -> None:
        """The last announced call was read whole."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            self.closed = True


def assemble(parser: ToolParser, text: str) -> tuple[str | None, list[ParsedCall]]:
    """A whole reply read by ``parser``: its content (None when it is only calls) and its
    calls."""
    delta = parser.feed(text).extend(parser.finish())
    calls: dict[int, ParsedCall] = {}
    for piece in delta.calls:
        call = calls.setdefault(
            piece.index, ParsedCall(piece.id or "", piece.name or "", "", piece.at)
        )
        call.arguments += piece.arguments
    content = delta.content
    if calls and not content.strip():
        return None, list(calls.values())
    return content if not calls else content.strip(), list(calls.values())
