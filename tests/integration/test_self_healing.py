"""Chaos on the stack ``gateway up`` runs (nginx, two replicas, Redis, Triton with
``mock_chat``): parts killed during traffic come back by themselves, clients see clean
OpenAI errors meanwhile, nothing it started outlives it, and SIGTERM drains."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.support.bodies import mock_say
from tests.support.stack import ROOT, GatewayProcess, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def _children(root: int) -> dict[int, str]:
    """Every process descending from ``root`` (not zombies), with its command line."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: dict[int, str] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
        except OSError:
            continue
        todo += parents.get(pid, [])
    return found


def _running(pids: dict[int, str]) -> dict[int, str]:
    alive = {}
    for pid, command in pids.items():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive[pid] = command
    return alive


def _pids_of(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _chat(stack: GatewayProcess, key: str, content: str = "hi") -> httpx.Response:
    return httpx.post(
        stack.base_url + CHAT,
        json={"model": "mock_chat", "messages": [{"role": "user", "content": content}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def _assert_retry_later(response: httpx.Response, code: str) -> None:
    """A clean outage answer: 503, the OpenAI error body, and when to try again."""
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    assert int(response.headers["retry-after"]) >= 1


def _through_outage(stack: GatewayProcess, key: str, code: str) -> list[int]:
    """Sends requests until one succeeds; every other answer must be a clean 503."""
    statuses: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        response = _chat(stack, key)
        statuses.append(response.status_code)
        if response.status_code == 200:
            return statuses
        _assert_retry_later(response, code)
        time.sleep(0.05)
    pytest.fail(f"no recovery within 90 s: {statuses[-5:]}\n{stack.output()[-3000:]}")


#: The supervisor's intervals, shortened: the behaviour is the same as with the defaults
#: (0.5 s checks, restarts after 0.5, 1, 2, 4 s, models read every 2 s), only sooner.
QUICK_WATCH = {
    "GATEWAY_SUPERVISE_INTERVAL_S": "0.1",
    "GATEWAY_RESTART_DELAY_S": "0.05",
    "GATEWAY_TRITON_MODELS_CHECK_S": "0.2",
}
#: A batch line's lease, shortened the same way (30 s by default): a dead replica's lines
#: go to the other after 2 s.
BATCH_LEASE = {"GATEWAY_BATCH_LEASE_S": "2", "GATEWAY_BATCH_CONCURRENCY": "4"}


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayProcess]:
    """Its own stack, Redis included (``gateway up`` starts and supervises it). The last
    test of this module kills it."""
    env = {**QUICK_WATCH, **BATCH_LEASE}
    with GatewayProcess(models=["mock_chat"], env=env).running(120) as gateway:
        yield gateway


def _ready(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/health/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_redis_killed_comes_back_with_its_data_and_exact_limits(stack: GatewayProcess) -> None:
    key = stack.create_key("chaos", rpm=6)["key"]
    assert [_chat(stack, key).status_code for _ in range(2)] == [200, 200]
    [redis] = _pids_of(f"redis-server 127.0.0.1:{stack.redis_port}")
    os.kill(redis, signal.SIGKILL)
    started = time.monotonic()
    # Until it is back: 503 store_unavailable with Retry-After, nothing let through.
    statuses = _through_outage(stack, key, "store_unavailable")
    recovered = time.monotonic() - started
    wait_until(lambda: "Redis is back" in stack.output(), "the log says Redis is back", 10)
    assert "Redis exited" in stack.output()
    assert _pids_of(f"redis-server 127.0.0.1:{stack.redis_port}") != [redis]
    # The key and its window survived (append-only file): 2 before, 1 just now, 3 more.
    admitted = statuses.count(200)
    codes = [_chat(stack, key).status_code for _ in range(6 - 2 - admitted + 1)]
    assert codes == [200] * (6 - 2 - admitted) + [429], (codes, recovered)
    assert httpx.get(stack.base_url + "/health/ready", timeout=5).status_code == 200


def test_triton_killed_mid_stream_comes_back_with_every_model(stack: GatewayProcess) -> None:
    # A model loaded through the admin API, not named at start, must come back too.
    loaded = httpx.post(
        stack.base_url + "/admin/models/e5_small/load", headers=stack.headers, timeout=300
    )
    assert loaded.status_code == 200, loaded.text
    [triton] = _pids_of(f"--grpc-port={stack.grpc_port}")
    stubs = {p: c for p, c in _children(triton).items() if "triton_python_backend_stub" in c}
    assert len(stubs) == 2, stubs  # mock_chat and e5_small
    # The supervisor reads the models Triton has ready every GATEWAY_TRITON_MODELS_CHECK_S.
    time.sleep(2 * float(QUICK_WATCH["GATEWAY_TRITON_MODELS_CHECK_S"]))
    key = stack.create_key("chaos")["key"]
    client = stack.client(key)
    stream = client.chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "[mock:delay_ms=50] [mock:words=200] a long answer"}],
        max_tokens=200,
        stream=True,
    )
    received = 0
    with pytest.raises(openai.APIError) as failed:
        for _chunk in stream:
            received += 1
            if received == 5:
                os.kill(triton, signal.SIGKILL)
    assert received >= 5
    # An error event in the stream, not a torn connection.
    assert not isinstance(failed.value, openai.APIConnectionError), failed.value
    # Its model processes die with it, SIGTERM-proof or not.
    wait_until(lambda: not _running(stubs), f"the old model processes exit: {stubs}", 10)
    _through_outage(stack, key, "backend_unavailable")
    # Recovered once every replica is ready again (each reconnects on its own, within a
    # second); from then on no request fails.
    wait_until(lambda: all(_ready(a) for a in stack.replica_addresses()), "replicas ready", 10)
    assert [_chat(stack, key).status_code for _ in range(10)] == [200] * 10
    models = {m.id for m in client.models.list()}
    assert {"mock_chat", "e5_small"} <= models
    embedded = client.embeddings.create(model="e5_small", input="back again")
    assert len(embedded.data[0].embedding) > 0
    assert "Triton exited" in stack.output()
    wait_until(lambda: "Triton is back" in stack.output(), "the log says Triton is back", 30)
    assert _pids_of(f"--grpc-port={stack.grpc_port}") != [triton]


def _waits(stack: GatewayProcess, outcome: str) -> float:
    """``gateway_backend_waits_total{outcome}``, summed over the replicas."""
    text = httpx.get(stack.internal_url + "/metrics", timeout=10).text
    found = re.search(rf'^gateway_backend_waits_total{{outcome="{outcome}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_no_request_fails_across_a_triton_restart(stack: GatewayProcess) -> None:
    # The official SDK as users run it: two retries, honouring Retry-After. Requests in
    # flight when Triton dies and those that come while it restarts wait for it (the
    # gateway's GATEWAY_BACKEND_WAIT_S, default) instead of failing.
    wait_until(lambda: all(_ready(a) for a in stack.replica_addresses()), "replicas ready", 60)
    key = stack.create_key("restart")["key"]
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, timeout=60)
    [triton] = _pids_of(f"--grpc-port={stack.grpc_port}")
    waited_before = _waits(stack, "waited_ok")
    failures: list[BaseException] = []
    slow: list[float] = []

    def one(i: int) -> None:
        started = time.monotonic()
        try:
            answer = client.chat.completions.create(
                model="mock_chat",
                messages=[{"role": "user", "content": f"[mock:delay_ms=40] [mock:words=4] n{i}"}],
                max_tokens=4,
            )
            assert answer.choices[0].message.content
        except Exception as exc:  # every failure is reported, whatever its kind
            failures.append(exc)
        if time.monotonic() - started > 1:
            slow.append(time.monotonic() - started)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(36)]
    for i, thread in enumerate(threads):
        thread.start()
        if i == 8:  # some in flight, the rest to come during the restart
            os.kill(triton, signal.SIGKILL)
        time.sleep(0.05)
    for thread in threads:
        thread.join(120)
    assert failures == [], failures
    assert slow, "no request met the restart"
    assert _waits(stack, "waited_ok") > waited_before
    wait_until(lambda: "Triton is back" in stack.output().split("Triton exited")[-1], "back", 30)


