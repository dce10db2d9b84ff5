"""JSON schemas are bounded: one larger than ``max_schema_kb`` is refused wherever a client
can send one (``response_format``, Responses ``text.format``, a tool's ``parameters``), and
checking schemas keeps no schema in memory."""

from __future__ import annotations

import tracemalloc
from typing import Any

import httpx
import pytest

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.serving.structured import check_schema
from tests.unit.conftest import assert_openai_error, chat_body

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
