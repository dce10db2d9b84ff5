"""A hostile request body is refused before the gateway builds anything from it (docs/limits.md):
JSON nested too deep, too many objects or values, too many messages, content parts or tools'
bytes; and a refused body is read to its end before the answer, so that nginx, still
sending it, sees no reset."""

from __future__ import annotations

import json
import tracemalloc

import httpx
import pytest
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from gateway.serving.json_shape import JsonLimits, json_shape, lone_surrogate
from tests.support.asgi import asgi_scope
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import BASE_URL, make_settings, serve


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", '{"model": "fake-chat", "messages": ' + deep(5000) + "}"),
        ("/v1/embeddings", '{"model": "fake-chat", "input": ' + deep(100_000) + "}"),
        (
            "/v1/responses",
            '{"model": "fake-chat", "input": "hi", "metadata": {"a": ' + deep(200) + "}}",
        ),
        ("/admin/keys", '{"name": "k", "models": ' + deep(3000) + "}"),
    ],
    ids=["chat", "embeddings", "responses", "admin"],
)
async def test_deep_json_is_a_400_naming_the_limit_on_every_route(
    http: httpx.AsyncClient, fake: FakeBackend, path: str, body: str
) -> None:
    refused = await http.post(path, content=body, headers={"content-type": "application/json"})
    error = assert_openai_error(refused, 400, code="json_too_deep")
    assert "GATEWAY_MAX_JSON_DEPTH" in error["message"] and "128" in error["message"]
    assert fake.calls == []


async def test_the_depth_bound_is_a_setting_and_a_body_within_it_is_served(
    fake: FakeBackend,
) -> None:
    body = chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    async with serve(make_settings(max_json_depth=8), fake) as (_, http, _sdk):
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        deeper = chat_body(messages=[{"role": "user", "content": [[[[[[[["x"]]]]]]]]}])
        assert_openai_error(
            await http.post("/v1/chat/completions", json=deeper), 400, code="json_too_deep"
        )


async def test_a_million_messages_are_refused_before_they_are_parsed(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = json.dumps(chat_body(messages=[{"role": "user", "content": "a"}] * 1_000_000))
    tracemalloc.start()
    try:
        refused = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = assert_openai_error(refused, 400, code="json_too_complex")
    assert "GATEWAY_MAX_JSON_CONTAINERS" in error["message"]
    # Parsed, a million dicts alone are hundreds of MB; refused unparsed, what the gateway
    # allocated is the body's bytes (held by the client and the app) and little more.
    assert peak < 4 * len(body), peak
    assert fake.calls == []


async def test_token_arrays_count_as_values_not_containers(fake: FakeBackend) -> None:
    settings = make_settings(max_json_values=10_000)
    async with serve(settings, fake) as (_, http, _sdk):
        fits = await http.post(
            "/v1/embeddings", json={"model": "fake-chat", "input": [[1, 2, 3]] * 100}
        )
        assert fits.status_code != 400 or fits.json()["error"]["code"] != "json_too_complex"
        refused = await http.post(
            "/v1/embeddings", json={"model": "fake-chat", "input": [[7] * 20_000]}
        )
        error = assert_openai_error(refused, 400, code="json_too_complex")
        assert "GATEWAY_MAX_JSON_VALUES" in error["message"]


async def test_messages_parts_and_tools_are_bounded_by_settings(fake: FakeBackend) -> None:
    settings = make_settings(max_messages=4, max_content_parts=3, max_tools_kb=2)
    text = {"type": "text", "text": "hi"}
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 1000}}
    async with serve(settings, fake) as (_, http, _sdk):
        ok = chat_body(messages=[{"role": "user", "content": "hi"}] * 4)
        assert (await http.post("/v1/chat/completions", json=ok)).status_code == 200
        many = chat_body(messages=[{"role": "user", "content": "hi"}] * 5)
        error = assert_openai_error(
            await http.post("/v1/chat/completions", json=many), 400, code="too_many_messages"
        )
        assert error["param"] == "messages" and "GATEWAY_MAX_MESSAGES" in error["message"]
        parts = chat_body(messages=[{"role": "user", "content": [text, text]}] * 2)
        assert_openai_error(
            await http.post("/v1/chat/completions", json=parts), 400, code="too_many_content_parts"
        )
        tools = chat_body(tools=[tool, tool, tool])
        error = assert_openai_error(
            await http.post("/v1/chat/completions", json=tools), 400, code="tools_too_large"
        )
        assert error["param"] == "tools"
        # A Responses request is held to the same bounds, named as it names them.
        items = [{"role": "user", "content": "hi"}] * 5
        error = assert_openai_error(
            await http.post("/v1/responses", json={"model": "fake-chat", "input": items}),
            400,
            code="too_many_messages",
        )
        assert error["param"] == "input"
        assert len(fake.calls) == 1  # the one within every bound


def test_json_shape_counts_only_what_is_outside_strings() -> None:
    text = json.dumps({"a": ['{[,\\"', {"b": [1, 2, {"c": "]]]}}}"}]}], "d": "\\\\"})
    shape = json_shape(text)
    assert (shape.depth, shape.containers) == (5, 5)
    assert JsonLimits(4, 100, 100).exceeded(shape) == "depth"
    assert JsonLimits(8, 4, 100).exceeded(shape) == "containers"
    assert JsonLimits(8, 100, 5).exceeded(shape) == "values"


