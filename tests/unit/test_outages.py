"""A backend coming back (``gateway/outages.py``): a request waits for a Triton or a Redis
that answered a moment ago (a real gRPC server speaking Triton's protocol, a real
``redis-server``, each stopped and started again), within its allowance; past it, the 503
says when to come back; a stream that began is never sent again; a client that leaves stops
its wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis as sync_redis
from starlette.requests import ClientDisconnect
from tritonclient.grpc import service_pb2_grpc

from gateway import outages
from gateway.backend import grpc_streams as streams
from gateway.backend.triton import TritonBackend
from gateway.errors import BackendUnavailableError, StoreUnavailableError
from gateway.outages import Attempt, Outage
from gateway.stack.triton_server import free_port
from gateway.state.redis import connect, ping
from tests.support.bodies import chat_body
from tests.support.fake_triton import FakeTriton
from tests.support.inprocess import bearer, make_settings, serve
from tests.support.redis_server import NOT_YET, REDIS_SERVER, redis_server, start_again
from tests.support.waiting import wait_until

# Restarts a gRPC server and a redis-server mid-test: handed out with the long groups
# (tests/conftest.py).
pytestmark = pytest.mark.long


def test_retry_after_counts_down_to_the_usual_restart_then_spreads_the_retries() -> None:
    outage = Outage("Triton", usual_s=4.0, wait_s=5.0)
    outage.up()
    outage.down()
    began = outage.down_since
    assert began is not None
    # Never before the backend is likely back: the SDK's retry lands after the restart.
    assert outage.retry_after(began + 0.5) == 4
    assert outage.retry_after(began + 3.5) == 1
    # Overdue: as long again as it has been down, at most the 60 s the SDKs honour.
    assert outage.retry_after(began + 9.2) == 10
    assert outage.retry_after(began + 500) == 60
    assert outage.coming_back(began + 11)
    assert not outage.coming_back(began + 13)  # three usual restarts: not coming back
    # The next outage is expected to last as long as this one did.
    outage.up()
    assert outage.last_s is not None and outage.expected_s == outage.last_s < 4.0


def test_a_backend_never_seen_up_is_not_waited_for() -> None:
    outage = Outage("Triton", usual_s=4.0, wait_s=5.0)
    outage.down()
    assert not outage.coming_back()  # a wrong address, say: a 503 at once


async def test_a_client_that_goes_away_stops_its_wait() -> None:
    outage = Outage("Triton", usual_s=30.0, wait_s=20.0)
    outage.up()
    outage.down()

    async def gone() -> None:
        await asyncio.sleep(0.1)

    outages.begin(20.0, gone)
    allowance = outage.allowance()
    started = time.monotonic()
    with pytest.raises(ClientDisconnect):
        while await outage.wait(allowance):
            pass
    assert time.monotonic() - started < 2


# -- Triton ----------------------------------------------------------------------------------


class _Server:
    """The fake Triton on one port, which can be stopped and started again there."""

    def __init__(self) -> None:
        self.fake = FakeTriton()
        self.port = 0
        self.server: Any = None

    async def start(self) -> None:
        # Started again on its port (free_port's are below the ephemeral range, so no
        # outgoing connection of another test can have taken it meanwhile).
        for _ in range(50):
            port = self.port or free_port()
            self.server = grpc.aio.server()
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.fake, self.server)
            try:
                self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
            except RuntimeError:  # taken (by another test's server), or not freed yet
                await asyncio.sleep(0.05)
                continue
            await self.server.start()
            return
        raise RuntimeError("no port for the fake Triton")

    async def stop(self) -> None:
        await self.server.stop(None)


@pytest.fixture
async def triton() -> AsyncIterator[_Server]:
    server = _Server()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _backend(server: _Server, usual_s: float, wait_s: float, counted: list[str]) -> TritonBackend:
    outage = Outage("Triton", usual_s, wait_s, counted.append)
    return TritonBackend(f"127.0.0.1:{server.port}", outage=outage)


async def _words(backend: TritonBackend, model: str, text: str, after: Callable[[], Any]) -> list:
    got = []
    inputs = [streams.text("text_input", text)]
    async with aclosing(backend._stream(model, inputs)) as results:
        async for outputs in results:
            if (word := outputs.first_bytes("text_output")) is not None:
                got.append(word.decode())
                if len(got) == 1:
                    await after()
    return got


async def _nothing() -> None:
    return None


async def test_a_request_waits_for_a_triton_coming_back(triton: _Server) -> None:
    counted: list[str] = []
    backend = _backend(triton, usual_s=2.0, wait_s=10.0, counted=counted)
    try:
        assert await _words(backend, "echo", "before", _nothing) == ["before"]
        await triton.stop()

        async def restart() -> None:
            await asyncio.sleep(0.8)
            await triton.start()

        restarted = asyncio.create_task(restart())
        started = time.monotonic()
        assert await _words(backend, "echo", "during the restart", _nothing) == [
            "during",
            "the",
            "restart",
        ]
        assert time.monotonic() - started >= 0.7
        await restarted
        assert counted == ["waited_ok"]
        outage = backend.outage
        assert outage is not None and outage.down_since is None and outage.last_s is not None
    finally:
        await backend.close()


async def test_past_its_allowance_a_request_gets_a_503_that_says_when(triton: _Server) -> None:
    counted: list[str] = []
    backend = _backend(triton, usual_s=20.0, wait_s=0.6, counted=counted)
    try:
        await _words(backend, "echo", "before", _nothing)
        await triton.stop()
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as failed:
            await _words(backend, "echo", "never answered", _nothing)
        assert 0.5 < time.monotonic() - started < 3
        # 20 s expected, 0.6 s of it gone: come back when it is likely up, not before.
        assert failed.value.headers["Retry-After"] == "20"
        assert counted == ["gave_up"]
    finally:
        await triton.start()  # for the fixture's stop
        await backend.close()


async def test_a_stream_that_began_ends_with_its_error_and_is_not_sent_again(
    triton: _Server,
) -> None:
    counted: list[str] = []
    backend = _backend(triton, usual_s=2.0, wait_s=10.0, counted=counted)
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as failed:
            await _words(backend, "slow", "cut", triton.stop)
        assert time.monotonic() - started < 2  # no wait: its client has had a response
        assert int(failed.value.headers["Retry-After"]) >= 1
        assert triton.fake.calls == 1 and counted == []
    finally:
        await triton.start()
        await backend.close()


# -- Redis -----------------------------------------------------------------------------------


async def test_a_command_waits_for_a_redis_coming_back(tmp_path: Path) -> None:
    server = redis_server(tmp_path)
    counted: list[str] = []
    client = connect(server.url, 1.0, 8, Outage("Redis", 2.0, 10.0, counted.append))
    try:
        assert await ping(client)
        server.stop()

        async def restart() -> None:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(start_again, server)

        restarted = asyncio.create_task(restart())
        started = time.monotonic()
        assert await ping(client)
        assert time.monotonic() - started >= 0.7
        await restarted
        assert counted == ["waited_ok"]
    finally:
        await client.aclose()
        server.stop()


async def test_past_its_allowance_a_store_503_says_when(tmp_path: Path) -> None:
    server = redis_server(tmp_path)
    counted: list[str] = []
    client = connect(server.url, 1.0, 8, Outage("Redis", 5.0, 0.5, counted.append))
    try:
        assert await ping(client)
        server.stop()
        with pytest.raises(StoreUnavailableError) as failed:
            await ping(client)
        assert failed.value.headers["Retry-After"] == "5"
        assert counted == ["gave_up"]
    finally:
        await client.aclose()


async def test_a_request_through_the_app_waits_for_its_redis_and_settles(tmp_path: Path) -> None:
    # Admission and the settling after the answer (usage, the concurrency slot) both need
    # Redis: a user key's request sent while Redis restarts is answered, and counted.
    server = redis_server(tmp_path)
    try:
        async with serve(make_settings(redis_url=server.url)) as (_app, http, _):
            created = await http.post("/admin/keys", json={"name": "user", "rpm": 100})
            key = created.json()["key"]
            server.stop()
            # The readiness probe answers at once, and does not spoil the wait.
            assert (await http.get("/health/ready")).status_code == 503

            async def restart() -> None:
                await asyncio.sleep(0.8)
                await asyncio.to_thread(start_again, server)

            restarted = asyncio.create_task(restart())
            answer = await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key))
            await restarted
            assert answer.status_code == 200, answer.text
            usage = await http.get(f"/admin/keys/{created.json()['id']}/usage")
            assert usage.json()["requests"] == 1, usage.text
            metrics = (await http.get("/metrics")).text
            assert 'gateway_backend_waits_total{outcome="waited_ok"} 1.0' in metrics
    finally:
        server.stop()


async def test_a_redis_reading_its_data_back_is_waited_for(tmp_path: Path) -> None:
    # A restarted Redis takes connections while it loads its append-only file, and answers
    # LOADING to commands meanwhile: that is not back yet.
    server = redis_server(tmp_path)
    with sync_redis.Redis.from_url(server.url) as filler:
        filler.mset({f"k{i}": "v" for i in range(1500)})
        filler.bgrewriteaof()  # into the file's RDB part, which loads key by key
        wait_until(
            lambda: not filler.info("persistence")["aof_rewrite_in_progress"],
            "rewrite",
            retry_on=NOT_YET,
        )
    counted: list[str] = []
    client = connect(server.url, 1.0, 8, Outage("Redis", 2.0, 15.0, counted.append))
    loading: asyncio.subprocess.Process | None = None
    try:
        assert await ping(client)
        server.stop()
        # The same server, 2 ms per key to load (3 s), answering LOADING meanwhile.
        loading = await asyncio.create_subprocess_exec(
            REDIS_SERVER, "--port", str(server.port), "--bind", "127.0.0.1", "--dir",
            str(server.directory), "--appendonly", "yes", "--save", "", "--key-load-delay",
            "2000", "--loading-process-events-interval-bytes", "1024",
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        with sync_redis.Redis.from_url(server.url) as probe:

            def is_loading() -> bool:
                try:
                    probe.ping()
                except sync_redis.BusyLoadingError:
                    return True
                return False

            wait_until(is_loading, "the server is up and loading", 10, retry_on=NOT_YET)
        started = time.monotonic()
        assert await ping(client)  # not a 503 store_unavailable (LOADING)
        assert time.monotonic() - started > 0.3
        assert counted == ["waited_ok"]
    finally:
        await client.aclose()
        if loading is not None:
            loading.kill()
            await loading.wait()


async def test_a_triton_refusing_for_a_full_queue_is_busy_not_gone() -> None:
    # Triton answers UNAVAILABLE of its own when a model's dynamic-batcher queue is full: the
    # request gets its 503 at once instead of waiting (and adding to that queue), and the
    # server counts as up.
    outage = Outage("Triton", usual_s=10.0, wait_s=5.0)
    outage.up()
    backend = TritonBackend("127.0.0.1:1", outage=outage)
    try:
        busy = BackendUnavailableError("busy", detail="UNAVAILABLE: Exceeds maximum queue size")
        started = time.monotonic()
        assert not await backend._again(busy, Attempt(outage))
        assert time.monotonic() - started < 0.1 and outage.down_since is None
        gone = BackendUnavailableError("gone", detail="UNAVAILABLE: failed to connect")
        assert await backend._again(gone, Attempt(outage))  # a Triton that answered a moment ago
        assert outage.down_since is not None
    finally:
        await backend.close()
