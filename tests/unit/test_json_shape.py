"""json_shape and json_depth: what a JSON text holds (its nesting, its objects and arrays),
read without parsing it, as the parser would find it (generated JSON with strings full of
brackets, quotes and backslashes), over window boundaries, in every encoding json.loads
reads, and never below what a parser recurses into on a text it then refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.serving import json_shape as module
from gateway.serving.json_shape import json_depth, json_shape

#: Strings that look like JSON structure from inside: brackets, quotes, escapes.
tricky = st.text(alphabet=st.sampled_from('[]{}"\\,:aé\n\t\U0001f600'), max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky, inner, max_size=4),
    max_leaves=40,
)


def nesting(value: Any) -> int:
    """The depth by its definition, from the parsed value."""
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_the_depth_of_any_json_is_its_nesting(value: Any, ascii_: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_)
    assert json_depth(text.encode() if as_bytes else text) == nesting(value)
    assert json_shape(text).containers == containers(value)


def containers(value: Any) -> int:
    """The objects and arrays, by their definition, from the parsed value."""
    if isinstance(value, list):
        return 1 + sum(containers(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(containers(v) for v in value.values())
    return 0


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("", 0),
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["]]]]", "[[[["]', 1),
        (r'["\\", "[", "\"[[[", "\\\"[[["]', 1),
        (r'"\\\\\\"', 0),
        (r'["\\\"]"]', 1),
    ],
)
def test_strings_and_escapes_do_not_count(text: str, depth: int) -> None:
    assert json_depth(text) == depth
    assert json_depth(text.encode()) == depth


def test_the_depth_is_carried_across_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "_WINDOW", 7)
    value = {"a": ["[[[", {"b\\": [[['"']]]}], "c": "]]"}
    text = json.dumps(value)
    assert json_depth(text) == nesting(value) == 6


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16-le", "utf-16-be", "utf-32"])
def test_bytes_in_any_encoding_json_reads(encoding: str) -> None:
    text = '{"\u2200\u2222": [["\u5b22"]]}'  # characters whose UTF-16 has '"' or '[' bytes
    data = text.encode(encoding)
    assert json.loads(data) == {"\u2200\u2222": [["\u5b22"]]}
    assert json_depth(data) == 3


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("[" * 5000, 5000),  # never closed
        ("[" * 5000 + '"', 5000),  # a string never closed
        ('["a", ' + "[" * 5000 + "1" + "]" * 4999, 5001),
        ('{"a": "]]]}}}", "b": ' + "[" * 5000 + "x", 5001),
    ],
)
def test_invalid_json_counts_what_a_parser_reads_before_it_fails(text: str, parsed: int) -> None:
    """A parser recurses ``parsed`` levels into these before it finds them invalid: a caller
    that refuses past a bound never lets it recurse past that bound."""
    with pytest.raises((ValueError, RecursionError)):
        json.loads(text)
    assert json_depth(text) >= parsed


def test_a_mega_body_is_one_pass() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "a]" * 50}] * 20_000})
    assert json_depth(body) == 3
    assert json_depth("[" * 1_000_000 + "]" * 1_000_000) == 1_000_000
