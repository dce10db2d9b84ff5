"""Hermes-style calls (vLLM's ``hermes``): each call is a JSON object between tags,
``<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>``, with any
plain text around them. ChatML models trained for tools (Hermes, Qwen) write this."""

from __future__ import annotations

import json

from gateway.serving.tool_parsers.base import ParserDelta, ToolCallDelta, ToolParser
from gateway.serving.tool_parsers.call_reader import CallReader

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _held_back(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that could be the start of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class HermesParser(ToolParser):
    """vLLM's ``hermes`` format: calls between ``<tool_call>`` tags, text around them."""

    def __init__(
        self, tools: frozenset[str] | list[str] | tuple[str, ...], max_calls: int | None = None
    ) -> None:
        super().__init__(tools, max_calls)
        self._pending = ""  # text not yet passed on: always the tail of what was fed
        self._fed = 0  # characters fed so far
        self._call: CallReader | None = None
        self._announced = False  # the current call's name was passed on

    def feed(self, text: str) -> ParserDelta:
        out = ParserDelta()
        if self.closed:
            return out
        self._pending += text
        self._fed += len(text)
        while self._pending and not self.closed:
            if self._call is None:
                if not self._text(out):
                    break
            elif not self._in_call(out):
                break
        return out

    def _text(self, out: ParserDelta) -> bool:
        """Plain text up to the next call; True when a call starts."""
        at = self._pending.find(OPEN)
        if at < 0:
            keep = _held_back(self._pending, OPEN)
            out.content += self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
            return False
        out.content += self._pending[:at]
        self._pending = self._pending[at + len(OPEN) :]
        self._call = CallReader(origin=self._fed - len(self._pending))
        self._announced = False
        return True

    def _in_call(self, out: ParserDelta) -> bool:
        """Feeds the current call; True when it closed and text follows."""
        call = self._call
        assert call is not None
        piece, self._pending = self._pending, ""
        finished = call.done
        if not self._announced:
            name, arguments = call.feed(piece)
            if name is not None:
                if name not in self.tools:
                    self._not_a_call(out, call.buffer)
                    return True
                self._announced = True
                out.calls.append(self._announce(name, call.arguments_at))
                if arguments:
                    out.calls[-1].arguments = arguments
            elif CLOSE in call.buffer:
                # Not written name first: read the whole block once it is closed.
                block, _, after = call.buffer.partition(CLOSE)
                self._whole_block(out, block, closed=True)
                self._pending = after
                return True
        else:
            _, arguments = call.feed(piece)
            if arguments:
                out.calls.append(ToolCallDelta(self.calls - 1, arguments=arguments))
        if call.done and not finished:
            self._completed()
            if self.closed:
                return False
        if call.done:
            at = call.rest.find(CLOSE)
            if at >= 0:
                self._pending = call.rest[at + len(CLOSE) :]
                self._call = None
                return True
        return False

    def _whole_block(self, out: ParserDelta, block: str, closed: bool) -> None:
        self._call = None
        try:
            data = json.loads(block)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's limit
            data = None
        name = data.get("name") if isinstance(data, dict) else None
        arguments = data.get("arguments", data.get("parameters")) if name else None
        if not isinstance(name, str) or name not in self.tools or arguments is None:
            out.content += OPEN + block + (CLOSE if closed else "")
            return
        out.calls.append(self._announce(name))
        out.calls[-1].arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        self._completed()

    def _not_a_call(self, out: ParserDelta, written: str) -> None:
        self._call = None
        out.content += OPEN
        self._pending = written

    def finish(self) -> ParserDelta:
        out = self.feed("")
        if self.closed:
            return out
        call = self._call
        if call is not None and not self._announced:
            # The text ended inside an unannounced call: a complete object still counts.
            self._whole_block(out, call.buffer, closed=False)
        elif call is None:
            out.content += self._pending
        self._pending = ""
        self._call = None
        return out
