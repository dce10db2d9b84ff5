"""JSON schemas are bounded: one larger than ``max_schema_kb``, nested too deeply, asking
for too many items or characters, or with a pattern RE2 cannot match is refused wherever a
client can send one (``response_format``, Responses ``text.format``, a tool's
``parameters``); checking schemas keeps no schema in memory; and the models that build from
a schema (smollm2's grammar, the mock's example) bound what they expand on their own."""

from __future__ import annotations

import importlib.util
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving import structured
from gateway.serving.structured import check_schema
from tests.support.bodies import assert_openai_error, chat_body

LIMIT_KB: int = Settings.model_fields["max_schema_kb"].default


def schema_of(size: int, tag: str = "") -> dict[str, Any]:
    """A valid schema of about ``size`` bytes of JSON (its description fills it)."""
    return {"type": "object", "description": tag + "d" * size}


def json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}


def tool(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


TOO_LARGE = schema_of(LIMIT_KB * 1024 + 1)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            chat_body(response_format=json_format(TOO_LARGE)),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            chat_body(tools=[tool(TOO_LARGE)], tool_choice="required"),
            "tools.[0].function.parameters",
        ),
        (
            "/v1/responses",
            {
                "model": "fake-chat",
                "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "big", "schema": TOO_LARGE}},
            },
            "text.format.schema",
        ),
        (
            "/v1/responses",
            {
                "model": "fake-chat",
                "input": "Hi",
                "tools": [{"type": "function", "name": "f", "parameters": TOO_LARGE}],
            },
            "tools[0].parameters",
        ),
    ],
)
async def test_a_schema_over_the_limit_is_a_400_naming_it(
    http: httpx.AsyncClient, fake: FakeBackend, path: str, body: dict[str, Any], param: str
) -> None:
    error = assert_openai_error(await http.post(path, json=body), 400, param=param)
    assert f"{LIMIT_KB} KB" in error["message"] and "max_schema_kb" in error["message"]
    assert fake.calls == []


