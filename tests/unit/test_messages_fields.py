"""docs/messages.md's field table checked against the pinned anthropic SDK and the app: every
field of ``MessageCreateParams`` has exactly one row (honoured, refused or metadata), the
request model declares every row's field, a refused field is a 400 naming it, a metadata
field is served, and a field the SDK does not define is unrecognized."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import httpx2
import pytest
from anthropic.types import message_create_params
from fastapi import FastAPI

from gateway.serving.messages import MessagesRequest
from tests.support.inprocess import ADMIN_KEY, BASE_URL

DOC = Path(__file__).parents[2] / "docs" / "messages.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (honoured|refused|metadata) \|", re.MULTILINE)
#: A value a client sends for each field that is not honoured (the samples of the test).
SAMPLES: dict[str, Any] = {
    "container": "container_1",
    "cache_control": {"type": "ephemeral", "ttl": "1h"},
    "service_tier": "standard_only",
    "speed": "fast",
    "inference_geo": "us",
    "diagnostics": {"previous_message_id": None},
    "user_profile_id": "profile_1",
    "workspace_id": "workspace_1",
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
}
HI = [{"role": "user", "content": "Hi"}]


def _rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for field, kind in ROW.findall(DOC.read_text()):
        rows.setdefault(field, []).append(kind)
    return rows


def _sdk_fields() -> set[str]:
    return set(typing.get_type_hints(message_create_params.MessageCreateParamsNonStreaming))


@pytest.mark.parametrize("field", sorted(_sdk_fields()))
def test_every_sdk_field_has_one_row_and_is_declared(field: str) -> None:
    rows = _rows()
    assert len(rows.get(field, [])) == 1, f"docs/messages.md: no single row for '{field}'"
    assert field in MessagesRequest.model_fields


def test_every_row_is_a_declared_field() -> None:
    assert set(_rows()) <= set(MessagesRequest.model_fields)


@pytest.fixture
async def plain(app: FastAPI) -> typing.AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app),
        base_url=BASE_URL,
        headers={"x-api-key": ADMIN_KEY},
    ) as client:
        yield client


def _kind(kind: str) -> list[str]:
    return sorted(field for field, kinds in _rows().items() if kinds == [kind])


@pytest.mark.parametrize("field", _kind("refused"))
async def test_a_refused_field_is_a_400_naming_it(plain: httpx2.AsyncClient, field: str) -> None:
    body = {"model": "fake-chat", "max_tokens": 8, "messages": HI, field: SAMPLES[field]}
    answer = await plain.post("/v1/messages", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(field), answer.text


@pytest.mark.parametrize("field", _kind("metadata"))
async def test_a_metadata_field_is_accepted(plain: httpx2.AsyncClient, field: str) -> None:
    body = {"model": "fake-chat", "max_tokens": 8, "messages": HI, field: SAMPLES[field]}
    answer = await plain.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["type"] == "text"


async def test_a_made_up_field_is_unrecognized(plain: httpx2.AsyncClient) -> None:
    body = {"model": "fake-chat", "max_tokens": 8, "messages": HI, "made_up": 1}
    answer = await plain.post("/v1/messages", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "Unrecognized request argument supplied: made_up"
