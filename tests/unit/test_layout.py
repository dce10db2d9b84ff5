"""Data written by a gateway before the key layout of Redis Cluster support (``gw:key:<id>``
without a hash tag) is moved once, when a gateway starts: existing keys keep working, with
their usage and their rate-limit windows."""

from __future__ import annotations

import redis

from gateway.stack.redis_server import EmbeddedRedis
from tests.support.bodies import chat_body
from tests.support.inprocess import AUTH, bearer, make_settings, serve


def _to_layout_1(client: redis.Redis) -> list[str]:
    """Renames layout-2 names back to what an older gateway wrote; returns the old names."""
    old = []
    for name in client.scan_iter(match="gw:*{*}*"):
        text = name.decode()
        if text.split(":")[1] not in {"key", "usage", "rl"}:
            continue  # written since (spend, budgets): an older gateway had none
        client.rename(name, text.replace("{", "").replace("}", ""))
        old.append(text.replace("{", "").replace("}", ""))
    client.delete("gw:layout")
    return sorted(old)


async def test_an_older_gateways_keys_work_after_the_upgrade_with_usage_and_limits(
    redis_server: EmbeddedRedis,
) -> None:
    async with serve(make_settings()) as (_, http, _sdk):
        created = (
            await http.post("/admin/keys", json={"name": "old", "rpm": 3}, headers=AUTH)
        ).json()
        key, key_id = created["key"], created["id"]
        for _ in range(2):
            assert (
                await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key))
            ).status_code == 200
    with redis.Redis.from_url(redis_server.url) as client:
        old = _to_layout_1(client)
        assert f"gw:key:{key_id}" in old and f"gw:usage:{key_id}" in old
        assert f"gw:rl:{key_id}:requests" in old
    async with serve(make_settings()) as (_, http, _sdk):
        # The key still works, and its window still holds the two earlier requests.
        served = await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key))
        assert served.status_code == 200, served.text
        assert served.headers["x-ratelimit-remaining-requests"] == "0"
        refused = await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key))
        assert refused.status_code == 429
        usage = (await http.get(f"/admin/keys/{key_id}/usage", headers=AUTH)).json()
        assert usage["requests"] == 3
        assert key_id in [
            k["id"] for k in (await http.get("/admin/keys", headers=AUTH)).json()["data"]
        ]
    with redis.Redis.from_url(redis_server.url) as client:
        assert not any(client.exists(name) for name in old)  # moved, not copied
        assert client.get("gw:layout") == b"2"