async def test_the_limit_is_on_the_size_of_the_json(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "{}"
    within = schema_of(LIMIT_KB * 1024 - 100)
    reply = await http.post(
        "/v1/chat/completions", json=chat_body(response_format=json_format(within))
    )
    assert reply.status_code == 200, reply.text
    assert fake.calls[-1].options.constraint == {"json": within}
    over = await http.post(
        "/v1/chat/completions",
        json=chat_body(response_format=json_format(schema_of(LIMIT_KB * 1024))),
    )
    assert_openai_error(over, 400, code="schema_too_large")


def test_checking_many_schemas_keeps_none_of_them_in_memory() -> None:
    # Agents send the same tools on every call, so checks are remembered; what is kept
    # must not grow with the schemas (300 distinct ones of 20 KB here).
    schemas = [schema_of(20_000, tag=f"{i}:") for i in range(300)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index, schema in enumerate(schemas):
            check_schema(schema, f"schemas[{index}]")
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert kept < 1_000_000, f"{kept:,} bytes kept after checking the schemas"


# Issue 24: a schema small in bytes can still be huge in what it asks for, or nested past
# Python's recursion limit, or carry a pattern that backtracks for hours.

COUNT = structured.MAX_SCHEMA_COUNT
DEEP = structured.MAX_SCHEMA_DEPTH


def nested(levels: int) -> dict[str, Any]:
    """An object schema ``levels`` objects deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def entry_points(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """Where a client sends a schema: (path, body, the param that names the schema)."""
    return [
        (
            "/v1/chat/completions",
            chat_body(response_format=json_format(schema)),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            chat_body(tools=[tool(schema)], tool_choice="required"),
            "tools.[0].function.parameters",
        ),
        (
            "/v1/responses",
            {
                "model": "fake-chat",
                "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "big", "schema": schema}},
            },
            "text.format.schema",
        ),
    ]


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "array", "minItems": 200_000_000, "items": {"type": "string"}}, "minItems"),
        ({"type": "string", "minLength": 10**10}, "minLength"),
        ({"type": "string", "maxLength": 1e10}, "maxLength"),
        (
            {"type": "object", "properties": {"tags": {"type": "array", "maxItems": COUNT + 1}}},
            "properties.tags.maxItems",
        ),
        ({"type": "object", "minProperties": 10**9}, "minProperties"),
        (
            {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "contains": {}, "minContains": 10**6},
                ]
            },
            "anyOf.[1].minContains",
        ),
        # A property named like a data keyword is still a schema.
        (
            {"type": "object", "properties": {"enum": {"type": "array", "minItems": 10**9}}},
            "properties.enum.minItems",
        ),
    ],
)
async def test_a_count_over_the_bound_is_a_400_naming_where_it_is(
    http: httpx.AsyncClient, fake: FakeBackend, schema: dict[str, Any], where: str
) -> None:
    for path, body, param in entry_points(schema):
        reply = await http.post(path, json=body)
        error = assert_openai_error(reply, 400, param=f"{param}.{where}", code="schema_too_large")
        assert f"{COUNT:,}" in error["message"]
    assert fake.calls == []


async def test_counts_up_to_the_bound_and_data_that_looks_like_counts_are_taken(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "[]"
    schema = {
        "type": "array",
        "maxItems": COUNT,
        "items": {"type": "string", "maxLength": COUNT},
        "default": [{"minItems": 10**9}],
    }
    reply = await http.post(
        "/v1/chat/completions", json=chat_body(response_format=json_format(schema))
    )
    assert reply.status_code == 200, reply.text
    assert fake.calls[-1].options.constraint == {"json": schema}


async def test_a_schema_nested_too_deeply_is_a_400_not_a_500(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # Past the schema's bound but within the body's (GATEWAY_MAX_JSON_DEPTH, 128: deeper
    # bodies are refused before they are parsed, json_too_deep): far under max_schema_kb.
    schema = nested(DEEP // 2 + 10)
    assert len(json.dumps(schema)) < LIMIT_KB * 1024
    for path, body, param in entry_points(schema):
        error = assert_openai_error(
            await http.post(path, json=body), 400, param=param, code="schema_too_large"
        )
        assert f"{DEEP} levels" in error["message"]
    assert fake.calls == []


def test_the_depth_bound_is_on_json_nesting() -> None:
    within = nested(DEEP // 2 - 1)  # the root, then two levels per object
    check_schema(within, "schema")
    with pytest.raises(InvalidRequestError) as raised:
        check_schema(nested(DEEP // 2), "schema")
    assert raised.value.code == "schema_too_large"


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "string", "pattern": "^(?=.*[0-9]).+$"}, "pattern"),  # a lookahead
        ({"type": "string", "pattern": "^(a)\\1$"}, "pattern"),  # a backreference
        ({"type": "string", "pattern": "^[a-z"}, "pattern"),
        # Too large a program (its memory, and so the time compiling it, is bounded).
        ({"type": "string", "pattern": "^\\p{L}{1,300}$"}, "pattern"),
        (
            {"type": "object", "patternProperties": {"^(?!x)": {"type": "integer"}}},
            "patternProperties.^(?!x)",
        ),
    ],
)
async def test_a_pattern_re2_cannot_match_is_a_400_naming_it(
    http: httpx.AsyncClient, fake: FakeBackend, schema: dict[str, Any], where: str
) -> None:
    for path, body, param in entry_points(schema):
        error = assert_openai_error(
            await http.post(path, json=body),
            400,
            param=f"{param}.{where}",
            code="invalid_json_schema",
        )
        assert "RE2" in error["message"]
    assert fake.calls == []


async def test_a_schema_with_too_many_patterns_is_a_400(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    many = structured.MAX_SCHEMA_PATTERNS + 1
    properties = {f"p{i}": {"type": "string", "pattern": f"^{i}$"} for i in range(many)}
    schema = {"type": "object", "properties": properties}
    for path, body, param in entry_points(schema):
        error = assert_openai_error(await http.post(path, json=body), 400, code="schema_too_large")
        assert error["param"].startswith(f"{param}.properties.p")
    assert fake.calls == []


def test_ecma_patterns_re2_can_match_are_taken() -> None:
    for pattern in ["^\\u00e9t\\u00e9$", "^[\\p{L} ]+$", "^\\p{L}{1,20}$", "^(?<word>\\w+)$"]:
        check_schema({"type": "string", "pattern": pattern}, "schema")


# The models build from a schema on their own (operators may front them directly): both
# bound what they expand.

TRITON_REPO = Path(__file__).resolve().parents[2] / "triton_repo"
HUGE = [
    {"type": "array", "minItems": 200_000_000, "items": {"type": "string"}},
    {"type": "string", "minLength": 10**10},
    {"type": "string", "pattern": "^a{1000000000}$"},
    {"type": "array", "maxItems": 10**9, "items": {"type": "integer"}},
]


def load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("schema", [*HUGE, nested(200)])
def test_smollm2s_grammar_refuses_what_it_would_expand_too_far(schema: dict[str, Any]) -> None:
    pytest.importorskip("llama_cpp")
    json_grammar = load("json_grammar", TRITON_REPO / "smollm2" / "1" / "json_grammar.py")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"more than|deeper than"):
        json_grammar.from_schema(schema)
    assert time.perf_counter() - started < 1


def test_smollm2s_grammar_keeps_long_names_and_counts_small() -> None:
    pytest.importorskip("llama_cpp")
    json_grammar = load("json_grammar", TRITON_REPO / "smollm2" / "1" / "json_grammar.py")
    # A long property name is repeated by every item of its array's rule.
    name = "n" * 30_000
    items = {"type": "array", "items": {"type": "integer"}}
    schema = {
        "type": "object",
        "properties": {name: {"type": "array", "maxItems": COUNT, "items": items}},
    }
    assert len(json_grammar.from_schema(schema)) < 1_000_000


@pytest.mark.parametrize(
    "schema",
    [
        *HUGE,
        # Arrays of arrays, and a $ref used twice at every level: products, not sums.
        {
            "type": "array",
            "minItems": COUNT,
            "items": {"type": "array", "minItems": COUNT, "items": {"type": "string"}},
        },
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}},
                }
            },
            "$ref": "#/$defs/n",
        },
    ],
)
def test_the_mock_models_example_stays_small_whatever_the_schema(schema: dict[str, Any]) -> None:
    json_example = load("json_example", TRITON_REPO / "json_example.py")
    started = time.perf_counter()
    value = json_example.example(schema)
    assert time.perf_counter() - started < 2
    assert len(json.dumps(value)) < 1_000_000


def test_the_mock_models_example_still_fits_ordinary_schemas() -> None:
    json_example = load("json_example", TRITON_REPO / "json_example.py")
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 20},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 3},
        },
    }
    value = json_example.example(schema)
    assert len(value["city"]) == 20 and len(value["tags"]) == 3


async def test_a_tool_only_shown_to_the_model_may_ask_for_large_counts(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # Claude Code's tools ask for maxLength 524,288: no grammar is built for a tool that is
    # neither forced nor strict, so its counts are not bounded; forced, they are.
    schema = {"type": "object", "properties": {"script": {"type": "string", "maxLength": 524_288}}}
    shown = await http.post("/v1/chat/completions", json=chat_body(tools=[tool(schema)]))
    assert shown.status_code == 200, shown.text
    forced = await http.post(
        "/v1/chat/completions", json=chat_body(tools=[tool(schema)], tool_choice="required")
    )
    assert_openai_error(forced, 400, code="schema_too_large")
