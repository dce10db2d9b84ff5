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
"""

from __future__ import annotations

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


class _JsonConverter(SchemaConverter):
    def _add_rule(self, name: str, rule: str) -> str:
        return super()._add_rule(name, _RULES.get(name, rule))

    def _format_literal(self, literal: str) -> str:
        # The literal is JSON text (json.dumps of a value or a name); in a grammar literal
        # its backslashes must be escaped too, or "\\" and "\"" lose theirs.
        return super()._format_literal(literal.replace("\\", "\\\\"))


def from_schema(schema: dict[str, Any]) -> str:
    """The GBNF grammar of the JSON texts ``schema`` accepts (as the converter reads it:
    local ``$ref``s, no remote ones)."""
    converter = _JsonConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "input"), "")
    return converter.format_grammar()
