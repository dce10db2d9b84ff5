"""JSON Schema -> llama.cpp grammar (GBNF) whose every answer is valid JSON.

llama-cpp-python's converter (``LlamaGrammar.from_json_schema``, 0.3) gets three rules of
JSON wrong, so a constrained answer could fail to parse (``responses.parse`` failed on one):

- a string may hold any character but ``"`` and ``\\``: a raw newline or tab too, which
  JSON forbids (RFC 8259, section 7: U+0000 to U+001F must be escaped);
- ``.`` in a ``pattern`` matches ``"``, ``\\`` and control characters, written raw;
- an ``enum``/``const`` value or a property name is written with its backslashes read as
  grammar escapes: ``"C:\\\\dir"`` came out as ``"C:\\dir"``, an invalid JSON escape.

This is that converter with those rules corrected. A ``pattern``'s own character classes are
still taken as written (``[^a]`` admits a raw newline): they are the schema author's.

It is also bounded, for a schema sent to this model directly as much as through the gateway:
the converter writes one grammar term per item or character a schema asks for (``minItems``,
``maxLength``, a pattern's ``{m,n}``), so a few bytes could ask for gigabytes. A schema over
the bounds below is refused with a ``ValueError`` before anything is expanded.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

#: A character of a JSON string: anything but ``"``, ``\`` and the control characters, or
#: an escape sequence.
STRING_CHAR = (
    r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
)
#: ``.`` of a ``pattern``: one character a JSON string may hold as it is (no line breaks,
#: as in a regular expression).
PATTERN_DOT = r'[^"\\\x00-\x1F]'

#: The converter's rules that are replaced, by name (names it never gives a schema's own
#: rules: those get a suffix).
_RULES = {"char": STRING_CHAR, "dot": PATTERN_DOT}

#: The largest count expanded: ``minItems``, ``maxItems``, ``minLength``, ``maxLength`` and
#: a pattern's ``{m,n}`` (the gateway refuses larger ones too).
MAX_REPEAT = 4096
#: How deeply a schema's JSON may nest in objects and arrays (the converter recurses per
#: level; the gateway takes 64, and wraps forced calls in a few more).
MAX_DEPTH = 128
#: The most optional properties of one object: the converter's rule for them takes time
#: cubic in their number (1.6 s for 900), and recursion as deep.
MAX_OPTIONAL_PROPERTIES = 512
#: The largest grammar written, in characters.
MAX_GRAMMAR_CHARS = 4 << 20
#: How many (sub)schemas may be visited: a ``$ref`` whose name needs escaping is converted
#: again wherever it is used, so references could multiply.
MAX_VISITS = 65536
#: Longer rule names (built from property names, and repeated by every repetition of their
#: rule) are cut to this, with a digest of the whole name to keep them apart.
_NAME_CHARS = 64
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
#: A pattern's escapes and classes (skipped), and its counted repetitions.
_QUANTIFIER = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]|\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}", re.DOTALL)


class _JsonConverter(SchemaConverter):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._visits = 0
        self._chars = 0

    def visit(self, schema: dict[str, Any], name: str) -> str:
        self._visits += 1
        if self._visits > MAX_VISITS:
            raise ValueError(f"the schema takes more than {MAX_VISITS} conversions (its $refs)")
        if len(name) > _NAME_CHARS:
            digest = hashlib.sha256(name.encode()).hexdigest()[:12]
            name = f"{name[: _NAME_CHARS - 13]}-{digest}"
        return super().visit(schema, name)

    def _add_rule(self, name: str, rule: str) -> str:
        rule = _RULES.get(name, rule)
        self._chars += len(name) + len(rule)
        if self._chars > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the grammar would be larger than {MAX_GRAMMAR_CHARS:,} characters")
        return super()._add_rule(name, rule)

    def _format_literal(self, literal: str) -> str:
        # The literal is JSON text (json.dumps of a value or a name); in a grammar literal
        # its backslashes must be escaped too, or "\\" and "\"" lose theirs.
        return super()._format_literal(literal.replace("\\", "\\\\"))


def _check_bounds(schema: Any) -> None:
    """A ``ValueError`` for a schema over the bounds above, found without recursion."""
    level, depth = [schema], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"the schema nests deeper than {MAX_DEPTH} levels")
        children = []
        for node in level:
            if isinstance(node, dict):
                _check_node(node)
                children += [v for v in node.values() if isinstance(v, dict | list)]
            elif isinstance(node, list):
                children += [v for v in node if isinstance(v, dict | list)]
        level = children


def _check_node(node: dict[str, Any]) -> None:
    for key in _COUNTS:
        value = node.get(key)
        if isinstance(value, int | float) and value > MAX_REPEAT:
            raise ValueError(f"{key} {value} is more than {MAX_REPEAT}")
    properties, required = node.get("properties"), node.get("required")
    if isinstance(properties, dict):
        named = set(required) if isinstance(required, list) else set()
        optional = sum(name not in named for name in properties)
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise ValueError(
                f"an object has {optional} optional properties, more than {MAX_OPTIONAL_PROPERTIES}"
            )
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        # A repetition repeats what precedes it, at most the whole pattern.
        expanded = 0
        for match in _QUANTIFIER.finditer(pattern):
            count = max((int(n) for n in match.groups() if n), default=0)
            if count > MAX_REPEAT:
                raise ValueError(f"the pattern repeats {count} times, more than {MAX_REPEAT}")
            expanded += count * len(pattern)
        if expanded > MAX_GRAMMAR_CHARS:
            raise ValueError(
                f"the pattern would expand to more than {MAX_GRAMMAR_CHARS:,} characters"
            )


def from_schema(schema: dict[str, Any]) -> str:
    """The GBNF grammar of the JSON texts ``schema`` accepts (as the converter reads it:
    local ``$ref``s, no remote ones); a ``ValueError`` for a schema over the bounds."""
    _check_bounds(schema)
    converter = _JsonConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "input"), "")
    return converter.format_grammar()
