"""The shape of a JSON text (nesting, containers, values), measured without parsing it.

A request body becomes Python objects when it is parsed, and a hostile one can make a
replica hold far more than its bytes: a 34 MB body of a million one-letter messages is
several million objects (over a gigabyte once validated), and arrays nested thousands deep
make the standard parser recurse until it fails. :func:`json_shape` reads the text as bytes
in fixed-size windows with numpy (no object per value, memory flat whatever the body), so
such a body is refused before anything is built from it; it stops at the first window past
a limit, so a hostile body is refused in milliseconds.

What it counts is exact for valid JSON: a backslash inside a string escapes the next
character (so ``\\\\`` and ``\\"`` pairs are dropped first), every other quote opens or
closes a string, and brackets and commas inside strings are not counted. Invalid JSON gets
some count; the parser refuses it afterwards anyway, and it can nest no deeper than what
was counted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.config import Settings

_WINDOW = 1 << 20

_QUOTE = ord('"')
#: +1 for what opens a container, -1 for what closes one.
_STEP = np.zeros(256, np.int8)
_STEP[[ord("{"), ord("[")]] = 1
_STEP[[ord("}"), ord("]")]] = -1
_COMMA = ord(",")
_BACKSLASH = ord("\\")
_BACKSLASHES = re.compile(rb"\\*")
_QUOTE_BYTE = b'"'


@dataclass(frozen=True)
class JsonShape:
    """``depth``: the deepest nesting of objects and arrays; ``containers``: how many
    objects and arrays; ``values``: an upper bound on the values and members in them
    (containers plus commas plus one)."""

    depth: int
    containers: int
    values: int


@dataclass(frozen=True)
class JsonLimits:
    """What a JSON body may hold: ``GATEWAY_MAX_JSON_DEPTH``, ``GATEWAY_MAX_JSON_CONTAINERS``
    and ``GATEWAY_MAX_JSON_VALUES``."""

    depth: int
    containers: int
    values: int

    @classmethod
    def from_settings(cls, settings: Settings) -> JsonLimits:
        return cls(settings.max_json_depth, settings.max_json_containers, settings.max_json_values)

    @classmethod
    def defaults(cls) -> JsonLimits:
        """The settings' defaults."""
        fields = Settings.model_fields
        return cls(
            fields["max_json_depth"].default,
            fields["max_json_containers"].default,
            fields["max_json_values"].default,
        )

    def refusal(self, shape: JsonShape, subject: str) -> tuple[str, str] | None:
        """Why ``subject`` (``"The request body's JSON"``...), of ``shape``, is refused,
        as the message and the error code (``json_too_deep``, ``json_too_complex``); None
        when it is within every limit."""
        exceeded = self.exceeded(shape)
        if exceeded is None:
            return None
        if exceeded == "depth":
            return (
                f"{subject} nests {shape.depth} levels deep or more; the gateway reads JSON "
                f"nested at most {self.depth} levels deep (GATEWAY_MAX_JSON_DEPTH).",
                "json_too_deep",
            )
        if exceeded == "containers":
            what, most, setting = "objects and arrays", self.containers, "CONTAINERS"
        else:
            what, most, setting = "values", self.values, "VALUES"
        return (
            f"{subject} holds more than {most} {what}, the most the gateway reads in one "
            f"request (GATEWAY_MAX_JSON_{setting}).",
            "json_too_complex",
        )

    def exceeded(self, shape: JsonShape) -> str | None:
        """The name of the first limit ``shape`` passes, or None."""
        if shape.depth > self.depth:
            return "depth"
        if shape.containers > self.containers:
            return "containers"
        if shape.values > self.values:
            return "values"
        return None


