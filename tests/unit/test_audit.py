"""The admin audit log: every admin action (who, when, what, from where) in a Redis
stream, ``GET /admin/audit``, retention, and an action refused when it cannot be recorded."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway import cli
from gateway.backend.fake import FakeBackend
from gateway.errors import StoreFullError
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.audit import STREAM, Actor, AuditLog
from gateway.state.redis import connect
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import bearer, make_settings, new_key, serve
from tests.support.redis_server import redis_server

BOOTSTRAP = {"id": "admin", "name": "GATEWAY_ADMIN_KEY"}


async def audit(http: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    response = await http.get("/admin/audit", params=params)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def brief(entries: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return [(e["action"], e["stage"], e["target"]) for e in entries]


async def test_key_and_model_actions_are_recorded_with_who_when_and_from_where(
    http: httpx.AsyncClient,
) -> None:
    started = time.time()
    created = (
        await http.post(
            "/admin/keys",
            json={"name": "ops", "role": "admin", "rpm": 5},
            headers={"X-Request-ID": "req-create-1"},
        )
    ).json()
    ops = bearer(created["key"])
    assert (await http.post("/admin/models/fake-chat/unload", headers=ops)).status_code == 200
    assert (await http.post("/admin/models/fake-chat/load", headers=ops)).status_code == 200
    assert (await http.delete(f"/admin/keys/{created['id']}")).status_code == 200

    page = await audit(http)
    entries = page["data"]
    assert brief(entries) == [  # newest first
        ("key.revoke", "completed", created["id"]),
        ("key.revoke", "requested", created["id"]),
        ("model.load", "completed", "fake-chat"),
        ("model.load", "requested", "fake-chat"),
        ("model.unload", "completed", "fake-chat"),
        ("model.unload", "requested", "fake-chat"),
        ("key.create", "completed", created["id"]),
        ("key.create", "requested", None),
    ]
    assert page["has_more"] is False
    assert page["first_id"] == entries[0]["id"] and page["last_id"] == entries[-1]["id"]
    # Who: the bootstrap key, or the admin key the action was made with (never a secret).
    assert [e["actor"] for e in entries[:2]] == [BOOTSTRAP] * 2
    assert {e["actor"]["id"] for e in entries[2:6]} == {created["id"]}
    assert {e["actor"]["name"] for e in entries[2:6]} == {"ops"}
    assert created["key"] not in str(page)
    # What was asked for, and the request id that ties both stages to nginx's log.
    assert entries[-1]["details"] == {"name": "ops", "role": "admin", "rpm": 5}
    assert {e["request_id"] for e in entries[-2:]} == {"req-create-1"}
    # When and from where.
    assert all(started - 1 <= e["time"] <= time.time() + 1 for e in entries)
    assert {e["client"] for e in entries} == {"127.0.0.1"}


async def test_a_failed_action_is_recorded_with_its_error(http: httpx.AsyncClient) -> None:
    # A client's own X-Forwarded-For is not taken for its address (only the server's view,
    # where uvicorn trusts the proxies FORWARDED_ALLOW_IPS names).
    spoofed = {"X-Forwarded-For": "203.0.113.9"}
    response = await http.delete("/admin/keys/nope", headers=spoofed)
    assert_openai_error(response, 404, code="key_not_found")
    assert_openai_error(await http.post("/admin/models/nope/load"), 404)
    entries = (await audit(http))["data"]
    assert brief(entries) == [
        ("model.load", "failed", "nope"),
        ("model.load", "requested", "nope"),
        ("key.revoke", "failed", "nope"),
        ("key.revoke", "requested", "nope"),
    ]
    assert entries[2]["details"] == {"status": 404, "code": "key_not_found"}
    assert {e["client"] for e in entries} == {"127.0.0.1"}
    assert entries[0]["details"]["status"] == 404


async def test_reading_is_not_an_action_and_users_may_not_read_the_log(
    http: httpx.AsyncClient,
) -> None:
    user = await new_key(http)
    await http.get("/admin/keys")
    await http.get("/admin/models")
    assert brief((await audit(http))["data"]) == [
        ("key.create", "completed", user["id"]),
        ("key.create", "requested", None),
    ]
    denied = await http.get("/admin/audit", headers=bearer(user["key"]))
    assert_openai_error(denied, 403)


async def test_pages_follow_after_and_are_bounded(http: httpx.AsyncClient) -> None:
    for _ in range(3):
        await http.post("/admin/models/fake-chat/load")
    first = await audit(http, limit=4)
    assert len(first["data"]) == 4 and first["has_more"] is True
    rest = await audit(http, limit=4, after=first["last_id"])
    assert len(rest["data"]) == 2 and rest["has_more"] is False
    ids = [e["id"] for e in first["data"] + rest["data"]]
    assert (
        len(set(ids)) == 6 and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))[::-1]
    )
    for bad in ({"limit": 0}, {"limit": 1001}):
        assert_openai_error(await http.get("/admin/audit", params=bad), 400, param="limit")
    for cursor in ("nope", "99999999999999999999-0"):  # the second: past Redis's 64 bits
        bad_cursor = await http.get("/admin/audit", params={"after": cursor})
        assert_openai_error(bad_cursor, 400, param="after")
    first = await http.get("/admin/audit", params={"after": "0-0"})
    assert first.status_code == 200 and first.json()["data"] == []


async def test_retention_drops_entries_by_age_and_bounds_their_count(
    redis_server: EmbeddedRedis,
) -> None:
    client = connect(redis_server.url, 1.0, 4)
    log = AuditLog(client, retention_days=1, max_entries=100)
    who = Actor(id="admin", name="GATEWAY_ADMIN_KEY")
    try:
        two_days_ago = int((time.time() - 2 * 86_400) * 1000)
        await log.append(who, "model.load", "requested", target="old")
        entry = (await client.xrange(STREAM))[0][1]
        await client.delete(STREAM)
        await client.xadd(STREAM, entry, id=f"{two_days_ago}-0")  # as if written then
        # Past its age an entry is never shown, and the next write removes it.
        assert (await log.page())[0] == []
        await log.append(who, "model.load", "requested", target="today")
        assert [e.target for e in (await log.page())[0]] == ["today"]
        assert await client.xlen(STREAM) == 1
        for _ in range(450):
            await log.append(who, "model.unload", "completed", target="x")
        # MAXLEN ~ removes whole blocks of entries, so a little over the bound may stay.
        assert 100 <= await client.xlen(STREAM) < 250
    finally:
        await client.aclose()


async def test_an_action_that_cannot_be_recorded_does_not_happen(
    http: httpx.AsyncClient, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = await new_key(http, name="ops", role="admin")

    async def full(*args: Any, **kwargs: Any) -> str:
        raise StoreFullError("Redis is full.")

    monkeypatch.setattr(AuditLog, "append", full)  # Redis at its maxmemory, for writes
    response = await http.post("/admin/models/fake-chat/unload", headers=bearer(admin["key"]))
    assert_openai_error(response, 503, code="store_full")
    assert next(m for m in fake.model_list if m.name == "fake-chat").ready


async def test_the_bootstrap_key_manages_models_with_redis_down_and_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = redis_server(tmp_path)
    fake = FakeBackend()
    try:
        # No wait for a Redis coming back (GATEWAY_BACKEND_WAIT_S): down is down here.
        settings = make_settings(redis_url=own.url, redis_timeout_s=0.5, backend_wait_s=0)
        async with serve(settings, fake) as (_, http, _sdk):
            own.stop()
            # GATEWAY_ADMIN_KEY exists for this: no Redis needed to unload a model.
            response = await http.post("/admin/models/fake-chat/unload")
            assert response.status_code == 200, response.text
            assert not next(m for m in fake.model_list if m.name == "fake-chat").ready
            assert any(
                "model.unload fake-chat by admin" in r.getMessage()
                and "recorded here only" in r.getMessage()
                for r in caplog.records
            )
            own.start()
            assert (await http.post("/admin/models/fake-chat/load")).status_code == 200
            assert brief((await audit(http))["data"]) == [
                ("model.load", "completed", "fake-chat"),
                ("model.load", "requested", "fake-chat"),
            ]
    finally:
        own.stop()


def test_gateway_keys_on_the_command_line_is_recorded_as_the_cli_s(
    redis_server: EmbeddedRedis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_URL", redis_server.url)
    monkeypatch.setenv("GATEWAY_RUN_DIR", str(tmp_path))
    assert cli.main(["keys", "create", "--name", "ops", "--rpm", "9", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert cli.main(["keys", "revoke", created["id"]]) == 0
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as client:
        entries = [json.loads(fields["e"]) for _, fields in client.xrange(STREAM)]
    assert [(e["action"], e["stage"], e["target"]) for e in entries] == [
        ("key.create", "requested", None),
        ("key.create", "completed", created["id"]),
        ("key.revoke", "requested", created["id"]),
        ("key.revoke", "completed", created["id"]),
    ]
    assert {e["actor"]["id"] for e in entries} == {"cli"}
    assert entries[0]["actor"]["name"].startswith("gateway keys (")
    assert {e["client"] for e in entries} == {socket.gethostname()}
    assert entries[0]["details"] == {"name": "ops", "role": "user", "rpm": 9}
    assert created["key"] not in str(entries)
