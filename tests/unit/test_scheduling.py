"""Priorities, shedding and routing (``gateway/backend/scheduling.py`` and the pool's slots):
the ring keeps a key on one server and spills a hot one to the next within the load bound;
with a slot limit, waiting requests get slots by priority then arrival, a full queue or a
long wait is a 503 ``overloaded`` with ``Retry-After``, and a client that leaves, leaves the
queue; through the API, a key's priority bounds the request's, and a conversation's turns
land on one server."""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field

import pytest
from starlette.requests import ClientDisconnect

from gateway import outages
from gateway.app import _triton
from gateway.backend import scheduling
from gateway.backend.base import ChatImage, GenerationChunk, SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.backend.pool import BackendPool
from gateway.backend.scheduling import Policy, Ring, place
from gateway.errors import OverloadedError
from gateway.metrics import Metrics
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import bearer, make_settings, new_key, serve
from tests.support.waiting import until

OPTIONS = SamplingOptions(max_tokens=None)


@dataclass
class Held(FakeBackend):
    """A fake whose generations wait for :attr:`gate` before they answer."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: list[str] = field(default_factory=list)
    """The prompts of the generations begun here, in order (before the gate)."""

    async def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        self.started.append(prompt)
        await self.gate.wait()
        async with aclosing(super().generate(model, prompt, options, stream, images)) as chunks:
            async for chunk in chunks:
                yield chunk


def pool_of(*names: str, **policy: object) -> tuple[BackendPool, dict[str, Held]]:
    fakes = {name: Held() for name in names}
    for fake in fakes.values():
        fake.gate.set()
    pool = BackendPool(
        ",".join(names),
        fakes.__getitem__,  # type: ignore[arg-type]
        check_every_s=3600,
        policy=Policy(**policy),  # type: ignore[arg-type]
    )
    return pool, fakes


async def ask(
    pool: BackendPool, prompt: str = "hi", priority: int = 0, key: str | None = None
) -> str:
    """One generation, run at ``priority`` and routed by ``key`` (as the API sets them)."""
    scheduling.start(priority, key)
    async with aclosing(pool.generate("fake-chat", prompt, OPTIONS, False)) as chunks:
        return "".join([chunk.text async for chunk in chunks])


def served_by(fakes: dict[str, Held]) -> dict[str, list[str]]:
    return {name: list(fake.started) for name, fake in fakes.items()}


def waiting(pool: BackendPool) -> int:
    queue = pool._queues.get("fake-chat")
    return len(queue.waiting) if queue else 0


@asynccontextmanager
async def one_slot_taken(
    **policy: object,
) -> AsyncIterator[tuple[BackendPool, Held, asyncio.Task[str]]]:
    """A pool of one server with one slot for the model (``policy`` sets the rest), taken by
    a request ("first") that runs until the test opens ``fake.gate``."""
    pool, fakes = pool_of("a:1", max_inflight=1, **policy)
    fake = fakes["a:1"]
    try:
        await pool.live()
        fake.gate.clear()
        first = asyncio.create_task(ask(pool, "first"))
        await until(lambda: fake.started, "the first request runs")
        yield pool, fake, first
    finally:
        await pool.close()


# -- the ring --------------------------------------------------------------------------------


def test_a_key_keeps_its_server_and_keys_spread_evenly() -> None:
    ring = Ring(frozenset({"a:1", "b:1", "c:1"}))
    homes = Counter(next(ring.walk(f"session-{i}")) for i in range(3000))
    # The same in every replica (process): blake2b, not Python's per-process salted hash().
    assert list(ring.walk("session-7")) == ["c:1", "a:1", "b:1"]
    assert list(ring.walk("x")) == ["a:1", "b:1", "c:1"]
    assert all(800 < n < 1200 for n in homes.values()), homes  # about a third each


def test_removing_a_server_moves_only_its_keys() -> None:
    before = Ring(frozenset({"a:1", "b:1", "c:1"}))
    after = Ring(frozenset({"a:1", "b:1"}))
    for i in range(1000):
        home = next(before.walk(f"k{i}"))
        if home != "c:1":
            assert next(after.walk(f"k{i}")) == home


def test_a_hot_key_spills_to_the_next_server_on_the_ring_at_the_bound() -> None:
    ring = Ring(frozenset({"a:1", "b:1", "c:1"}))
    home, second, third = list(ring.walk("hot"))
    loads = {"a:1": 0, "b:1": 0, "c:1": 0}
    placed = []
    for _ in range(9):  # nine requests of one key, none finished
        chosen, _home = place(ring, "hot", loads, lambda _: True, 0.25)
        assert chosen is not None
        assert loads[chosen] + 1 <= math.ceil(1.25 * (sum(loads.values()) + 1) / 3)
        loads[chosen] += 1
        placed.append(chosen)
    # The home first; what spills goes to the key's second server, then its third.
    assert placed[:2] == [home, second] and placed.index(third) > placed.index(second)
    assert (loads[home], loads[second], loads[third]) == (4, 4, 1)
    # A server without a free slot is passed over like one at the bound.
    assert place(ring, "hot", loads, lambda node: node != home, 10.0) == (second, False)


# -- slots and the queue -----------------------------------------------------------------------


async def test_waiting_requests_get_slots_by_priority_then_arrival() -> None:
    pool, fakes = pool_of("a:1", max_inflight=1)
    fake = fakes["a:1"]
    try:
        await pool.live()
        fake.gate.clear()
        first = asyncio.create_task(ask(pool, "first", priority=0))
        await until(lambda: fake.started, "the first request runs")
        tasks = []
        for prompt, priority in (("bulk-1", 5), ("chat", 0), ("bulk-2", 5), ("urgent", -1)):
            tasks.append(asyncio.create_task(ask(pool, prompt, priority)))
            await until(lambda: waiting(pool) == len(tasks), f"{prompt} waits")
        assert len(fake.started) == 1  # one slot: the others wait
        fake.gate.set()
        await asyncio.gather(first, *tasks)
        assert served_by(fakes)["a:1"] == ["first", "urgent", "chat", "bulk-1", "bulk-2"]
    finally:
        await pool.close()


async def test_a_full_queue_sheds_the_worst_request_with_retry_after() -> None:
    async with one_slot_taken(max_waiting=2) as (pool, fake, first):
        low = [asyncio.create_task(ask(pool, f"low-{i}", priority=5)) for i in range(2)]
        await until(lambda: waiting(pool) == 2, "two wait")
        with pytest.raises(OverloadedError) as refused:  # no better than those waiting
            await ask(pool, "low-late", priority=5)
        assert refused.value.reason == "queue_full" and refused.value.status_code == 503
        assert int(refused.value.headers["Retry-After"]) >= 1
        high = asyncio.create_task(ask(pool, "high", priority=0))  # takes low-1's place
        with pytest.raises(OverloadedError):
            await low[1]
        fake.gate.set()
        await asyncio.gather(first, low[0], high)
        assert list(fake.started) == ["first", "high", "low-0"]


async def test_a_request_that_waits_too_long_is_shed() -> None:
    async with one_slot_taken(max_wait_s=0.05) as (pool, fake, first):
        with pytest.raises(OverloadedError) as shed:
            await ask(pool, "late")
        assert shed.value.reason == "wait_timeout" and waiting(pool) == 0
        fake.gate.set()
        await first


async def test_a_client_that_leaves_leaves_the_queue() -> None:
    async with one_slot_taken(max_waiting=1) as (pool, fake, first):
        gone = asyncio.create_task(ask(pool, "gone"))
        await until(lambda: waiting(pool) == 1, "it waits")
        gone.cancel()
        await until(lambda: waiting(pool) == 0, "it left")
        after = asyncio.create_task(ask(pool, "after"))  # its place is free again
        await until(lambda: waiting(pool) == 1, "the next one waits")
        fake.gate.set()
        await asyncio.gather(first, after)
        assert list(fake.started) == ["first", "after"]
        assert pool.servers["a:1"].busy == 0 and pool.servers["a:1"].running["fake-chat"] == 0


async def test_a_client_that_hangs_up_while_its_stream_waits_leaves_the_queue() -> None:
    # A stream waits for its slot before its response starts, where nothing cancels it:
    # the request's own "client gone" (the middleware's) takes it out of the queue.
    hung_up = asyncio.Event()

    async def hanging_up(pool: BackendPool) -> str:
        outages.begin(5.0, hung_up.wait)
        return await ask(pool, "gone")

    async with one_slot_taken(max_waiting=1) as (pool, fake, first):
        gone = asyncio.create_task(hanging_up(pool))
        await until(lambda: waiting(pool) == 1, "it waits")
        hung_up.set()
        with pytest.raises(ClientDisconnect):
            await gone
        assert waiting(pool) == 0
        fake.gate.set()
        await first
        assert list(fake.started) == ["first"]


async def test_a_stream_holds_its_slot_until_its_last_chunk() -> None:
    pool, fakes = pool_of("a:1", max_inflight=1)
    fake = fakes["a:1"]
    try:
        await pool.live()
        async with aclosing(pool.generate("fake-chat", "stream", OPTIONS, True)) as chunks:
            await anext(chunks)
            other = asyncio.create_task(ask(pool, "other"))
            await until(lambda: waiting(pool) == 1, "the other waits")
            await asyncio.sleep(0.02)
            assert len(fake.started) == 1
            rest = [chunk async for chunk in chunks]
            assert rest[-1].finish_reason == "stop"
        await other
        assert served_by(fakes)["a:1"] == ["stream", "other"]
    finally:
        await pool.close()


async def test_without_a_limit_nothing_waits() -> None:
    pool, fakes = pool_of("a:1")
    fake = fakes["a:1"]
    try:
        await pool.live()
        fake.gate.clear()
        tasks = [asyncio.create_task(ask(pool, f"r{i}")) for i in range(20)]
        await until(lambda: len(fake.started) == 20, "all twenty run at once")
        fake.gate.set()
        await asyncio.gather(*tasks)
    finally:
        await pool.close()


# -- routing over servers ----------------------------------------------------------------------


async def test_a_key_goes_to_one_server_and_keyless_requests_take_turns() -> None:
    pool, fakes = pool_of("a:1", "b:1", "c:1")
    try:
        for i in range(6):
            await ask(pool, f"turn-{i}", key="conversation-1")
        homes = {name for name, prompts in served_by(fakes).items() if prompts}
        assert len(homes) == 1
        for fake in fakes.values():
            fake.started.clear()
        for i in range(6):
            await ask(pool, f"keyless-{i}")
        assert [len(p) for p in served_by(fakes).values()] == [2, 2, 2]
    finally:
        await pool.close()


async def test_a_long_shared_prefix_routes_to_one_server() -> None:
    pool, fakes = pool_of("a:1", "b:1", prefix_chars=64)
    system = "You are a support agent for ACME. " * 4  # > 64 characters
    try:
        for i in range(4):
            await ask(pool, f"{system} question {i}")
        assert sorted(len(p) for p in served_by(fakes).values()) == [0, 4]
        for i in range(4):
            await ask(pool, f"short {i}")  # under 64 characters: least busy, in turns
        assert sorted(len(p) for p in served_by(fakes).values()) == [2, 6]
    finally:
        await pool.close()


async def test_a_hot_conversation_spills_at_the_load_bound_and_comes_home() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    try:
        await pool.live()
        for fake in fakes.values():
            fake.gate.clear()
        hot = [asyncio.create_task(ask(pool, f"hot-{i}", key="hot")) for i in range(8)]
        await until(lambda: sum(len(f.started) for f in fakes.values()) == 8, "all run")
        counts = sorted(len(f.started) for f in fakes.values())
        # ε = 0.25 over two servers: the home takes at most ceil(1.25 x 8 / 2) = 5.
        assert counts == [3, 5], counts
        home = max(fakes, key=lambda n: len(fakes[n].started))
        for fake in fakes.values():
            fake.gate.set()
        await asyncio.gather(*hot)
        await ask(pool, "hot-after", key="hot")  # idle again: home
        assert fakes[home].started[-1] == "hot-after"
    finally:
        await pool.close()


# -- through the API -------------------------------------------------------------------------


async def test_a_keys_priority_bounds_the_priority_its_requests_ask_for() -> None:
    async with serve(make_settings()) as (_, http, _sdk):
        key = await new_key(http, priority=5)
        assert key["priority"] == 5
        assert (await http.get(f"/admin/keys/{key['id']}")).json()["priority"] == 5
        own = bearer(key["key"])
        refused = await http.post("/v1/chat/completions", json=chat_body(priority=4), headers=own)
        assert_openai_error(refused, 400, param="priority", code="priority_not_allowed")
        for route, body in (
            ("/v1/chat/completions", chat_body(priority=9)),
            ("/v1/completions", {"model": "fake-chat", "prompt": "hi", "priority": 5}),
            ("/v1/embeddings", {"model": "fake-embed", "input": "hi", "priority": 6}),
            ("/v1/responses", {"model": "fake-chat", "input": "hi", "priority": 7}),
        ):
            assert (await http.post(route, json=body, headers=own)).status_code == 200, route
        for route, body in (
            ("/v1/embeddings", {"model": "fake-embed", "input": "hi", "priority": 4}),
            ("/v1/responses", {"model": "fake-chat", "input": "hi", "priority": 4}),
        ):
            assert_openai_error(
                await http.post(route, json=body, headers=own), 400, param="priority"
            )
        # A key with no priority runs at 0: a request may not go ahead of it either.
        plain = bearer((await new_key(http))["key"])
        ahead = await http.post("/v1/chat/completions", json=chat_body(priority=-1), headers=plain)
        assert_openai_error(ahead, 400, param="priority")
        out_of_range = await http.post("/v1/chat/completions", json=chat_body(priority=101))
        assert_openai_error(out_of_range, 400, param="priority")
        too_high = await http.post("/admin/keys", json={"name": "x", "priority": -101})
        assert_openai_error(too_high, 400, param="priority")
        # An admin moves a key ahead: its requests may then ask for that priority.
        moved = await http.patch(f"/admin/keys/{key['id']}", json={"priority": 2})
        assert moved.status_code == 200, moved.text
        assert moved.json()["priority"] == 2
        ahead = await http.post("/v1/chat/completions", json=chat_body(priority=2), headers=own)
        assert ahead.status_code == 200, ahead.text


async def test_an_overloaded_model_answers_503_with_retry_after_counted_in_metrics() -> None:
    pool, fakes = pool_of("a:1", max_inflight=1, max_waiting=1)
    fake = fakes["a:1"]
    async with serve(make_settings(), backend=pool) as (app, http, _sdk):  # type: ignore[arg-type]
        pool.metrics = app.state.metrics
        fake.gate.clear()
        running = asyncio.create_task(http.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: fake.started, "one runs")
        queued = asyncio.create_task(http.post("/v1/chat/completions", json=chat_body()))
        await until(lambda: waiting(pool) == 1, "one waits")
        shed = await http.post("/v1/chat/completions", json=chat_body())
        assert_openai_error(shed, 503, code="overloaded")
        assert int(shed.headers["retry-after"]) >= 1
        fake.gate.set()
        assert [(await t).status_code for t in (running, queued)] == [200, 200]
        text = (await http.get("/metrics")).text
        assert 'gateway_shed_total{model="fake-chat",reason="queue_full"} 1.0' in text
        assert 'gateway_queue_depth{model="fake-chat"} 0.0' in text
        assert 'gateway_queue_wait_seconds_count{priority="0"} 2.0' in text


async def test_a_conversations_turns_land_on_one_server_through_the_api() -> None:
    pool, fakes = pool_of("a:1", "b:1")
    async with serve(make_settings(), backend=pool) as (app, http, _sdk):  # type: ignore[arg-type]
        pool.metrics = app.state.metrics

        def used() -> list[int]:
            counts = [len(f.started) for f in fakes.values()]
            for fake in fakes.values():
                fake.started.clear()
            return sorted(counts)

        for stream in (False, True, False, True):  # a session, streamed or not
            response = await http.post(
                "/v1/chat/completions",
                json=chat_body(stream=stream),
                headers={"X-Session-ID": "conv-1"},
            )
            assert response.status_code == 200
        assert used() == [0, 4]
        for _ in range(4):
            body = chat_body(prompt_cache_key="tenant-7")
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        assert used() == [0, 4]
        previous = None
        for turn in range(4):  # a previous_response_id chain
            body = {"model": "fake-chat", "input": f"turn {turn}", "previous_response_id": previous}
            answer = (await http.post("/v1/responses", json=body)).json()
            previous = answer["id"]
        assert used() == [0, 4]
        for _ in range(4):  # no key: the least busy, in turns
            assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert used() == [2, 2]
        text = (await http.get("/metrics")).text
        assert 'gateway_route_total{outcome="affinity"} 12.0' in text
        assert 'gateway_route_total{outcome="fallback"} 4.0' in text


async def test_a_slot_limit_puts_even_one_triton_behind_the_queue() -> None:
    metrics = Metrics()
    one = _triton(make_settings(triton_url="127.0.0.1:1"), metrics)
    assert not isinstance(one, BackendPool)  # nothing changes unless the limit is set
    await one.close()
    limited = _triton(make_settings(triton_url="127.0.0.1:1", triton_max_inflight=3), metrics)
    assert isinstance(limited, BackendPool) and limited.metrics is metrics
    assert limited.policy == Policy(max_inflight=3)
    await limited.close()


def test_a_conversations_routing_key_is_its_tenants_own() -> None:
    # In a context of its own: what a request sets must not reach the other tests.
    contextvars.copy_context().run(_routing_keys_are_their_tenants)


def _routing_keys_are_their_tenants() -> None:
    # The same X-Session-ID (or prompt prefix) from another project or key is another
    # conversation: it cannot be pinned to, nor probe, the first one's server.
    policy = Policy(prefix_chars=8)
    keys = []
    for tenant in ("team-a", "team-b", "key:0123456789ab"):
        scheduling.admitted(tenant)
        dispatch = scheduling.start(0, None, "session-1")
        keys.append((dispatch.route_key, policy.route_key(scheduling.start(0), "x" * 16)))
    assert len({conversation for conversation, _ in keys}) == 3
    assert len({prefix for _, prefix in keys}) == 3
    scheduling.admitted("team-a")
    assert scheduling.start(0, "session-1").route_key == keys[0][0]  # the same, again
