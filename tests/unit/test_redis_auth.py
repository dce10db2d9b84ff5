"""The password of ``GATEWAY_REDIS_URL`` with every kind of Redis the deployments name
(docs/deployment.md, k8s/base/redis.yaml): Sentinels that ask for it (``requirepass``, as
the Bitnami chart's ``auth.sentinel`` sets them) and Sentinels that do not, in front of
masters that ask for it, and a Redis Cluster whose nodes ask for it. Real ``redis-server``
processes; the gateway creates a key and serves a request with it, and a URL without the
password gets nothing but 503."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.bodies import chat_body
from tests.support.inprocess import AUTH, bearer, make_settings, serve
from tests.support.redis_server import NOT_YET, ONE_TRY, REDIS_CLI, REDIS_SERVER, free_ports
from tests.support.waiting import wait_until

PASSWORD = secrets.token_hex(32)
SERVICE = "gwmaster"


class Servers:
    """``redis-server`` processes in one folder, stopped together."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> None:
        log = (self.directory / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen([REDIS_SERVER, *args], stdout=log, stderr=subprocess.STDOUT)
        )

    def data(self, port: int) -> str:
        folder = self.directory / str(port)
        folder.mkdir()
        return str(folder)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    group = Servers(tmp_path)
    try:
        yield group
    finally:
        group.stop()


def client(port: int, password: str | None = PASSWORD) -> redis.Redis:
    return redis.Redis(
        port=port, password=password, socket_timeout=1, decode_responses=True, retry=ONE_TRY
    )


async def served_with(url: str) -> None:
    """The gateway on ``url`` makes a key (written to Redis) and serves a request with it
    (the key read back, its limits counted there)."""
    async with serve(make_settings(redis_url=url)) as (_, http, _sdk):
        created = await http.post("/admin/keys", json={"name": "auth", "rpm": 5}, headers=AUTH)
        assert created.status_code == 201, created.text
        answer = await http.post(
            "/v1/chat/completions", json=chat_body(), headers=bearer(created.json()["key"])
        )
        assert answer.status_code == 200, answer.text


async def refused_with(url: str) -> None:
    """The gateway on ``url`` (a wrong password, or none) writes nothing: 503 (at once:
    a Sentinel that refuses the password looks like one with no master, which a request
    would otherwise wait for, ``backend_wait_s``)."""
    async with serve(make_settings(redis_url=url, backend_wait_s=0)) as (_, http, _sdk):
        created = await http.post("/admin/keys", json={"name": "auth"}, headers=AUTH)
        assert created.status_code == 503, created.text
        assert created.json()["error"]["code"] == "store_unavailable"


def start_sentinels(servers: Servers) -> tuple[int, list[int]]:
    """A master and a replica that ask for the password, and two Sentinels watching them
    with it (``sentinel auth-pass``): the first asks for it too, the second does not."""
    master, replica, guarded, open_ = free_ports(4)
    for port, extra in ((master, []), (replica, ["--replicaof", "127.0.0.1", str(master)])):
        servers.start(
            str(port),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", servers.data(port)),
            *("--save", "", "--repl-diskless-sync-delay", "0"),
            *("--requirepass", PASSWORD, "--masterauth", PASSWORD),
            *extra,
        )
    # masterauth: the replica syncs.
    wait_until(
        lambda: client(replica).info("replication")["master_link_status"] == "up",
        "the replica syncs",
        retry_on=NOT_YET,
    )
    for port, requirepass in ((guarded, f"requirepass {PASSWORD}\n"), (open_, "")):
        conf = servers.directory / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\n{requirepass}"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n"
            f"sentinel auth-pass {SERVICE} {PASSWORD}\n"
        )
        servers.start(f"sentinel-{port}", str(conf), "--sentinel")
    # auth-pass: the Sentinels read the master's INFO, where they learn of the replica.
    for port, password in ((guarded, PASSWORD), (open_, None)):
        wait_until(
            lambda p=port, pw=password: client(p, pw).sentinel_master(SERVICE)["num-slaves"] == 1,
            f"the Sentinel on {port} sees the replica",
            retry_on=NOT_YET,
        )
    return master, [guarded, open_]


async def test_sentinels_and_masters_that_ask_for_the_password(servers: Servers) -> None:
    master, (guarded, open_) = start_sentinels(servers)
    with pytest.raises(redis.AuthenticationError):
        client(guarded, None).sentinel_get_master_addr_by_name(SERVICE)
    for sentinel in (guarded, open_):
        await served_with(f"redis+sentinel://:{PASSWORD}@127.0.0.1:{sentinel}/{SERVICE}")
    assert client(master).keys("gw:key:*")
    await refused_with(f"redis+sentinel://127.0.0.1:{open_}/{SERVICE}")
    await refused_with(f"redis+sentinel://:{secrets.token_hex(8)}@127.0.0.1:{guarded}/{SERVICE}")


async def test_a_cluster_whose_nodes_ask_for_the_password(servers: Servers) -> None:
    *ports, bus_a, bus_b, bus_c = free_ports(6)
    for port, bus in zip(ports, (bus_a, bus_b, bus_c), strict=True):
        servers.start(
            str(port),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", servers.data(port)),
            *("--cluster-enabled", "yes", "--cluster-port", str(bus)),
            *("--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no"),
            *("--requirepass", PASSWORD, "--masterauth", PASSWORD),
        )
    for port in ports:
        wait_until(lambda p=port: client(p).ping(), f"{port} answers", retry_on=NOT_YET)
    # A few seconds at most, before the gateway runs: nothing else waits on this loop.
    subprocess.run(  # noqa: ASYNC221
        [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
        env={"REDISCLI_AUTH": PASSWORD},
        check=True,
        capture_output=True,
        timeout=60,
    )
    wait_until(
        lambda: client(ports[0]).cluster("info")["cluster_state"] == "ok",
        "cluster ok",
        retry_on=NOT_YET,
    )
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    await served_with(f"redis+cluster://:{PASSWORD}@{nodes}")
    await refused_with(f"redis+cluster://{nodes}")
