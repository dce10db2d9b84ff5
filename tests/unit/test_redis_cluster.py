"""``GATEWAY_REDIS_URL=redis+cluster://...`` on a real 3-master Redis Cluster
(``redis-server --cluster-enabled`` and ``redis-cli --cluster create``): keys, limits,
concurrency leases, sessions and usage work with keys spread over every node, limits stay
exact, and a node that dies makes its keys' requests fail closed with 503."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from gateway.backend.fake import FakeBackend
from tests.stack import free_port
from tests.unit.conftest import AUTH, bearer, chat_body, make_settings, serve

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
CHAT = "/v1/chat/completions"


def _wait(check: Callable[[], object], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


class Cluster:
    def __init__(self, directory: Path) -> None:
        self.ports = [free_port() for _ in range(3)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        for port in self.ports:
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
                    str(free_port()),
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
            _wait(lambda p=port: redis.Redis(port=p, socket_timeout=1).ping(), f"{port} answers")
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
        _wait(lambda: self.client.cluster_info()["cluster_state"] == "ok", "cluster state ok")

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield nodes
    finally:
        nodes.stop()


async def test_everything_works_over_a_cluster_with_exact_limits(cluster: Cluster) -> None:
    fake = FakeBackend()
    settings = make_settings(redis_url=cluster.url, concurrency_lease_s=0.3)
    async with serve(settings, fake) as (_, http, _sdk):
        made = [
            (await http.post("/admin/keys", json={"name": f"k{i}", "rpm": 3}, headers=AUTH)).json()
            for i in range(8)
        ]
        # The keys' records really are on different nodes.
        assert len({cluster.node_of(f"gw:key:{{{k['id']}}}") for k in made}) >= 2
        listed = (await http.get("/admin/keys", headers=AUTH)).json()["data"]
        assert {k["id"] for k in made} <= {k["id"] for k in listed}
        for key in made:  # each key: exactly rpm requests, then 429
            codes = [
                (await http.post(CHAT, json=chat_body(), headers=bearer(key["key"]))).status_code
                for _ in range(4)
            ]
            assert codes == [200, 200, 200, 429], codes
        usage = (await http.get(f"/admin/keys/{made[0]['id']}/usage", headers=AUTH)).json()
        assert usage["requests"] == 3
        revoked = await http.delete(f"/admin/keys/{made[1]['id']}", headers=AUTH)
        assert revoked.status_code == 200
        refused = await http.post(CHAT, json=chat_body(), headers=bearer(made[1]["key"]))
        assert refused.status_code == 401

        # A concurrency lease, renewed while its stream outlives the lease length.
        single = (
            await http.post("/admin/keys", json={"name": "one", "max_concurrency": 1}, headers=AUTH)
        ).json()["key"]
        fake.token_delay_s = 0.1
        fake.reply = " ".join(["w"] * 10)
        slow = asyncio.create_task(  # the fake waits between streamed tokens only
            http.post(CHAT, json=chat_body(stream=True), headers=bearer(single), timeout=30)
        )
        await asyncio.sleep(0.6)  # two lease lengths: only renewal keeps it held
        second = await http.post(CHAT, json=chat_body(), headers=bearer(single))
        assert second.status_code == 429, second.text
        assert (await slow).status_code == 200
        fake.token_delay_s = 0.0
        assert (await http.post(CHAT, json=chat_body(), headers=bearer(single))).status_code == 200

        # Sessions (WATCH/MULTI on one key) keep their turns.
        for text in ("My name is Ann.", "What is my name?"):
            body = chat_body(messages=[{"role": "user", "content": text}])
            said = await http.post(CHAT, json=body, headers={**AUTH, "X-Session-ID": "c1"})
            assert said.status_code == 200
        assert "My name is Ann." in fake.calls[-1].prompt
        stored = (await http.get("/v1/sessions/c1", headers=AUTH)).json()
        assert len(stored["messages"]) == 4


async def test_a_dead_node_fails_its_keys_closed(cluster: Cluster) -> None:
    async with serve(make_settings(redis_url=cluster.url)) as (_, http, _sdk):
        made = [
            (await http.post("/admin/keys", json={"name": f"d{i}"}, headers=AUTH)).json()
            for i in range(24)
        ]
        victim = cluster.ports[2]
        on_victim = [k for k in made if cluster.node_of(f"gw:key:{{{k['id']}}}") == victim]
        assert on_victim, "no key landed on the third node"
        cluster.processes[victim].kill()
        cluster.processes[victim].wait()
        response = await http.post(CHAT, json=chat_body(), headers=bearer(on_victim[0]["key"]))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.headers["retry-after"]
