"""The Lua scripts of ``gateway/state/lua/`` as the loader gives them to Redis: each one
complete (its includes expanded) and accepted by Redis, so a broken file fails here rather
than on the first request that runs it."""

from __future__ import annotations

import importlib.resources

import pytest
from redis.asyncio import Redis

from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.budgets import HISTORY_DAYS
from gateway.state.scripts import register, source

NAMES = sorted(
    entry.name.removesuffix(".lua")
    for entry in importlib.resources.files("gateway.state").joinpath("lua").iterdir()
    if entry.name.endswith(".lua")
)
#: The constants the loader sets in a script (as budgets.py does).
CONSTANTS = {
    "budget_settle": {"HISTORY_S": HISTORY_DAYS * 86400},
    "finish_and_settle": {"HISTORY_S": HISTORY_DAYS * 86400},
}


def test_every_script_of_the_package_is_found() -> None:
    assert {"admit", "budget_reserve", "finish_and_settle", "stored_bytes"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
async def test_redis_compiles_each_script_with_its_includes(
    name: str, redis_server: EmbeddedRedis
) -> None:
    assert "--! include" not in source(name)
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        script = register(redis, name, **CONSTANTS.get(name, {}))
        assert await redis.script_load(script.script) == script.sha  # compiled, or an error
    finally:
        await redis.aclose()


def test_a_constant_the_script_does_not_use_is_refused() -> None:
    redis = Redis()  # never connected: registering sends nothing
    with pytest.raises(ValueError, match="HISTORY_S"):
        register(redis, "admit", HISTORY_S=1)
