"""Calls the gateway forced with constrained decoding (``tool_choice`` ``required`` or a
named function), so their text is known JSON rather than a model's own format:

- ``required``: a JSON array of ``{"name": ..., "arguments": {...}}`` objects
  (:class:`CallArrayParser`);
- a named function: the arguments object alone (:class:`NamedCallParser`).

They are not chosen by a model's config, so they are not in the package's ``PARSERS`` table.
"""

from __future__ import annotations

from gateway.serving.tool_parsers.base import ParserDelta, ToolCallDelta, ToolParser
from gateway.serving.tool_parsers.call_reader import CallReader


class NamedCallParser(ToolParser):
    """All the text is the arguments of one call to ``function``."""

    def __init__(self, function: str) -> None:
        super().__init__([function])
        self.function = function

    def feed(self, text: str) -> ParserDelta:
        out = ParserDelta()
        if self.calls == 0:
            out.calls.append(self._announce(self.function))
        if text:
            if out.calls:
                out.calls[0].arguments = text
            else:
                out.calls.append(ToolCallDelta(0, arguments=text))
        return out


class CallArrayParser(ToolParser):
    """``[{"name": ..., "arguments": ...}, ...]``, each call passed on as it is written."""

    def __init__(self, tools: list[str] | tuple[str, ...] | frozenset[str]) -> None:
        super().__init__(tools)
        self._call: CallReader | None = None
        self._between = ""  # text between calls: "[", ",", "}", whitespace, "]"

    def feed(self, text: str) -> ParserDelta:
        out = ParserDelta()
        while text:
            if self._call is None:
                self._between += text
                text = ""
                start = self._between.find("{")
                if start < 0:
                    break
                text, self._between = self._between[start:], ""
                self._call = CallReader()
            name, arguments = self._call.feed(text)
            text = ""
            if name is not None:
                out.calls.append(self._announce(name))
            if arguments:
                out.calls.append(ToolCallDelta(self.calls - 1, arguments=arguments))
            if self._call.done:
                # What follows the arguments: "}", then "," and the next call, or "]".
                text = self._call.rest.lstrip().removeprefix("}")
                self._call = None
        return out
