"""Real ``redis-server`` processes on free ports, for tests and benchmarks: one server, or a
3-master Redis Cluster."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.stack.redis_server import EmbeddedRedis, EmbeddedRedisError
from tests.support.stack import free_port
from tests.support.waiting import wait_until


def redis_server(directory: Path) -> EmbeddedRedis:
    """A started ``redis-server`` on a free port, keeping its data in ``directory``. A
    server that dies as it starts is started once more, on another port: a port found free
    can be taken before the server binds it, and once in a few hundred starts on a loaded
    2-core machine redis-server aborted at once with nothing in its log (a clean-clone run
    of 2026-11-28). What the tests check starts once the server answers."""
    try:
        return EmbeddedRedis(directory, free_port()).start()
    except EmbeddedRedisError:
        return EmbeddedRedis(directory, free_port()).start()


def start_again(server: EmbeddedRedis) -> EmbeddedRedis:
    """``server`` started again on its own port (clients point at it), once more if it dies
    as it starts (see :func:`redis_server`: a clean-clone run of 2026-11-28 saw it abort on a
    restart too)."""
    try:
        return server.start()
    except EmbeddedRedisError:
        return server.start()


#: A client's retries when polling a server that may not be up yet: none (redis-py's default
#: retries a refused connection with a back-off of seconds; the poll tries again anyway).
ONE_TRY = Retry(NoBackoff(), 0)
#: What polling a Redis that is not up yet raises (or a field it has not set yet): another
#: try of :func:`tests.support.waiting.wait_until`.
NOT_YET = (redis.RedisError, redis.exceptions.RedisClusterException, KeyError)

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_ports(count: int) -> list[int]:
    """``count`` different ports nothing listens on now (:func:`free_port` may pick the same
    one twice)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


class Cluster:
    """Three masters on free ports, the slots spread over them (``redis-cli --cluster
    create``); ``url`` is the gateway's ``redis+cluster://`` URL."""

    def __init__(self, directory: Path) -> None:
        *self.ports, bus_a, bus_b, bus_c = free_ports(6)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        for port, bus in zip(self.ports, (bus_a, bus_b, bus_c), strict=True):
            data = directory / str(port)
            data.mkdir()
            self.processes[port] = subprocess.Popen(
                [
                    REDIS_SERVER,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(data),
                    "--cluster-enabled",
                    "yes",
                    # The bus port is port + 10000 unless set: past 65535 for a high port.
                    "--cluster-port",
                    str(bus),
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--logfile",
                    str(data / "log"),
                ],
            )
        for port in self.ports:
            wait_until(
                lambda p=port: redis.Redis(port=p, socket_timeout=1, retry=ONE_TRY).ping(),
                f"{port} answers",
                retry_on=NOT_YET,
            )
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.client = redis.RedisCluster(host="127.0.0.1", port=self.ports[0])
        wait_until(
            lambda: self.client.cluster_info()["cluster_state"] == "ok",
            "cluster state ok",
            retry_on=NOT_YET,
        )

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node_of(self, name: str) -> int:
        return int(self.client.get_node_from_key(name).port)

    def stop(self) -> None:
        self.client.close()
        for process in self.processes.values():
            process.kill()
            process.wait()
