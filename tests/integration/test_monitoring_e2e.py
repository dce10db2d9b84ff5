"""Monitoring that runs: a real Prometheus (Debian's ``prometheus`` package) with the compose
stack's scrape config (``compose/prometheus.yml``, its targets on loopback: same jobs, same
settings) and alert rules (``compose/alerts.yml``) scrapes a stack of its own, with
``prometheus-nginx-exporter`` on nginx's ``stub_status``. After real traffic every query of
every Grafana panel and every metric every alert names returns series, so a renamed metric
or job fails here; and Redis going down shows in ``gateway_redis_up`` and its alert.

The alerts' logic is unit-tested by ``promtool test rules`` (tests/unit/test_alerts.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.stack.redis_server import EmbeddedRedis
from tests.support.audio import wav_bytes
from tests.support.monitoring import ALERTS, ELSEWHERE, ROOT, dashboard_panels
from tests.support.redis_server import redis_server
from tests.support.stack import GatewayProcess, free_port

pytestmark = pytest.mark.integration

#: Grafana's $__rate_interval here: at least 4 scrapes (1 s apart) in every rate().
RATE_INTERVAL = "15s"
#: The stack's models: weightless chat, speech and transcription stand-ins.
MODELS = ["mock_chat", "custom_tts", "custom_stt"]
HI = [{"role": "user", "content": "hi"}]


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is installed by make (Debian's prometheus packages)"
    return found


def scrape_config(targets: dict[str, str]) -> dict[str, Any]:
    """compose/prometheus.yml with each job's targets replaced by ``targets[job]`` (and 1 s
    scrapes and evaluations): a job renamed or added there fails here."""
    config = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(targets), f"compose/prometheus.yml's jobs: {sorted(jobs)}"
    for name, job in jobs.items():
        for key in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[key]
        job["static_configs"] = [{"targets": [targets[name]]}]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(ROOT / "compose" / path) for path in config["rule_files"]]
    return config


@dataclass
class Monitored:
    stack: GatewayProcess
    redis: EmbeddedRedis
    url: str
    """Prometheus's."""

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        assert answer.status_code == 200, (promql, answer.text)
        result: list[dict[str, Any]] = answer.json()["data"]["result"]
        return result

    def api(self, path: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]

    def empty_after(self, queries: list[str], timeout_s: float) -> list[str]:
        """The queries that still return no series after ``timeout_s``: each is asked
        again until it returns some (a rate() needs two scrapes after its first sample)."""
        waiting = list(queries)
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            waiting = [q for q in waiting if not self.query(q)]
            if waiting:
                time.sleep(0.5)
        return waiting


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    work = tmp_path_factory.mktemp("monitoring")
    redis = redis_server(work / "redis")  # the test stops it: not the stack's to restart
    stack = GatewayProcess(
        models=MODELS,
        redis_url=redis.url,
        env={
            "GATEWAY_REDIS_CHECK_INTERVAL_S": "0.5",
            "GATEWAY_REDIS_TIMEOUT_S": "0.5",
            "GATEWAY_PRICES": '{"*": {"input": 1, "output": 2}}',
            # One request in flight per model and one waiting, per replica: a burst sheds.
            "GATEWAY_TRITON_MAX_INFLIGHT": "1",
            "GATEWAY_QUEUE_MAX_WAITING": "1",
        },
    ).start()
    exporter_port, prometheus_port = free_port(), free_port()
    processes = []
    try:
        # Started with the stack, so their first scrapes (5-6 s in) are done when it is up.
        processes.append(
            _start(
                [
                    binary("prometheus-nginx-exporter"),
                    f"-nginx.scrape-uri={stack.internal_url}/nginx_status",
                    f"-web.listen-address=127.0.0.1:{exporter_port}",
                    "-nginx.retries=600",
                    "-nginx.retry-interval=500ms",
                ],
                work / "nginx-exporter.log",
            )
        )
        config = scrape_config(
            {
                # nginx's internal listener hands /metrics to a replica, which reports every
                # replica's samples (their shared multiprocess directory).
                "gateway": stack.internal_url.removeprefix("http://"),
                "triton": f"127.0.0.1:{stack.metrics_port}",
                "nginx": f"127.0.0.1:{exporter_port}",
                "prometheus": f"127.0.0.1:{prometheus_port}",
            }
        )
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        checked = subprocess.run(
            [binary("promtool"), "check", "config", str(work / "prometheus.yml")],
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        processes.append(
            _start(
                [
                    binary("prometheus"),
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                work / "prometheus.log",
            )
        )
        stack.wait_ready()
        yield Monitored(stack, redis, f"http://127.0.0.1:{prometheus_port}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        stack.stop()
        redis.stop()


def test_every_job_of_the_compose_config_is_scraped(monitored: Monitored) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        targets = monitored.api("targets")["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if set(health.values()) == {"up"}:
            break
        time.sleep(0.5)
    assert health == dict.fromkeys(["gateway", "triton", "nginx", "prometheus"], "up"), targets


def _traffic(stack: GatewayProcess) -> None:
    """What the panels need: streamed chat (time to first token, inter-token latency,
    tokens), a model failing mid-stream (Triton errors) and before its answer (a 500), a
    429 (rate-limited, 4xx), speech and a transcription (audio seconds), money spent by a
    key of a project under a budget (spend, budget used)."""
    client = stack.client()
    created = httpx.post(
        stack.base_url + "/admin/projects",
        json={"id": "monitored", "budget": {"cost_per_month": 100}},
        headers=stack.headers,
        timeout=10,
    )
    assert created.status_code == 201, created.text
    spender = stack.client(stack.create_key("spender", project="monitored")["key"])
    spender.chat.completions.create(model="mock_chat", messages=HI)
    # A burst past the slots and the queue of both replicas: some are shed with 503.
    slow = [{"role": "user", "content": "[mock:delay_ms=100] hi"}]
    burst = stack.client()

    def one(_: int) -> str:
        try:
            burst.chat.completions.create(model="mock_chat", messages=slow, max_tokens=8)
        except openai.APIStatusError as exc:
            return str(exc.status_code)
        return "200"

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, range(8)))
    assert "503" in statuses and "200" in statuses, statuses
    for _ in client.chat.completions.create(model="mock_chat", messages=HI, stream=True):
        pass
    failing = [{"role": "user", "content": "[mock:fail_after=1] hi"}]
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="mock_chat", messages=failing, stream=True):
            pass
    failing_at_once = [{"role": "user", "content": "[mock:fail_after=0] hi"}]
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="mock_chat", messages=failing_at_once)
    limited = stack.client(stack.create_key("monitored", rpm=1)["key"])
    limited.chat.completions.create(model="mock_chat", messages=HI)
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(model="mock_chat", messages=HI)
    speech = client.audio.speech.create(
        model="custom_tts", voice="alloy", input="hello there", response_format="pcm"
    )
    heard = client.audio.transcriptions.create(
        model="custom_stt", file=("s.wav", wav_bytes(speech.content)), response_format="text"
    )
    assert "hello there" in str(heard)


