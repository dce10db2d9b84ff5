"""Per-key limits (RPM, TPM, concurrency) held in Redis, their headers, and usage."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest
from redis import exceptions as redis_errors

from gateway.backend.fake import FakeBackend
from gateway.errors import RateLimitError
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.admission import Gatekeeper
from gateway.state.keys import KeyCreate, KeyStore
from gateway.state.limits import Limits, duration
from gateway.state.redis import connect
from tests.support.audio import tone_file
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import REPLY, bearer, make_settings, new_key, sdk, serve
from tests.support.redis_server import redis_server

# Waits out rate-limit windows: handed out with the long groups (tests/conftest.py).
pytestmark = pytest.mark.long

CHAT = "/v1/chat/completions"


async def test_requests_per_minute_with_openai_headers_then_429(http: httpx.AsyncClient) -> None:
    key = (await new_key(http, rpm=3))["key"]
    remaining = []
    for _ in range(3):
        response = await http.post(CHAT, json=chat_body(), headers=bearer(key))
        assert response.status_code == 200, response.text
        assert response.headers["x-ratelimit-limit-requests"] == "3"
        assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    refused = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    error = assert_openai_error(refused, 429, code="rate_limit_exceeded", type="requests")
    assert "requests per minute" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_the_sdk_raises_rate_limit_error(http: httpx.AsyncClient) -> None:
    client = sdk(http, (await new_key(http, rpm=1))["key"])
    await client.chat.completions.create(**chat_body())
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**chat_body())
    assert caught.value.code == "rate_limit_exceeded"


async def test_limits_are_per_key(http: httpx.AsyncClient) -> None:
    first = (await new_key(http, rpm=1))["key"]
    second = (await new_key(http, rpm=1))["key"]
    assert (await http.post(CHAT, json=chat_body(), headers=bearer(first))).status_code == 200
    assert (await http.post(CHAT, json=chat_body(), headers=bearer(second))).status_code == 200
    assert (await http.post(CHAT, json=chat_body(), headers=bearer(first))).status_code == 429


async def test_concurrent_requests_never_exceed_the_rpm(http: httpx.AsyncClient) -> None:
    key = (await new_key(http, rpm=5))["key"]
    responses = await asyncio.gather(
        *(http.post(CHAT, json=chat_body(), headers=bearer(key)) for _ in range(12))
    )
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 7


async def test_tokens_are_reserved_at_admission_as_prompt_plus_n_times_max_tokens(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, tpm=300))["key"]
    refused = await http.post(CHAT, json=chat_body(n=4, max_tokens=100), headers=bearer(key))
    error = assert_openai_error(refused, 429, code="rate_limit_exceeded", type="tokens")
    assert "Request too large" in error["message"] and "limit 300" in error["message"]
    assert fake.calls == []  # refused before anything reached the model
    admitted = await http.post(CHAT, json=chat_body(n=2, max_tokens=100), headers=bearer(key))
    assert admitted.status_code == 200, admitted.text


async def test_a_reservation_holds_while_its_request_runs_and_settles_to_what_it_used(
    http: httpx.AsyncClient, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, tpm=300))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(20))
    fake.token_delay_s = 0.01
    body = chat_body(stream=True, max_tokens=200)
    async with stream_http.stream("POST", CHAT, json=body, headers=bearer(key)) as stream:
        assert stream.status_code == 200
        # 200 tokens are reserved for the running stream: another 200 do not fit.
        refused = await http.post(CHAT, json=chat_body(max_tokens=200), headers=bearer(key))
        error = assert_openai_error(refused, 429, type="tokens")
        assert "tokens per minute" in error["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        await stream.aread()
    # The stream used about 25 tokens, not 200: the window has room again.
    again = await http.post(CHAT, json=chat_body(max_tokens=200), headers=bearer(key))
    assert again.status_code == 200, again.text
    assert int(again.headers["x-ratelimit-remaining-tokens"]) > 200


async def test_without_max_tokens_a_request_generates_only_what_the_key_has_left(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, tpm=40))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(100))
    answer = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    assert answer.status_code == 200, answer.text
    granted = fake.calls[-1].options.max_tokens
    assert granted is not None and 0 < granted < 40  # not the model's default of ~2000
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    # The window is full now: the next request is refused until it frees.
    refused = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    assert_openai_error(refused, 429, type="tokens")


async def test_reservations_are_exact_across_concurrent_requests(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, tpm=1000))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(30))
    fake.token_delay_s = 0.01  # every request still runs when the last one is admitted
    body = chat_body(max_tokens=300, stream=True)
    responses = await asyncio.gather(
        *(http.post(CHAT, json=body, headers=bearer(key)) for _ in range(8))
    )
    assert sorted(r.status_code for r in responses) == [200] * 3 + [429] * 5


async def test_streamed_tokens_count_too(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    key = (await new_key(http, tpm=40))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(100))
    streamed = await http.post(CHAT, json=chat_body(stream=True), headers=bearer(key))
    assert streamed.status_code == 200
    refused = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    assert_openai_error(refused, 429, type="tokens")


async def test_concurrency_limit_holds_while_a_stream_runs_and_frees_after(
    http: httpx.AsyncClient, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, max_concurrency=1))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(30))
    fake.token_delay_s = 0.01
    async with stream_http.stream(
        "POST", CHAT, json=chat_body(stream=True), headers=bearer(key)
    ) as stream:
        assert stream.status_code == 200
        refused = await http.post(CHAT, json=chat_body(), headers=bearer(key))
        error = assert_openai_error(refused, 429, code="rate_limit_exceeded")
        assert "concurrent" in error["message"]
        await stream.aread()
    # The finished stream released its slot.
    assert (await http.post(CHAT, json=chat_body(), headers=bearer(key))).status_code == 200


async def test_a_client_leaving_a_stream_frees_its_slot(
    http: httpx.AsyncClient, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, max_concurrency=1))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(50))
    fake.token_delay_s = 0.01
    async with stream_http.stream(
        "POST", CHAT, json=chat_body(stream=True), headers=bearer(key)
    ) as stream:
        async for line in stream.aiter_lines():
            if '"content":"w' in line:
                break
    assert fake.calls[-1].cancelled
    assert (await http.post(CHAT, json=chat_body(), headers=bearer(key))).status_code == 200


async def test_keys_without_limits_get_no_ratelimit_headers(http: httpx.AsyncClient) -> None:
    key = (await new_key(http))["key"]
    response = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    assert response.status_code == 200
    assert not [h for h in response.headers if h.startswith("x-ratelimit")]


async def test_usage_is_recorded_per_key(http: httpx.AsyncClient) -> None:
    created = await new_key(http)
    client = sdk(http, created["key"])
    completion = await client.chat.completions.create(**chat_body())
    streamed = await client.chat.completions.create(
        **chat_body(stream=True, stream_options={"include_usage": True})
    )
    usages = [chunk.usage async for chunk in streamed if chunk.usage]
    stream_usage = usages[0]
    await client.audio.speech.create(model="fake-tts", voice="alloy", input="One. Two.")
    await client.audio.transcriptions.create(model="fake-stt", file=("a.wav", tone_file(2.5)))
    usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
    assert completion.usage is not None
    assert usage["requests"] == 4
    assert usage["prompt_tokens"] == completion.usage.prompt_tokens + stream_usage.prompt_tokens
    assert usage["completion_tokens"] == 2 * len(REPLY.split())
    assert usage["audio_seconds_out"] == pytest.approx(1.0, abs=0.01)  # two 0.5 s sentences
    assert usage["audio_seconds_in"] == pytest.approx(2.5, abs=0.01)
    assert_openai_error(await http.get("/admin/keys/nope/usage"), 404)


async def test_redis_down_fails_fast_with_503_lets_nothing_in_and_recovers(
    tmp_path: Path,
) -> None:
    own = redis_server(tmp_path)
    try:
        # Not waiting for a Redis coming back (tests/unit/test_outages.py waits).
        settings = make_settings(redis_url=own.url, redis_timeout_s=0.5, backend_wait_s=0)
        async with serve(settings) as (_, http, _s):
            key = (await new_key(http, rpm=100))["key"]
            assert (await http.post(CHAT, json=chat_body(), headers=bearer(key))).status_code == 200
            own.stop()
            started = time.monotonic()
            for response in (
                await http.get("/v1/models", headers=bearer(key)),
                await http.post(CHAT, json=chat_body(), headers=bearer(key)),
            ):
                assert_openai_error(response, 503, code="store_unavailable", type="server_error")
            assert time.monotonic() - started < 2
            assert_openai_error(await http.get("/health/ready"), 503, code="store_unavailable")
            # The bootstrap admin key needs no Redis: the operator still sees the models.
            assert (await http.get("/admin/models")).status_code == 200
            assert_openai_error(await http.get("/admin/keys"), 503, code="store_unavailable")
            own.start()
            response = await http.post(CHAT, json=chat_body(), headers=bearer(key))
            assert response.status_code == 200, response.text
            assert (await http.get("/health/ready")).status_code == 200
    finally:
        own.stop()


async def test_more_requests_than_redis_connections_wait_for_one_and_are_all_counted() -> None:
    # Two connections for 40 requests at once, each admitted, reserved and settled in Redis:
    # the pool makes them wait their turn (redis-py's default pool refuses at once).
    async with serve(make_settings(redis_max_connections=2)) as (app, http, _s):
        key = (await new_key(http, rpm=100, tpm=100_000))["key"]
        answers = await asyncio.gather(
            *(http.post(CHAT, json=chat_body(), headers=bearer(key)) for _ in range(40))
        )
        assert [a.status_code for a in answers] == [200] * 40, answers[0].text
        created = (await http.get("/admin/keys")).json()["data"][0]
        usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
        assert usage["requests"] == 40
        assert usage["completion_tokens"] == 40 * len(REPLY.split())
        assert app.state.services.redis.connection_pool.max_connections == 2


async def test_a_full_redis_pool_waits_for_a_connection_then_refuses(
    redis_server: EmbeddedRedis,
) -> None:
    redis = connect(redis_server.url, 0.3, 1)
    pool = redis.connection_pool
    try:
        held = await pool.get_connection()
        started = time.monotonic()
        with pytest.raises(redis_errors.MaxConnectionsError):
            await redis.get("x")  # waited GATEWAY_REDIS_TIMEOUT_S for a connection
        assert 0.25 <= time.monotonic() - started < 1.0
        # Two commands wait; the first is cancelled once woken: the second gets the connection.
        first = asyncio.create_task(redis.set("x", "1"))
        second = asyncio.create_task(redis.set("x", "2"))
        await asyncio.sleep(0.05)
        assert not first.done() and not second.done()
        await pool.release(held)
        first.cancel()
        assert await second is True
        assert await redis.get("x") == "2"
    finally:
        await redis.aclose()


def test_reset_durations_read_like_openais() -> None:
    assert [duration(s) for s in (0, 0.2, 17, 59.5, 60, 61, 3600)] == [
        "0s", "1s", "17s", "1m0s", "1m0s", "1m1s", "60m0s",
    ]  # fmt: skip


async def test_a_long_request_keeps_its_concurrency_slot(redis_server: EmbeddedRedis) -> None:
    # Leases of 0.6 s, renewed every 0.2 s: the request outlives several of them, and the
    # lease set itself (which expires a second after a lease) must outlive them too.
    redis = connect(redis_server.url, 1.0, 8)
    gatekeeper = Gatekeeper(redis, Limits(redis), lease_s=0.6)
    key = (await KeyStore(redis).create(KeyCreate(name="long", max_concurrency=1))).key
    try:
        running = await gatekeeper.admit(key)
        await asyncio.sleep(2.5)
        with pytest.raises(RateLimitError):
            await gatekeeper.admit(key)
        await gatekeeper.finish(running)
        await gatekeeper.finish(await gatekeeper.admit(key))
    finally:
        await redis.aclose()


async def test_two_reservations_of_one_request_settle_to_exactly_what_it_used(
    redis_server: EmbeddedRedis,
) -> None:
    # A strict tool call generated again reserves a second time, maybe in another second.
    redis = connect(redis_server.url, 1.0, 8)
    gatekeeper = Gatekeeper(redis, Limits(redis), lease_s=60)
    key = (await KeyStore(redis).create(KeyCreate(name="twice", tpm=1000))).key
    try:
        other = await gatekeeper.admit(key)
        assert await other.meter.reserve(10, 90, 1, False) == 90  # another request: 100
        admission = await gatekeeper.admit(key)
        await admission.meter.reserve(20, 200, 1, False)  # 220
        await asyncio.sleep(1.1)
        await admission.meter.reserve(30, 100, 1, True)  # 130, a second later
        admission.meter.add_tokens(20, 55)  # used 75 of the 350 reserved
        await gatekeeper.finish(admission)
        buckets = await redis.hgetall(f"gw:rl:{{{admission.key.id}}}:tokens")
        # The other request's reservation is untouched; this one's counts what it used.
        assert sum(int(v) for v in buckets.values()) == 100 + 75
    finally:
        await redis.aclose()