async def test_a_refused_body_is_read_to_its_end_before_the_answer(app: FastAPI) -> None:
    # 5 MB with a wrong key: refused without being parsed, but read to its end (and
    # dropped), so a proxy still sending it is not reset; the connection stays usable.
    size, piece = 5_000_000, 100_000
    request = httpx.Request(
        "POST",
        f"{BASE_URL}/v1/chat/completions",
        headers={
            "content-type": "application/json",
            "content-length": str(size),
            "authorization": "Bearer sk-gw-0123456789ab-wrong",
        },
    )
    read = 0
    answered_at: int | None = None

    async def receive() -> dict[str, object]:
        nonlocal read
        read += piece
        return {"type": "http.request", "body": b" " * piece, "more_body": read < size}

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        nonlocal answered_at
        if answered_at is None:
            answered_at = read
        sent.append(message)

    await app(asgi_scope(request), receive, send)
    assert sent[0]["status"] == 401
    assert answered_at == size  # the whole body was read before the answer began
    assert (b"connection", b"close") not in sent[0]["headers"]  # type: ignore[operator]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded+json",
        "application/vnd.api+json",
        "text/plain",
        "Application/JSON; charset=utf-8",
    ],
)
async def test_a_body_is_measured_whatever_type_it_claims(
    http: httpx.AsyncClient, fake: FakeBackend, content_type: str
) -> None:
    # FastAPI parses "+json" types (and more) as JSON: only a multipart upload is not
    # measured, so no content type walks around the measure.
    body = json.dumps(chat_body(messages=[{"role": "user", "content": "a"}] * 40_000))
    refused = await http.post(
        "/v1/chat/completions", content=body, headers={"content-type": content_type}
    )
    assert_openai_error(refused, 400, code="json_too_complex")
    assert fake.calls == []


async def test_bytes_that_are_no_text_are_a_400_not_a_500(http: httpx.AsyncClient) -> None:
    # The first bytes say UTF-16 and the rest is no UTF-16 at all.
    refused = await http.post(
        "/v1/chat/completions",
        content=b"\xff\xfe[\x00\x00",
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 400, refused.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": "Hi \\ud800 there"}]),
        ),
        (
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": "a lone low half \\udfff"}]),
        ),
        (
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": "halves reversed \\udc00\\ud800"}]),
        ),
        (
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": "Hi \\ud800"}], stream=True),
        ),
        (
            "/v1/messages",
            {
                "model": "fake-chat",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "\\uD83D"}],
            },
        ),
        ("/v1/embeddings", {"model": "fake-chat", "input": "a \\udc00"}),
        ("/v1/responses", {"model": "fake-chat", "input": "a \\udbff!"}),
    ],
)
async def test_a_lone_surrogate_is_a_400_not_a_500(
    http: httpx.AsyncClient, fake: FakeBackend, path: str, body: dict
) -> None:
    """Python's parser makes a string of a lone surrogate escape, which nothing can encode
    afterwards (the prompt for the engine, a stored record): it was a 500 on every route."""
    # The escapes are written into the JSON text as they come (json.dumps would escape
    # their backslashes).
    text = json.dumps(body).replace("\\\\u", "\\u")
    refused = await http.post(path, content=text, headers={"content-type": "application/json"})
    assert refused.status_code == 400, refused.text
    assert "surrogate" in refused.text
    assert fake.calls == []


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud83d\\ude00 a pair is one character"',
        '"\\\\ud800 is an escaped backslash and letters"',
        '"\\\\\\\\ud800 two of them"',
        '"\U0001f600 as UTF-8"',
        '"\\u00e9\\u4e2d"',
    ],
)
def test_pairs_and_escaped_backslashes_are_no_lone_surrogates(text: str) -> None:
    assert json.loads(text).encode("utf-8")  # the parser agrees: it encodes
    assert lone_surrogate(text.encode()) is None


@pytest.mark.parametrize(
    ("text", "at"),
    [
        (b'"ab\\ud800"', 3),
        (b'"\\\\\\ud800"', 3),  # an escaped backslash, then the escape
        (b'"\\ud800\\ud800"', 1),  # a high half followed by another high
        (b'"x\\ude00"', 2),
        (b'"x\xed\xa0\x80"', 2),  # the code point encoded as UTF-8 bytes
    ],
)
def test_lone_surrogates_are_found_where_they_are(text: bytes, at: int) -> None:
    assert lone_surrogate(text) == at


async def test_a_long_run_of_backslashes_is_read_once_not_once_per_backslash(
    http: httpx.AsyncClient,
) -> None:
    """Each run of backslashes was tried from each of its backslashes: a keyless 1 MB body
    of them held a replica for about an hour (the check runs before the key's). It is
    answered at once now, as any other body without a key."""
    text = '{"model": "fake-chat", "x": "' + "\\\\" * 400_000 + '\\u0041"}'
    assert lone_surrogate(text.encode()) is None
    answered = await http.post(
        "/v1/chat/completions",
        content=text,
        headers={"content-type": "application/json", "Authorization": ""},
    )
    assert answered.status_code == 401