def json_shape(text: bytes | str, limits: JsonLimits | None = None) -> JsonShape:
    """Measures ``text``; with ``limits``, stops at the first window where one is passed
    (the shape returned then passes it, and counts only what was read so far)."""
    data = _utf8(text)
    in_string = False
    depth = deepest = containers = commas = 0
    start = 0
    while start < len(data):
        end = min(start + _WINDOW, len(data))
        # A window never ends inside a run of backslashes, so each escape is whole in one
        # (the run is skipped by the regex engine, not byte by byte in Python).
        if end < len(data) and data[end - 1] == _BACKSLASH:
            run = _BACKSLASHES.match(data, end)  # always matches: the run may be empty
            end = min((run.end() if run else end) + 1, len(data))
        window = data[start:end]
        start = end
        if _QUOTE_BYTE not in window and (in_string or not _counted(window)):
            continue  # all inside one string, or only literals and spaces: nothing to count
        flat = window.replace(b"\\\\", b"").replace(b'\\"', b"")
        chars: npt.NDArray[np.uint8] = np.frombuffer(flat, np.uint8)
        if chars.size == 0:
            continue
        quotes = chars == _QUOTE
        # After an odd number of quotes (counted from the start of the text), inside a string.
        inside = (np.cumsum(quotes, dtype=np.int32) & 1).astype(bool)
        if in_string:
            inside = ~inside
        structural = ~(inside | quotes)
        steps = _STEP[chars] * structural
        containers += int(np.count_nonzero(steps > 0))
        commas += int(np.count_nonzero((chars == _COMMA) & structural))
        levels = np.cumsum(steps, dtype=np.int32)
        deepest = max(deepest, depth + int(levels.max()))
        depth += int(levels[-1])
        in_string = bool(inside[-1])
        shape = JsonShape(deepest, containers, containers + commas + 1)
        if limits is not None and limits.exceeded(shape) is not None:
            return shape
    return JsonShape(deepest, containers, containers + commas + 1)


def json_depth(text: bytes | str) -> int:
    """The deepest nesting of objects and arrays in ``text``, outside strings: ``0`` for a
    scalar, ``1`` for ``[]`` or ``{"a": 1}``, ``2`` for ``[[1]]``. For invalid JSON, at
    least the depth of its longest valid prefix (as far as a parser recurses before it
    fails), so a text measured within a bound never makes a parser recurse past it."""
    return json_shape(text).depth


#: A run of backslashes (tried once, from its first: a run's every backslash tried as the
#: start made a long run quadratic) that ends ``u`` and a surrogate's four hex digits.
_SURROGATE_ESCAPE = re.compile(rb"(?<!\\)(\\+)u[dD]([89a-fA-F])[0-9a-fA-F]{2}")
#: A surrogate's code point encoded as UTF-8 (never valid UTF-8; the parser lets it through).
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def lone_surrogate(text: bytes | str) -> int | None:
    """Where ``text`` holds a UTF-16 surrogate that is not half of a pair (an escape such as
    ``\\ud800`` without its other half right after or before it, or a surrogate encoded as
    UTF-8 bytes): the offset in its UTF-8 bytes, or None. :func:`json.loads` makes such a
    string, which then fails whatever encodes it (a prompt for the engine, a stored record,
    a log line): a request body holding one is refused before it is parsed."""
    data = _utf8(text)
    encoded = _ENCODED_SURROGATE.search(data)
    if encoded is not None:
        return encoded.start()
    if b"\\u" not in data:
        return None
    paired = -1
    for match in _SURROGATE_ESCAPE.finditer(data):
        if len(match.group(1)) % 2 == 0:
            continue  # escaped backslashes, then the letters "ud800"
        at = match.end(1) - 1
        if match.group(2) in b"89abAB":  # high: its low half must follow at once
            low = _SURROGATE_ESCAPE.match(data, match.end())
            if low is not None and len(low.group(1)) == 1 and low.group(2) in b"cdefCDEF":
                paired = low.start()
                continue
            return at
        if match.start() != paired:
            return at
    return None


def surrogate_refusal(text: bytes | str, subject: str) -> str | None:
    """Why ``subject`` (``"The request body's JSON"``...) is refused when ``text`` holds a
    lone surrogate (:func:`lone_surrogate`, code ``invalid_json``); None when it holds none."""
    at = lone_surrogate(text)
    if at is None:
        return None
    return (
        f"{subject} holds a lone UTF-16 surrogate (byte {at}): a string's \\ud800 to "
        "\\udfff escapes must come in pairs, and its bytes must be valid UTF-8."
    )


def _utf8(text: bytes | str) -> bytes:
    """``text`` as UTF-8 bytes, where every ASCII character is a byte of its own. Bytes are
    read as :func:`json.loads` reads them: UTF-8, or UTF-16/32 when their first bytes say so."""
    if isinstance(text, str):
        return text.encode("utf-8", "surrogatepass")
    encoding = json.detect_encoding(text[:4])
    if encoding in ("utf-8", "utf-8-sig"):
        return text
    try:
        return text.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:
        return text  # no text in that encoding: the parser refuses it (nothing is built)


def _counted(window: bytes) -> bool:
    """Whether ``window`` holds anything :func:`json_shape` counts outside strings."""
    return any(char in window for char in (b"{", b"[", b"}", b"]", b","))
