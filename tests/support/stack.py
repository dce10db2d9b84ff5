"""Starts the real stack (``gateway up``: Redis, Triton from the nvidia-pytriton wheel and the
gateway) as a subprocess on free ports, for integration tests and benchmarks: a test's stack
is ``GatewayProcess(...).running()`` (a fixture's) or ``.ready()`` (one the test stops)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.stack.triton_server import free_port
from tests.support.audio import silence, wav_bytes

ROOT = Path(__file__).resolve().parents[2]
#: The admin key every test stack is started with (GATEWAY_ADMIN_KEY).
ADMIN_KEY = "sk-gw-9fQ2wLx7Rk4Nv8Hc3Mb6Pz1Jd5Ty0Ga"


@dataclass
class GatewayProcess:
    """One ``python -m gateway up`` process and the ports it was given: nginx on ``port`` in
    front of two gateway replicas (``nginx=False``: one gateway process on ``port``)."""

    models: list[str] = field(default_factory=lambda: ["mock_chat"])
    triton_url: str | None = None
    redis_url: str | None = None
    """A running Redis; None: ``gateway up`` starts its own on a free port."""
    admin_key: str = ADMIN_KEY
    run_dir: Path = ROOT / ".run" / "tests"
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    nginx_internal_port: int = field(default_factory=free_port)
    nginx: bool = True
    env: dict[str, str] = field(default_factory=dict)
    """More GATEWAY_* settings."""
    process: subprocess.Popen[str] | None = None

    @property
    def internal_url(self) -> str:
        """nginx's internal listener (/metrics, /nginx_status)."""
        return f"http://127.0.0.1:{self.nginx_internal_port}"

    def replica_addresses(self) -> list[str]:
        """host:port of each gateway replica behind nginx, as ``gateway up`` printed them
        (just after nginx started: the stack can answer before the line is written)."""
        pattern = r"gateway replicas on (\S+(?:, \S+)*) \(nginx logs: (\S+)\)"
        deadline = time.monotonic() + 10
        while not (match := re.search(pattern, self.output())) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert match, self.output()
        return match.group(1).split(", ")

    def nginx_access_log(self) -> list[dict[str, Any]]:
        """nginx's access log: one JSON object per request."""
        match = re.search(r"\(nginx logs: (\S+)\)", self.output())
        assert match, self.output()
        text = (Path(match.group(1)) / "access.log").read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def replica_pid(self, address: str) -> int:
        """The process id of the replica serving ``address``."""
        port = address.rsplit(":", 1)[1]
        found = subprocess.run(
            ["pgrep", "-f", "--", f"gateway serve --host 127.0.0.1 --port {port}$"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert len(found) == 1, found
        return int(found[0])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The admin key's Authorization header, for raw HTTP calls."""
        return {"Authorization": f"Bearer {self.admin_key}"}

    def create_key(self, name: str = "test", **spec: Any) -> dict[str, Any]:
        """A new key made through the admin API (``spec``: role, limits, models...): the
        answer of ``POST /admin/keys``, with its ``id`` and its ``key`` (the secret)."""
        created = httpx.post(
            self.base_url + "/admin/keys",
            json={"name": name, **spec},
            headers=self.headers,
            timeout=10,
        )
        assert created.status_code == 201, created.text
        return created.json()  # type: ignore[no-any-return]

    def user_headers(self) -> dict[str, str]:
        """The Authorization header of a new user key with limits it will not reach: every
        request then takes the whole Redis path (key lookup, admission, usage)."""
        key = self.create_key("bench", rpm=10**9, tpm=10**12, max_concurrency=10**4)["key"]
        return {"Authorization": f"Bearer {key}"}

    def client(self, key: str | None = None) -> openai.OpenAI:
        """The official SDK against this gateway, with ``key`` (default: the admin key)."""
        return openai.OpenAI(
            base_url=self.base_url + "/v1", api_key=key or self.admin_key, max_retries=0
        )

    def async_client(self, key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url + "/v1", api_key=key or self.admin_key, max_retries=0
        )

    def clear_speech(self, text: str, heard: str, voice: str = "alloy") -> bytes:
        """Piper's rendition of ``text`` through this stack (24 kHz pcm16, unpadded) in which
        Whisper tiny hears ``heard`` (case-insensitive) three times: bare, with 0.2 s of
        silence before and 0.1 s after, and with 0.3 s before and 0.5 s after (a VAD's cut
        keeps some silence around speech: server_vad's default prefix_padding_ms and
        silence_duration_ms). Piper's synthesis is random (its noise scales), and now and then
        Whisper tiny mishears a rendition ("the capital of friends"), sometimes only with
        silence around it: not what the tests that speak to the gateway test. At most five
        renditions."""
        client = self.client()
        said = ""
        for _ in range(5):
            pcm = client.audio.speech.create(
                model="piper_tts", voice=voice, input=text, response_format="pcm"
            ).content
            for before, after in ((0, 0), (0.2, 0.1), (0.3, 0.5)):
                padded = silence(before) + pcm + silence(after)
                said = client.audio.transcriptions.create(
                    model="whisper_stt",
                    file=("said.wav", wav_bytes(padded)),
                    response_format="text",
                )
                if heard.lower() not in str(said).lower():
                    break  # misheard: the next rendition
            else:  # heard in every padding
                return pcm
        raise AssertionError(f"Whisper never heard {heard!r} in Piper's {text!r}: {said!r}")

    @property
    def triton_grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def triton_metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "gateway",
            "up",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        if self.redis_url:
            command += ["--redis-url", self.redis_url]
        if not self.nginx:
            command.append("--no-nginx")
        if self.triton_url:
            return [*command, "--triton-url", self.triton_url]
        return [
            *command,
            "--models",
            ",".join(self.models),
            "--triton-grpc-port",
            str(self.grpc_port),
            "--triton-http-port",
            str(self.http_port),
            "--triton-metrics-port",
            str(self.metrics_port),
        ]

    def start(self) -> GatewayProcess:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # A process on the same port in an earlier run may have left its files (a Redis
        # whose data a test broke on purpose): each start begins with none.
        shutil.rmtree(self.run_dir / f"gateway-{self.port}", ignore_errors=True)
        env = {
            **os.environ,
            # Each process its own run dir: an embedded Redis keeps its files there.
            "GATEWAY_RUN_DIR": str(self.run_dir / f"gateway-{self.port}"),
            "GATEWAY_ADMIN_KEY": self.admin_key,
            "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "GATEWAY_NGINX_INTERNAL_PORT": str(self.nginx_internal_port),
            # A test stack's Triton stops within seconds: the LLM API stand-in, as upstream,
            # never answers an aborted non-streamed request, which held every stop 30 s.
            "GATEWAY_TRITON_EXIT_TIMEOUT_S": "3",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        self.log = (self.run_dir / f"gateway-{self.port}.log").open("w")
        self.process = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return self

    def ready(self, timeout_s: float = 300.0, path: str = "/health/ready") -> GatewayProcess:
        """Started and answering 200 on ``path`` (stopped again if it never does); the
        caller stops it. :meth:`running` is the same for a ``with`` block."""
        self.start()
        try:
            self.wait_ready(timeout_s, path)
        except BaseException:
            self.stop()
            raise
        return self

    @contextmanager
    def running(
        self, timeout_s: float = 300.0, path: str = "/health/ready", clean_exit: bool = False
    ) -> Iterator[GatewayProcess]:
        """Started and ready for the ``with`` block (a fixture's stack), told to stop after
        it (:meth:`stop_soon`: :func:`wait_stopped` waits for it at the pytest session's
        end; outside pytest, call it yourself); ``clean_exit``: the stop is waited for at
        once and, the block having passed, must be a clean one (SIGTERM -> exit 0)."""
        self.ready(timeout_s, path)
        try:
            yield self
        finally:
            if clean_exit:
                code = self.stop()
            else:
                self.stop_soon()
        if clean_exit:
            assert code == 0, self.output()

    def output(self) -> str:
        return (self.run_dir / f"gateway-{self.port}.log").read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 300.0, path: str = "/health/ready") -> None:
        deadline = time.monotonic() + timeout_s
        assert self.process is not None
        with httpx.Client(timeout=2) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"gateway up exited early:\n{self.output()}")
                try:
                    if http.get(self.base_url + path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.25)
        raise RuntimeError(f"gateway up not ready after {timeout_s} s:\n{self.output()}")

    def stop_soon(self) -> None:
        """SIGTERM without waiting: the worker goes on with its next tests while the stack
        drains and stops (3 to 5 s, mostly Triton unloading its models one stub at a time);
        :func:`wait_stopped` waits for it when the worker's session ends."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        STOPPING.append(self)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, as a service manager would; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


#: The stacks told to stop and not waited for (:meth:`GatewayProcess.stop_soon`).
STOPPING: list[GatewayProcess] = []


def wait_stopped() -> None:
    """Waits for (or kills) every stack :meth:`GatewayProcess.stop_soon` left stopping."""
    try:
        while STOPPING:
            STOPPING[-1].stop()
            STOPPING.pop()
    finally:  # interrupted: the rest are killed, not left running
        for stack in STOPPING:
            if stack.process is not None and stack.process.poll() is None:
                stack.process.kill()
        STOPPING.clear()
