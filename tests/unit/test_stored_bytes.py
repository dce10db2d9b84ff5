"""Stored bytes per key and per project (``GATEWAY_STORED_MB_PER_KEY``,
``GATEWAY_STORED_MB_PER_PROJECT``) on a real Redis, as an attacker and a neighbour see them:
a key that fills its quota is refused (before anything is generated) while another key still
stores; what a key uses is exactly what its records take (replaced, deleted and expired
records included), shown in ``/v1/me``; concurrent requests cannot take more than the
quota with what they send."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state import stored_bytes
from gateway.state.item_index import entry_bytes
from gateway.state.redis import connect
from gateway.state.stored_bytes import MB, RECORD_OVERHEAD, StoredBytes, counter_keys
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import bearer, make_settings, new_key, serve

KEY_MB = 0.06  # 62,914 bytes: three 18 KB responses, not four
PROJECT_MB = 0.08
#: Stored twice (the input item and the chat message): about 18 KB per record.
BIG = "x" * 8000
CHAT = "/v1/chat/completions"


@pytest.fixture
def settings() -> Settings:
    return make_settings(stored_mb_per_key=KEY_MB, stored_mb_per_project=PROJECT_MB)


def records_of(server: EmbeddedRedis, owner: str) -> int:
    """What ``owner``'s records really take in Redis, as the quota counts them."""
    with redis.Redis.from_url(server.url) as client:
        patterns = (f"gw:response:{owner}:*", f"gw:session:{owner}:*", f"gw:audio:{{{owner}}}:*")
        names = [name for pattern in patterns for name in client.scan_iter(pattern)]
        records = sum(int(client.strlen(name)) + RECORD_OVERHEAD for name in names)
        # The index of stored responses' items (item_reference): an entry per response.
        prefix = f"gw:item:{owner}:"
        homes: dict[str, list[str]] = {}
        for name in client.scan_iter(f"{prefix}*"):
            homes.setdefault(client.get(name).decode(), []).append(name.decode()[len(prefix) :])
        index = sum(entry_bytes(owner, h, ids) + RECORD_OVERHEAD for h, ids in homes.items())
        return records + index


