"""A JSON value that fits a JSON Schema, so ``mock_chat`` honours structured outputs
(tests and benchmarks of constrained decoding run without weights).

It covers what response formats and tool parameters use: objects (every property),
arrays (``minItems``, at least one item), strings (``enum``, ``const``, ``minLength``,
``maxLength``, common ``format``\\ s), numbers within their bounds, booleans, null,
``anyOf``/``oneOf`` (the first), ``allOf`` (merged) and local ``$ref`` (``#/$defs/...``).

The value is bounded whatever the schema asks for (a few bytes can ask for 200,000,000
items, or arrays of arrays, or ``$ref``\\ s used twice at every level): each count is cut to
:data:`MAX_REPEAT`, and once :data:`MAX_VALUES` values and characters are written, arrays
end and further values are null. Past those bounds the value no longer fits the schema.
"""

from __future__ import annotations

from typing import Any

#: The largest ``minItems`` or ``minLength`` written.
MAX_REPEAT = 4096
#: How many values and string characters one example holds at most.
MAX_VALUES = 16384
#: How many schemas deep the example goes (``$ref``\\ s included); deeper values are null.
MAX_DEPTH = 32

_FORMATS = {
    "date": "2024-01-02",
    "date-time": "2024-01-02T03:04:05Z",
    "time": "03:04:05",
    "email": "fox@example.com",
    "uri": "https://example.com/fox",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def example(schema: Any) -> Any:
    """A value that fits ``schema``, within the bounds above."""
    return _Writer(schema).value(schema, 0)


class _Writer:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.left = MAX_VALUES

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict) or depth > MAX_DEPTH or self.left <= 0:
            return None
        self.left -= 1
        if "$ref" in schema:
            return self.value(self.resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.value(schema[key][0], depth + 1)
        if schema.get("allOf"):
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                if isinstance(part, dict):
                    merged.update(self.resolve(part["$ref"]) if "$ref" in part else part)
            return self.value(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = (
                "object" if "properties" in schema else "array" if "items" in schema else "string"
            )
        if kind == "object":
            properties = schema.get("properties", {})
            return {name: self.value(sub, depth + 1) for name, sub in properties.items()}
        if kind == "array":
            count = max(_count(schema, "minItems", 1), 1)
            count = min(count, _count(schema, "maxItems", count), MAX_REPEAT)
            items = schema.get("items", {})
            values = []
            while len(values) < count and self.left > 0:
                values.append(self.value(items, depth + 1))
            return values
        if kind == "string":
            text = self.string(schema)
            self.left -= len(text)
            return text
        if kind in ("integer", "number"):
            return _number(schema, kind == "integer")
        if kind == "boolean":
            return True
        return None

    def resolve(self, ref: Any) -> Any:
        node = self.root
        for part in str(ref).removeprefix("#/").split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node

    def string(self, schema: dict[str, Any]) -> str:
        text = _FORMATS.get(schema.get("format", ""), "quick brown fox")
        low = min(_count(schema, "minLength", 0), MAX_REPEAT, max(self.left, 0))
        if len(text) < low:
            text += "x" * (low - len(text))
        if "maxLength" in schema:
            text = text[: _count(schema, "maxLength", len(text))]
        return text


def _count(schema: dict[str, Any], key: str, default: int) -> int:
    value = schema.get(key, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _number(schema: dict[str, Any], integer: bool) -> float | int:
    value: float = 1
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "exclusiveMinimum" in schema:
        value = max(value, schema["exclusiveMinimum"] + 1)
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMaximum" in schema:
        value = min(value, schema["exclusiveMaximum"] - 1)
    return int(value) if integer else float(value)
