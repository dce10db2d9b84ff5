"""docs/messages.md's field table checked against the pinned anthropic SDK and the app: every
field of ``MessageCreateParams`` and of its beta (``client.beta.messages``) has exactly one
row (honoured, refused or metadata), the
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
from anthropic.types.beta import message_count_tokens_params as beta_count_params
from anthropic.types.beta import message_create_params as beta_create_params
from fastapi import FastAPI

from gateway.serving.messages import CountTokensRequest, MessagesRequest
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
    "betas": ["context-management-2025-06-27"],
    "fallback_credit_token": "fct_1",
    "fallbacks": "default",
    "compaction": {"trigger": {"type": "input_tokens", "value": 100000}},
    "mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse", "name": "example"}],
    "thread": {"type": "create"},
}
HI = [{"role": "user", "content": "Hi"}]


def _rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for field, kind in ROW.findall(DOC.read_text()):
        rows.setdefault(field, []).append(kind)
    return rows


def _sdk_fields() -> set[str]:
    standard = typing.get_type_hints(message_create_params.MessageCreateParamsNonStreaming)
    beta = typing.get_type_hints(beta_create_params.MessageCreateParamsNonStreaming)
    return set(standard) | set(beta)


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


async def test_a_beta_clients_billing_and_fallbacks_are_served_or_refused_by_value(
    plain: httpx2.AsyncClient,
) -> None:
    asked = {"model": "fake-chat", "max_tokens": 8, "messages": HI}
    served = {"billing_policy": {"type": "billing_policy", "bill_to": "self"}, "fallbacks": []}
    assert (await plain.post("/v1/messages", json={**asked, **served})).status_code == 200
    for field, value, param in [
        ("billing_policy", {"type": "billing_policy", "bill_to": "user_profile"}, "bill_to"),
        ("fallbacks", [{"model": "claude-opus-4-8"}], "fallbacks"),
    ]:
        answer = await plain.post("/v1/messages", json={**asked, field: value})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["message"].split(":")[0]) == (
            "invalid_request_error",
            f"{field}.{param}" if param == "bill_to" else field,
        )


async def test_count_tokens_takes_its_beta_fields_as_anthropic_does(
    plain: httpx2.AsyncClient,
) -> None:
    """Its compaction is accepted and ignored (the count is the conversation's as sent);
    mcp_servers is refused, as for a message."""
    fields = set(typing.get_type_hints(beta_count_params.MessageCountTokensParams))
    assert fields <= set(CountTokensRequest.model_fields)
    asked = {"model": "fake-chat", "messages": HI}
    plain_count = await plain.post("/v1/messages/count_tokens", json=asked)
    compacted = await plain.post(
        "/v1/messages/count_tokens", json={**asked, "compaction": SAMPLES["compaction"]}
    )
    assert compacted.status_code == 200, compacted.text
    assert compacted.json()["input_tokens"] == plain_count.json()["input_tokens"]
    refused = await plain.post(
        "/v1/messages/count_tokens", json={**asked, "mcp_servers": SAMPLES["mcp_servers"]}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("mcp_servers")