def _leased(stack: GatewayProcess, batch_id: str) -> int:
    """Lines of the batch leased to a replica now (``gateway/state/batches.py``'s layout),
    read with the embedded Redis's password (``gateway up``'s run dir)."""
    password = (stack.run_dir / f"gateway-{stack.port}" / "redis_password").read_text().strip()
    with redis.Redis(port=stack.redis_port, password=password) as store:
        return int(store.zcard(f"gw:batch:{{{batch_id}}}:leases"))


def test_a_replica_killed_mid_batch_leaves_its_lines_to_the_other(stack: GatewayProcess) -> None:
    wait_until(lambda: all(_ready(a) for a in stack.replica_addresses()), "replicas ready", 60)
    key = stack.create_key("batch chaos")
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key["key"], max_retries=3)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": "mock_chat",
                "messages": [
                    {"role": "user", "content": f"[mock:delay_ms=60] {mock_say(f'Answer {i}.')}"}
                ],
            },
        }
        for i in range(48)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = client.files.create(file=("chaos.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    # Each replica runs 4 lines at once: more than 4 leased means both hold some.
    wait_until(lambda: _leased(stack, batch.id) > 4, "both replicas run lines", 30)
    victim = stack.replica_addresses()[0]
    os.kill(stack.replica_pid(victim), signal.SIGKILL)
    deadline = time.monotonic() + 90
    while (found := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    assert found.status == "completed", found
    counts = found.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (48, 48, 0)
    assert found.error_file_id is None
    output = [
        json.loads(x) for x in client.files.content(found.output_file_id or "").text.splitlines()
    ]
    # Every line answered exactly once, each with its own answer.
    assert sorted(o["custom_id"] for o in output) == sorted(x["custom_id"] for x in lines)
    for answer in output:
        i = answer["custom_id"].removeprefix("line-")
        assert answer["response"]["body"]["choices"][0]["message"]["content"] == f"Answer {i}."
    # The batch's usage counts each answer once. The key's counts every line, the killed
    # replica's included (answered by the other); a line killed in the instant between its
    # answer and its result's write is counted twice (docs/batches.md), so at most the 4
    # lines the killed replica ran may count twice: never one lost.
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in output)
    assert found.usage is not None and found.usage.output_tokens == tokens
    used = httpx.get(
        f"{stack.base_url}/admin/keys/{key['id']}/usage", headers=stack.headers, timeout=10
    ).json()["models"]["mock_chat"]
    assert 48 <= used["requests"] <= 48 + 4, used
    assert used["completion_tokens"] >= tokens, (used, tokens)


def test_nothing_outlives_gateway_up_killed_with_sigkill(stack: GatewayProcess) -> None:
    assert stack.process is not None
    started = _children(stack.process.pid)
    commands = " ".join(started.values())
    for part in ("redis-server", "tritonserver", "triton_python_backend_stub", "nginx"):
        assert part in commands, started
    assert sum("gateway serve" in c for c in started.values()) == 2, started
    stack.process.kill()
    stack.process.wait()
    wait_until(lambda: not _running(started), f"everything stops: {_running(started)}", 20)


def _start(**env: str) -> GatewayProcess:
    return GatewayProcess(models=["mock_chat"], env=env).ready(120)


def test_sigterm_drains_streams_refuses_new_requests_and_survives_repeated_signals() -> None:
    gateway = _start(GATEWAY_DRAIN_TIMEOUT_S="30")
    assert gateway.process is not None
    started = _children(gateway.process.pid)
    client = gateway.client()
    results: list[tuple[int, bool]] = []
    begun = threading.Semaphore(0)

    def stream() -> None:
        pieces, finished = 0, False
        for chunk in client.chat.completions.create(
            model="mock_chat",
            messages=[
                {"role": "user", "content": "[mock:delay_ms=100] [mock:words=60] tell me more"}
            ],
            max_tokens=60,
            stream=True,
        ):
            pieces += bool(chunk.choices and chunk.choices[0].delta.content)
            finished = finished or bool(chunk.choices and chunk.choices[0].finish_reason)
            if pieces == 1 and chunk.choices and chunk.choices[0].delta.content:
                begun.release()
        results.append((pieces, finished))

    streams = [threading.Thread(target=stream) for _ in range(3)]
    for thread in streams:
        thread.start()
    # The streams are under way (each has its first piece; on a busy machine that can take
    # longer than their start), and 60 pieces 100 ms apart leave them seconds to go: the
    # server is still streaming at the SIGTERM even when this client reads seconds behind.
    for _ in streams:
        assert begun.acquire(timeout=30), "a stream did not begin"
    gateway.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    for _ in range(3):  # a service manager insisting must not cut the cleanup short
        gateway.process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    refused = httpx.post(
        gateway.base_url + CHAT,
        json={"model": "mock_chat", "messages": [{"role": "user", "content": "late"}]},
        headers=gateway.headers,
        timeout=10,
    )
    _assert_retry_later(refused, "shutting_down")
    for thread in streams:
        thread.join(60)
    assert results == [(60, True)] * 3, results
    assert gateway.process.wait(timeout=60) == 0, gateway.output()[-3000:]
    assert "Traceback" not in gateway.output(), gateway.output()[-3000:]
    wait_until(lambda: not _running(started), f"everything stops: {_running(started)}", 10)
    gateway.stop()


def test_gateway_up_gives_up_on_a_crash_loop() -> None:
    # A Redis that cannot start again (its append-only manifest is broken): a few tries,
    # then a one-line reason and exit 1, with nothing left running. One gateway process,
    # no nginx (there a thread beside the server supervises), in front of a Triton that is
    # not there (not needed here).
    gateway = GatewayProcess(
        triton_url=f"127.0.0.1:{free_port()}", nginx=False, env=QUICK_WATCH
    ).ready(60, path="/health/live")
    assert gateway.process is not None
    started = _children(gateway.process.pid)
    data = ROOT / ".run" / "tests" / f"gateway-{gateway.port}" / "redis"
    [redis] = _pids_of(f"redis-server 127.0.0.1:{gateway.redis_port}")
    os.kill(redis, signal.SIGKILL)
    (data / "appendonlydir" / "appendonly.aof.manifest").write_text("broken manifest\n")
    assert gateway.process.wait(timeout=90) == 1, gateway.output()[-3000:]
    assert "Redis died 5 times within 60 s; giving up" in gateway.output()
    assert "Traceback" not in gateway.output()
    wait_until(lambda: not _running(started), f"everything stops: {_running(started)}", 20)
    gateway.stop()
