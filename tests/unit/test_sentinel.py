"""``GATEWAY_REDIS_URL=redis+sentinel://...``: the gateway finds the master through real
Redis Sentinels (a master, a replica and three Sentinels, all ``redis-server`` processes)
and follows a failover when the master is killed during traffic: limits stay exact, and
while there is no master a request waits for the new one (none is let in unchecked), then
gets 503 past ``GATEWAY_BACKEND_WAIT_S``."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from gateway.state.redis import parse_sentinel_url
from tests.support.bodies import chat_body
from tests.support.inprocess import AUTH, bearer, make_settings, serve
from tests.support.redis_server import NOT_YET, ONE_TRY, free_ports
from tests.support.waiting import wait_until

# A Sentinel set and its failover: handed out with the long groups (tests/conftest.py).
pytestmark = pytest.mark.long

SERVICE = "gwmaster"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass
class SentinelSet:
    directory: Path
    master: int = 0
    replica: int = 0
    sentinels: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Five different ports (picked one at a time, two could be the same).
        self.master, self.replica, *self.sentinels = free_ports(5)

    @property
    def url(self) -> str:
        nodes = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        return f"redis+sentinel://{nodes}/{SERVICE}"

    def _run(self, port: int, *args: str) -> None:
        log = (self.directory / f"{port}.log").open("ab")
        self.processes[port] = subprocess.Popen(
            [REDIS_SERVER, *args], stdout=log, stderr=subprocess.STDOUT
        )

    def start(self) -> SentinelSet:
        for port, extra in (
            (self.master, []),
            (self.replica, ["--replicaof", "127.0.0.1", str(self.master)]),
        ):
            data = self.directory / str(port)
            data.mkdir()
            self._run(
                port,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(data),
                "--save",
                "",
                "--repl-diskless-sync-delay",
                "0",
                *extra,
            )
        for port in self.sentinels:
            conf = self.directory / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                # What a Sentinel would learn from the master's INFO within 10 s.
                f"sentinel known-replica {SERVICE} 127.0.0.1 {self.replica}\n"
            )
            self._run(port, str(conf), "--sentinel")
        wait_until(
            lambda: self._client(self.replica).info("replication")["master_link_status"] == "up",
            "the replica syncs",
            30,
            retry_on=NOT_YET,
        )
        # A Sentinel fails over only to a replica it knows to be in sync (it learns of
        # replicas from the master's INFO, every 10 s).
        for port in self.sentinels:
            wait_until(
                lambda p=port: self._sees_everyone(p),
                f"Sentinel {port} sees all",
                30,
                retry_on=NOT_YET,
            )
        return self

    def _sees_everyone(self, port: int) -> bool:
        client = self._client(port)
        replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
        if client.sentinel_master(SERVICE)["num-other-sentinels"] != 2 or len(replicas) != 1:
            return False
        fields = replicas[0]
        if isinstance(fields, list):  # RESP2: a flat list of names and values
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        return bool(fields["master-link-status"] == "ok" and fields["flags"] == "slave")

    def _client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, decode_responses=True, retry=ONE_TRY)

    def replicated(self) -> bool:
        sent = self._client(self.master).info("replication")["master_repl_offset"]
        return bool(self._client(self.replica).info("replication")["slave_repl_offset"] == sent)

    def master_port(self) -> int:
        return int(self._client(self.sentinels[0]).sentinel_get_master_addr_by_name(SERVICE)[1])

    def kill(self, port: int) -> None:
        self.processes[port].kill()
        self.processes[port].wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    group = SentinelSet(tmp_path)
    try:
        yield group.start()
    finally:
        group.stop()


def test_sentinel_urls_are_parsed() -> None:
    assert parse_sentinel_url("redis+sentinel://:p%40ss@a:26379,b:26380/mymaster/2") == (
        [("a", 26379), ("b", 26380)],
        "mymaster",
        2,
        "p@ss",
    )
    with pytest.raises(ValueError, match="must be host:port"):
        parse_sentinel_url("redis+sentinel://a/mymaster")
    with pytest.raises(ValueError, match="service_name"):
        parse_sentinel_url("redis+sentinel://a:1/")


async def test_the_gateway_follows_a_failover_with_exact_limits(sentinels: SentinelSet) -> None:
    rpm = 30
    async with serve(make_settings(redis_url=sentinels.url)) as (_, http, _sdk):
        created = await http.post("/admin/keys", json={"name": "ha", "rpm": rpm}, headers=AUTH)
        assert created.status_code == 201, created.text
        key = created.json()["key"]
        statuses: list[int] = []

        async def ask() -> int:
            response = await http.post(
                "/v1/chat/completions", json=chat_body(), headers=bearer(key)
            )
            if response.status_code == 503:  # never anything but a clean "retry later"
                assert response.json()["error"]["code"] == "store_unavailable"
                assert response.headers["retry-after"]
            else:
                assert response.status_code in (200, 429), response.text
            statuses.append(response.status_code)
            return response.status_code

        for _ in range(10):
            assert await ask() == 200
        old = sentinels.master_port()
        assert old == sentinels.master
        # Replication is asynchronous: once the replica has every write acknowledged so
        # far, the master is killed between two requests.
        wait_until(sentinels.replicated, "the replica has every write", 30, retry_on=NOT_YET)
        sentinels.kill(old)
        killed = time.monotonic()
        for _ in range(600):  # about a minute at most
            if await ask() == 200:
                break
            await asyncio.sleep(0.1)
        served = time.monotonic() - killed
        assert sentinels.master_port() == sentinels.replica  # the replica was promoted
        # There was a time without a master (down-after-milliseconds is 1 s): the request
        # sent then waited for the new one (GATEWAY_BACKEND_WAIT_S), it was not let in.
        assert statuses[10:] == [200] and served > 1, (statuses, served)
        while await ask() == 200:
            pass
        # The key and its window moved with the failover: exactly rpm admitted in all.
        assert statuses.count(200) == rpm, statuses
        assert statuses[-1] == 429
