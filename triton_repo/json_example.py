"""A JSON value that fits a JSON Schema, so ``mock_chat`` honours structured outputs
(tests and benchmarks of constrained decoding run without weights).

It covers what response formats and tool parameters use: objects (every property),
arrays (``minItems``, at least one item), strings (``enum``, ``const``, ``minLength``,
``maxLength``, common ``format``\\ s), numbers within their bounds, booleans, null,
``anyOf``/``oneOf`` (the first), ``allOf`` (merged) and local ``$ref`` (``#/$defs/...``).
"""

from __future__ import annotations

from typing import Any

_FORMATS = {
    "date": "2024-01-02",
    "date-time": "2024-01-02T03:04:05Z",
    "time": "03:04:05",
    "email": "fox@example.com",
    "uri": "https://example.com/fox",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def example(schema: Any, root: Any = None, depth: int = 0) -> Any:
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 32:
        return None
    if "$ref" in schema:
        return example(_resolve(root, schema["$ref"]), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return example(schema[key][0], root, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(root, part["$ref"]) if "$ref" in part else part)
        return example(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        count = min(count, int(schema.get("maxItems", count)))
        items = schema.get("items", {})
        return [example(items, root, depth + 1) for _ in range(count)]
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    return None


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _string(schema: dict[str, Any]) -> str:
    text = _FORMATS.get(schema.get("format", ""), "quick brown fox")
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(text) < low:
        text += "x" * (low - len(text))
    if high is not None:
        text = text[: int(high)]
    return text


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
