"""Several Triton servers behind one backend (``gateway/backend/pool.py``), each server a
fake: requests spread over them, go around a server that is down or lacks the model, come
back to it when it is ready again; the model list is the union; load and unload reach all."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

import pytest

from gateway.backend.base import SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.backend.pool import BackendPool, is_pool, targets
from gateway.errors import BackendUnavailableError
from tests.support.bodies import chat_body
from tests.support.inprocess import REPLY, make_settings, serve
from tests.support.waiting import until

OPTIONS = SamplingOptions(max_tokens=None)


def pool_of(*names: str, **fields: object) -> tuple[BackendPool, dict[str, FakeBackend]]:
    fakes = {name: FakeBackend() for name in names}
    pool = BackendPool(",".join(names), fakes.__getitem__, check_every_s=3600, **fields)  # type: ignore[arg-type]
    return pool, fakes


async def answer(pool: BackendPool, model: str = "fake-chat", stream: bool = False) -> str:
    async with aclosing(pool.generate(model, "hi", OPTIONS, stream)) as chunks:
        return "".join([chunk.text async for chunk in chunks])


def test_urls_that_make_a_pool() -> None:
    assert not is_pool("triton:8001")
    assert is_pool("a:8001,b:8001") and is_pool("dns:///triton-headless:8001")
    assert targets(" a:1 , b:2,") == ["a:1", "b:2"]


async def test_requests_take_turns_over_idle_servers() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    try:
        for _ in range(6):
            assert await answer(pool) == REPLY
        assert [len(f.calls) for f in fakes.values()] == [3, 3]
    finally:
        await pool.close()


async def test_the_least_busy_server_gets_the_next_request() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    fakes["a:1"].token_delay_s = fakes["b:1"].token_delay_s = 0.05
    try:
        slow = asyncio.create_task(answer(pool, stream=True))
        # (a fixed 10 ms was once too short on a busy machine)
        await until(lambda: any(f.calls for f in fakes.values()), "the stream never started")
        busy = next(name for name, fake in fakes.items() if fake.calls)
        for _ in range(2):  # while the stream runs
            await answer(pool)
        await slow
        # Both later requests went to the idle one.
        assert [len(f.calls) for n, f in fakes.items() if n != busy] == [2]
    finally:
        await pool.close()


async def test_a_server_that_is_down_is_routed_around_and_comes_back() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    try:
        await pool.check()
        fakes["a:1"].up = False  # died since the last check: found out by a request
        assert [await answer(pool) for _ in range(4)] == [REPLY] * 4
        assert len(fakes["a:1"].calls) == 0 and len(fakes["b:1"].calls) == 4
        fakes["b:1"].up = False
        with pytest.raises(BackendUnavailableError):
            await answer(pool)
        assert not await pool.live()
        fakes["a:1"].up = fakes["b:1"].up = True
        await pool.check()
        assert await pool.live()
        for _ in range(4):
            await answer(pool)
        assert len(fakes["a:1"].calls) == 2  # it takes its turns again
    finally:
        await pool.close()


async def test_a_model_goes_to_the_servers_that_have_it() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    a = fakes["a:1"]
    a.model_list = [replace(m, ready=False) if m.name == "fake-chat" else m for m in a.model_list]
    try:
        for _ in range(4):
            await answer(pool)
        assert len(fakes["b:1"].calls) == 4
        # The union: listed as ready because one server has it ready.
        listed = {m.name: m.ready for m in await pool.models()}
        assert listed["fake-chat"] is True
        await pool.load_model("fake-unloaded")  # on every server
        assert all(
            next(m for m in f.model_list if m.name == "fake-unloaded").ready for f in fakes.values()
        )
    finally:
        await pool.close()


async def test_a_dns_name_is_every_address_it_resolves_to() -> None:
    addresses = ["10.0.0.1:8001", "10.0.0.2:8001"]

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("triton-headless", 8001)
        return list(addresses)

    fakes: dict[str, FakeBackend] = {}
    pool = BackendPool(
        "dns:///triton-headless:8001",
        lambda address: fakes.setdefault(address, FakeBackend()),
        check_every_s=3600,
        resolver=resolver,
    )
    try:
        for _ in range(4):
            await answer(pool)
        assert sorted(fakes) == addresses
        assert [len(f.calls) for f in fakes.values()] == [2, 2]
        addresses[:] = ["10.0.0.2:8001", "10.0.0.3:8001"]  # a pod replaced
        await pool.check()
        assert sorted(pool.servers) == addresses
        for _ in range(4):
            await answer(pool)
        assert len(fakes["10.0.0.1:8001"].calls) == 2  # no more
        assert len(fakes["10.0.0.3:8001"].calls) == 2
    finally:
        await pool.close()


async def test_the_api_serves_through_a_pool_with_one_server_down() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    fakes["a:1"].up = False
    async with serve(make_settings(), backend=pool) as (_, http, sdk):  # type: ignore[arg-type]
        for _ in range(3):
            response = await http.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 200
        assert (await http.get("/health/ready")).status_code == 200
        assert "fake-chat" in [m.id for m in (await sdk.models.list()).data]
    assert len(fakes["b:1"].calls) == 3


async def test_an_embedding_goes_around_a_server_that_is_down() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    fakes["a:1"].up = False
    try:
        for _ in range(2):
            embedded = await pool.embed("fake-embed", ["hello"], "query")
            assert embedded.vectors.shape[0] == 1
        assert len(fakes["a:1"].embed_calls) == 0 and len(fakes["b:1"].embed_calls) == 2
    finally:
        await pool.close()