def test_every_dashboard_panel_and_every_alert_returns_series_after_traffic(
    monitored: Monitored,
) -> None:
    _traffic(monitored.stack)
    queries = {
        expr.replace("$__rate_interval", RATE_INTERVAL): title
        for title, exprs in dashboard_panels()
        for expr in exprs
    }
    assert len(queries) >= 30
    rules = monitored.api("rules")["groups"]
    alerts = {r["name"]: r for group in rules for r in group["rules"] if r["type"] == "alerting"}
    shipped = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert sorted(alerts) == sorted(shipped)
    # Every metric an alert reads, with the alert's own label matchers.
    selectors = {
        selector: name
        for name, rule in alerts.items()
        for selector in re.findall(
            r"\b(?:gateway_\w+|nv_\w+|nginx_\w+|up)(?:\{[^}]*\})?", rule["query"]
        )
    }
    # Only what reads a metric this stack cannot export may be empty (asked once, at the
    # end: the others had the time to show).
    elsewhere = [q for q in [*queries, *selectors] if any(metric in q for metric in ELSEWHERE)]
    expected = [q for q in [*queries, *selectors] if q not in elsewhere]
    empty = monitored.empty_after(expected, timeout_s=20)
    assert not empty, [(q, queries.get(q) or selectors.get(q)) for q in empty]
    print("no series (checked elsewhere):", [q for q in elsewhere if not monitored.query(q)])
    limited = monitored.query('gateway_rate_limited_total{limit="requests"}')
    assert float(limited[0]["value"][1]) >= 1
    assert monitored.query('gateway_triton_errors_total{code="model_error",model="mock_chat"}')
    for name, rule in alerts.items():  # evaluated, without errors
        assert rule["health"] == "ok", (name, rule.get("lastError"))


def test_redis_down_shows_in_gateway_redis_up_and_its_alert(monitored: Monitored) -> None:
    assert monitored.empty_after(["gateway_redis_up == 1"], timeout_s=10) == []
    monitored.redis.stop()
    try:
        assert monitored.empty_after(["gateway_redis_up == 0"], timeout_s=15) == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = {
                r["name"]: r["state"] for g in monitored.api("rules")["groups"] for r in g["rules"]
            }
            if states["RedisDown"] == "pending":  # firing after its minute
                break
            time.sleep(0.5)
        assert states["RedisDown"] == "pending", states
    finally:
        monitored.redis.start()
    assert monitored.empty_after(["gateway_redis_up == 1"], timeout_s=15) == []
