"""Tool-call parsers: they read the calls a model writes into its text, as it streams.

A chat model's config names its format (``tool_call_parser: hermes``, vLLM's names); the
registry maps that name to a :class:`ToolParser` class (registered: ``hermes``; the parsers
of :mod:`.forced` are not registered: the tools module uses them for forced calls). Adding a
format is adding one module here that defines a subclass with a ``name`` and registers it
with :func:`register`, and adding the module to the import at the end of this file (tests:
``tests/unit/test_tool_parsers.py``).

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

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "CallReader",
    "ParsedCall",
    "ParserDelta",
    "ToolCallDelta",
    "ToolParser",
    "assemble",
    "get_parser",
    "new_call_id",
    "parser_names",
    "register",
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
    """Reads calls out of a model's text. ``tools`` are the names the request allows."""

    name = ""

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


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')


class CallReader:
    """Reads one call written as ``{"name": "...", "arguments": ...}`` while it is generated.

    Once the name has been read, the arguments value is passed on as it arrives, and a
    JSON-aware scan (strings, escapes, nesting) finds where it ends, so nothing has to be held
    back. Text after the value is kept in :attr:`rest` for the caller. ``origin``: where
    the call starts in the parser's text."""

    def __init__(self, origin: int = 0) -> None:
        self.origin = origin
        self.buffer = ""
        self.name: str | None = None
        self.arguments_at: int | None = None
        """Where the arguments value starts in the parser's text, once the name was read."""
        self.done = False
        self.rest = ""
        self._scan = 0  # where the arguments scan goes on in the buffer
        self._started = False
        self._literal = False
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> tuple[str | None, str]:
        """Returns (the name if it was read just now, new arguments text)."""
        if self.done:
            self.rest += text
            return None, ""
        self.buffer += text
        named = None
        if self.name is None:
            match = _HEAD.match(self.buffer)
            if match is None:
                return None, ""
            try:
                self.name = named = json.loads(f'"{match.group(1)}"')
            except ValueError:
                self.name = named = match.group(1)
            self._scan = match.end()
            self.arguments_at = self.origin + match.end()
        return named, self._arguments()

    def _arguments(self) -> str:
        buffer, i = self.buffer, self._scan
        while not self._started and i < len(buffer) and buffer[i].isspace():
            i += 1
        first = i
        while i < len(buffer):
            char = buffer[i]
            if not self._started:
                self._started = True
                self._literal = char not in '{["'
            if self._literal:
                if char in ",}]" or char.isspace():
                    return self._end(first, i)
            elif self._in_string:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return self._end(first, i + 1)
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return self._end(first, i + 1)
            i += 1
        self._scan = i
        return buffer[first:i]

    def _end(self, start: int, end: int) -> str:
        self.done = True
        self.rest = self.buffer[end:]
        self._scan = end
        return self.buffer[start:end]


_REGISTRY: dict[str, type[ToolParser]] = {}


def register(parser: type[ToolParser]) -> type[ToolParser]:
    """Class decorator: makes ``parser`` available under its ``name``."""
    _REGISTRY[parser.name] = parser
    return parser


def get_parser(name: str) -> type[ToolParser] | None:
    return _REGISTRY.get(name)


def parser_names() -> list[str]:
    return sorted(_REGISTRY)


# The formats; each module registers itself.
from gateway.serving.tool_parsers import forced, hermes  # noqa: E402, F401
