"""What goes over HTTP, as the tests write and read it: a chat request, the events of an SSE
body (chat's ``data:`` lines, Responses' ``event:`` + ``data:`` blocks), and the OpenAI
error body every refusal carries."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

USER_HI = [{"role": "user", "content": "Hi"}]


def mock_say(text: str) -> str:
    """A prompt that makes ``mock_chat`` answer ``text`` (its percent-encoded directive)."""
    return f"[mock:say={quote(text, safe='')}]"


def chat_body(**fields: Any) -> dict[str, Any]:
    """A valid chat request for ``fake-chat``; ``fields`` add or replace parameters."""
    return {"model": "fake-chat", "messages": USER_HI, **fields}


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (``[DONE]`` included)."""
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), f"not an SSE data event: {block!r}"
            events.append(block.removeprefix("data: "))
    return events


def sse_json(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body, checking that it ends with exactly one ``[DONE]``."""
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    assert "[DONE]" not in events[:-1]
    return [json.loads(e) for e in events[:-1]]


def response_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a Responses stream (``event:`` + ``data:`` blocks, no [DONE])."""
    events = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}"
        events.append(payload)
    return events


def assert_openai_error(response: httpx.Response, status: int, **fields: Any) -> dict[str, Any]:
    """Checks the status and the OpenAI error body; ``fields`` are expected error fields."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    for key, value in fields.items():
        assert error[key] == value, f"error.{key}: {error[key]!r} != {value!r} ({error})"
    return error
