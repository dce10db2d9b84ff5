"""Reads one tool call written as a JSON object, ``{"name": ..., "arguments": ...}``, while
it is generated: the scan the ``hermes`` parser and the forced calls' parsers share."""

from __future__ import annotations

import json
import re

__all__ = ["CallReader"]

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