async def me(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await http.get("/v1/me", headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()["storage"]  # type: ignore[no-any-return]


async def store(http: httpx.AsyncClient, key: str, text: str = BIG) -> httpx.Response:
    body = {"model": "fake-chat", "input": text}
    return await http.post("/v1/responses", json=body, headers=bearer(key))


async def test_a_key_past_its_quota_is_refused_before_generating_while_another_stores(
    http: httpx.AsyncClient, fake: FakeBackend, redis_server: EmbeddedRedis
) -> None:
    a, b = await new_key(http, name="a"), await new_key(http, name="b")
    stored = []
    for _ in range(3):
        response = await store(http, a["key"])
        assert response.status_code == 200, response.text
        stored.append(response.json()["id"])
    generated = len(fake.calls)
    error = assert_openai_error(
        await store(http, a["key"]), 403, code="storage_quota_exceeded", param="store"
    )
    assert f"GATEWAY_STORED_MB_PER_KEY={KEY_MB} MB" in error["message"], error["message"]
    assert f"{int(KEY_MB * MB):,}" in error["message"]
    assert "store: false" in error["message"]
    assert len(fake.calls) == generated  # refused before the model was asked
    # Sessions are stored while there is room (a turn is the prompt the key pays for), then
    # refused as well.
    turn = chat_body(messages=[{"role": "user", "content": "z" * 3000}])
    for number in range(10):
        head = {**bearer(a["key"]), "X-Session-ID": f"s{number}"}
        session = await http.post(CHAT, json=turn, headers=head)
        if session.status_code != 200:
            break
    assert_openai_error(session, 403, code="storage_quota_exceeded", param="X-Session-ID")
    assert 0 < number < 5  # the room left held a few
    generated = len(fake.calls)
    assert_openai_error(await store(http, a["key"]), 403, code="storage_quota_exceeded")
    assert len(fake.calls) == generated
    # What it does not store still works.
    unstored = {"model": "fake-chat", "input": BIG, "store": False}
    assert (await http.post("/v1/responses", json=unstored, headers=bearer(a["key"]))).is_success

    # Another key stores responses and sessions as before.
    assert (await store(http, b["key"])).status_code == 200
    chat = await http.post(
        CHAT, json=chat_body(), headers={**bearer(b["key"]), "X-Session-ID": "s"}
    )
    assert chat.status_code == 200, chat.text

    # /v1/me shows exactly what the records take, and the quota.
    used = await me(http, a["key"])
    quota = int(KEY_MB * MB)
    assert used == {"key": {"used_bytes": records_of(redis_server, a["id"]), "quota_bytes": quota}}
    # Past the quota by at most the last session turn, which found room left.
    assert quota <= used["key"]["used_bytes"] < quota + 2 * 3000 + RECORD_OVERHEAD
    assert (await me(http, b["key"]))["key"]["used_bytes"] == records_of(redis_server, b["id"])

    # Deleting gives the bytes back at once: the key stores again.
    before = used["key"]["used_bytes"]
    for response_id in stored[:2]:
        deleted = await http.delete(f"/v1/responses/{response_id}", headers=bearer(a["key"]))
        assert deleted.status_code == 200
        after = (await me(http, a["key"]))["key"]["used_bytes"]
        assert after == records_of(redis_server, a["id"]) < before
        before = after
    assert (await store(http, a["key"])).status_code == 200
    # Another key deleting A's response (a 404, as an unknown id) frees nothing.
    foreign = await http.delete(f"/v1/responses/{stored[2]}", headers=bearer(b["key"]))
    assert foreign.status_code == 404
    assert (await me(http, a["key"]))["key"]["used_bytes"] == records_of(redis_server, a["id"])


async def test_a_project_quota_holds_its_keys_together(http: httpx.AsyncClient) -> None:
    made = await http.post("/admin/projects", json={"id": "team"})
    assert made.status_code == 201, made.text
    first, second = [await new_key(http, name=n, project="team") for n in ("1", "2")]
    outsider = await new_key(http, name="3")
    # 0.08 MB: four 18 KB records of the two keys together (each key's own quota: three).
    for key in (first, first, second, second):
        assert (await store(http, key["key"])).status_code == 200
    error = assert_openai_error(await store(http, second["key"]), 403)
    assert error["code"] == "storage_quota_exceeded"
    assert (
        "project 'team'" in error["message"] and "GATEWAY_STORED_MB_PER_PROJECT" in error["message"]
    )
    assert (await store(http, outsider["key"])).status_code == 200
    shown = await me(http, first["key"])
    assert shown["project"]["id"] == "team"
    assert shown["project"]["quota_bytes"] == int(PROJECT_MB * MB)
    own = [(await me(http, key["key"]))["key"]["used_bytes"] for key in (first, second)]
    assert shown["project"]["used_bytes"] == sum(own)
    # The refused key's hold on its own quota was given back.
    # (two records with their items' index entries, not a third held)
    assert (await me(http, second["key"]))["key"]["used_bytes"] < 2.5 * 18_000


async def test_a_session_counts_its_latest_size_and_gives_it_back_when_deleted(
    http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    key = await new_key(http)
    head = {**bearer(key["key"]), "X-Session-ID": "grows"}
    sizes = []
    for turn in range(3):
        body = chat_body(messages=[{"role": "user", "content": f"turn {turn} " + "y" * 200}])
        assert (await http.post(CHAT, json=body, headers=head)).status_code == 200
        sizes.append((await me(http, key["key"]))["key"]["used_bytes"])
        assert sizes[-1] == records_of(redis_server, key["id"])  # replaced, not added
    assert sizes[0] < sizes[1] < sizes[2]
    assert (await http.delete("/v1/sessions/grows", headers=head)).status_code == 200
    assert (await me(http, key["key"]))["key"]["used_bytes"] == 0


async def test_a_spoken_answers_transcript_counts_even_past_the_quota(
    redis_server: EmbeddedRedis,
) -> None:
    settings = make_settings(models=["fake-chat", "fake-tts", "fake-stt"], stored_mb_per_key=0.001)
    spoken = chat_body(modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
    async with serve(settings) as (_, http, _sdk):
        key = await new_key(http)
        for _ in range(2):  # the second is past the 1 KB quota: paid for and heard, kept
            answer = await http.post(CHAT, json=spoken, headers=bearer(key["key"]))
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["audio"]["id"]
        used = (await me(http, key["key"]))["key"]["used_bytes"]
    assert used == records_of(redis_server, key["id"]) > 2 * RECORD_OVERHEAD


async def test_concurrent_requests_cannot_take_more_than_the_quota_with_what_they_send(
    http: httpx.AsyncClient, fake: FakeBackend, redis_server: EmbeddedRedis
) -> None:
    key = await new_key(http)
    fake.token_delay_s = 0.02  # every request holds its room while the others arrive
    answers = await asyncio.gather(*(store(http, key["key"]) for _ in range(12)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 3 + [403] * 9, codes
    used = (await me(http, key["key"]))["key"]["used_bytes"]
    assert used == records_of(redis_server, key["id"]) <= KEY_MB * MB


async def test_a_failed_or_abandoned_response_gives_its_room_back(
    http: httpx.AsyncClient, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = await new_key(http)
    body = {"model": "fake-chat", "input": BIG}
    fake.fail_after_tokens = 0  # before the first token: an error status
    for stream in (False, True):
        failed = await http.post(
            "/v1/responses", json={**body, "stream": stream}, headers=bearer(key["key"])
        )
        assert failed.status_code >= 500, failed.text
    fake.fail_after_tokens = 1  # after it: response.failed in the stream
    streamed = await http.post(
        "/v1/responses", json={**body, "stream": True}, headers=bearer(key["key"])
    )
    assert "response.failed" in streamed.text
    fake.fail_after_tokens = None
    fake.reply = " ".join(f"w{i}" for i in range(50))
    fake.token_delay_s = 0.01
    async with stream_http.stream(
        "POST", "/v1/responses", json={**body, "stream": True}, headers=bearer(key["key"])
    ) as response:
        async for line in response.aiter_lines():
            if '"delta": "w' in line:
                break  # the client goes away
    assert fake.calls[-1].cancelled
    assert (await me(http, key["key"]))["key"]["used_bytes"] == 0
    fake.token_delay_s = 0.0
    for _ in range(3):  # the whole quota is there
        assert (await store(http, key["key"])).status_code == 200


async def test_expired_records_and_holds_stop_counting(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = connect(redis_server.url, 1.0, 8)
    quota = StoredBytes(client, per_key_mb=1.0)
    monkeypatch.setattr(stored_bytes, "HOLD_S", 0.05)
    monkeypatch.setattr(stored_bytes, "TRIM_PER_RUN", 2)  # ended entries go in several runs
    try:
        for index in range(5):
            await quota.put("k", f"audio:{index}", 10, 0.05, None)
        await quota.put("k", "response:one", 1000, 0.05, None)
        await quota.put("k", "response:two", 2000, 60, None)
        await quota.hold("k", "response:three", 3000, "store", "send store: false")
        used = (await quota.usage("k", None))["key"]["used_bytes"]
        assert used == 5 * 10 + 6000 + 8 * RECORD_OVERHEAD
        await asyncio.sleep(0.15)  # "one" and the hold have ended; nothing deleted them
        assert (await quota.usage("k", None))["key"]["used_bytes"] == 2000 + RECORD_OVERHEAD
        # Once the last one is gone, nothing of the key's accounting is left in Redis.
        await quota.drop("k", "response:two")
        assert await client.keys("gw:stored:*") == []
    finally:
        await client.aclose()


@pytest.mark.parametrize(("scope", "name"), [("key", "0123456789ab"), ("project", "team")])
def test_each_scopes_counters_share_one_cluster_slot(scope: str, name: str) -> None:
    # One script run touches both: in a Redis Cluster they must hash to one slot (a
    # session's run on a real Cluster: tests/unit/test_redis_cluster.py).
    ends, sizes = counter_keys(scope, name)
    assert key_slot(ends.encode()) == key_slot(sizes.encode())
    assert f"{{{name}}}" in ends
