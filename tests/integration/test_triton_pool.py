"""One gateway in front of two real Triton servers (both serving ``mock_chat``):
requests spread over both, keep succeeding when one is killed during traffic, and reach
it again once it is back; a session's turns stay on one server, and a hot session spills
to the other at the load bound (docs/scheduling.md), whose keys' priority bounds their
requests'."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.stack import processes
from gateway.stack.triton_server import EmbeddedTriton, free_port
from tests.support.stack import ROOT, GatewayProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

REPOSITORY = ROOT / "triton_repo"


def _triton(
    run_dir: Path, grpc_port: int | None = None, http_port: int | None = None
) -> EmbeddedTriton:
    triton = EmbeddedTriton(
        repository=REPOSITORY,
        models=["mock_chat"],
        run_dir=run_dir,
        grpc_port=grpc_port or free_port(),
        http_port=http_port or free_port(),
        metrics_port=free_port(),
    )
    triton.start()
    return triton


def _served(triton: EmbeddedTriton) -> int:
    """Requests ``mock_chat`` answered on this server (Triton's own counter); 0 while its
    metrics endpoint is not up yet (it may open after the server reports ready)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=5).text
    except httpx.ConnectError:
        return 0
    found = re.search(r'nv_inference_request_success\{model="mock_chat",version="1"\} (\d+)', text)
    return int(found.group(1)) if found else 0


@pytest.fixture
def tritons(tmp_path: Path) -> Iterator[list[EmbeddedTriton]]:
    servers = [_triton(tmp_path / "a"), _triton(tmp_path / "b")]
    for server in servers:  # started side by side
        server.wait_ready(120, progress=lambda _: None)
    try:
        yield servers
    finally:  # no graceful stop needed here: quicker
        processes.stop_all([s.process for s in servers], signal.SIGKILL, 10)


def _gateway(tritons: list[EmbeddedTriton]) -> GatewayProcess:
    """One gateway process (no nginx) in front of both Tritons, ready; the caller stops it."""
    gateway = GatewayProcess(
        triton_url=",".join(triton.grpc_url for triton in tritons),
        nginx=False,
        # Servers checked every 0.2 s instead of every second: the same, sooner.
        env={"GATEWAY_MODELS": "mock_chat", "GATEWAY_TRITON_CHECK_INTERVAL_S": "0.2"},
    )
    return gateway.ready(60)


def test_requests_survive_a_triton_killed_mid_traffic(
    tritons: list[EmbeddedTriton], tmp_path: Path
) -> None:
    first, second = tritons
    gateway = _gateway(tritons)
    try:
        statuses: list[int] = []
        stop = threading.Event()

        def traffic() -> None:
            with httpx.Client(
                base_url=gateway.base_url, headers=gateway.headers, timeout=30
            ) as http:
                while not stop.is_set():
                    response = http.post(
                        "/v1/chat/completions",
                        json={
                            "model": "mock_chat",
                            "messages": [{"role": "user", "content": "[mock:delay_ms=20] hi"}],
                            "max_tokens": 5,
                        },
                    )
                    statuses.append(response.status_code)

        users = [threading.Thread(target=traffic) for _ in range(4)]
        for user in users:
            user.start()
        wait_until(lambda: _served(first) > 0 and _served(second) > 0, "spread over both")
        assert first.process is not None
        first.process.kill()  # mid-traffic: some of its requests are running
        processes.kill_group(first.process)
        after_kill = len(statuses)
        wait_until(lambda: len(statuses) > after_kill + 20, "still serving after the kill")
        # Back on its ports: the gateway sends it requests again within a check or two.
        again = _triton(tmp_path / "a2", first.grpc_port, first.http_port)
        tritons.append(again)
        again.wait_ready(120, progress=lambda _: None)
        deadline = time.monotonic() + 20
        while _served(again) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for user in users:
            user.join(30)
        assert _served(again) > 0, "the restarted server got no request"
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
    finally:
        gateway.stop()


def test_a_sessions_turns_hit_one_triton_and_a_hot_session_spills_at_the_bound(
    tritons: list[EmbeddedTriton],
) -> None:
    first, second = tritons
    gateway = _gateway(tritons)
    try:
        client = gateway.client()

        def turn(session: str, text: str) -> None:
            answer = client.chat.completions.create(
                model="mock_chat",
                messages=[{"role": "user", "content": text}],
                max_tokens=20,
                extra_headers={"X-Session-ID": session},
            )
            assert answer.choices[0].message.content

        def served() -> list[int]:
            return [_served(first), _served(second)]

        # A conversation's turns, one after the other: every one on the same server.
        for i in range(6):
            turn("conversation-1", f"turn {i}")
        wait_until(lambda: sum(served()) == 6, "six turns counted")
        assert sorted(served()) == [0, 6], served()
        home = served().index(6)

        # A hot session: eight turns at once, each about 2 s long. Its server takes at most
        # ceil(1.25 x 8 / 2) = 5 of them (GATEWAY_ROUTE_BALANCE 0.25); the rest spill.
        before = served()
        threads = [
            threading.Thread(target=turn, args=("conversation-1", f"[mock:delay_ms=100] {i}"))
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        wait_until(lambda: sum(served()) == sum(before) + 8, "eight turns counted")
        took = [now - then for now, then in zip(served(), before, strict=True)]
        assert took[home] == 5 and took[1 - home] == 3, took
        metrics = httpx.get(gateway.base_url + "/metrics", timeout=5).text
        routes = dict(re.findall(r'gateway_route_total\{outcome="(\w+)"\} ([\d.]+)', metrics))
        assert float(routes["spill"]) == 3 and float(routes["affinity"]) == 6 + 5, routes

        # A key's priority bounds the priority its requests ask for (vLLM's field).
        batch = gateway.client(gateway.create_key("batch", priority=5)["key"])
        with pytest.raises(openai.BadRequestError) as refused:
            batch.chat.completions.create(
                model="mock_chat",
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"priority": 4},
            )
        assert refused.value.body["param"] == "priority"  # type: ignore[index]
        later = batch.chat.completions.create(
            model="mock_chat",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"priority": 9},
        )
        assert later.choices[0].message.content
    finally:
        gateway.stop()
