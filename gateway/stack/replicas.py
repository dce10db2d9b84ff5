"""Gateway replicas behind nginx, for ``gateway up``.

Each replica is a ``gateway serve`` child process on a loopback port of its own, started with
the parent's resolved settings as ``GATEWAY_*`` variables, so every replica serves exactly
the same configuration (the admin key included). They share Redis, so they behave as one;
``PROMETHEUS_MULTIPROC_DIR`` makes ``/metrics`` of any replica report all of them. A replica
that dies is started again on its port; nginx sends its requests to the others meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client import multiprocess
from pydantic import SecretStr

from gateway.config import Settings
from gateway.stack import processes


class ReplicaError(RuntimeError):
    """A replica could not be started; the message says why."""


def settings_env(settings: Settings) -> dict[str, str]:
    """``settings`` as the ``GATEWAY_*`` variables that rebuild them in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, dict):  # read back as JSON, as pydantic-settings does
            value = json.dumps(value, default=str)  # nested too (GATEWAY_PRICES)
        env[f"GATEWAY_{name.upper()}"] = str(value)
    return env


def metrics_dir(run_dir: Path) -> Path:
    """An empty directory for the replicas' metric files (old samples would be summed in)."""
    path = (run_dir / "metrics").resolve()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class Replica:
    def __init__(self, port: int, env: dict[str, str], metrics: Path) -> None:
        self.port = port
        self.env = env
        self.metrics = metrics
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        # A session of its own: Ctrl-C reaches `gateway up`, which stops replicas in order.
        command = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1"]
        self.process = processes.spawn(
            [*command, "--port", str(self.port)],
            env={**os.environ, **self.env, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics)},
        )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait_live(self, timeout_s: float, retry_port: Callable[[], int] | None = None) -> None:
        """Waits until the replica answers. ``retry_port``: when it exited because another
        process took its port between the pick and its bind, it starts again (twice at
        most) on a new port from it."""
        deadline = time.monotonic() + timeout_s
        retries = 2 if retry_port is not None else 0
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self.exited()
                if code is not None and retries and retry_port is not None and _taken(self.port):
                    retries -= 1
                    self.forget()
                    self.port = retry_port()
                    self.start()
                    continue
                if code is not None:
                    raise ReplicaError(f"the gateway replica on port {self.port} exited ({code})")
                try:
                    if client.get(f"http://{self.address}/health/live").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise ReplicaError(f"the gateway replica on port {self.port} did not start")

    def forget(self) -> None:
        """Drops a dead process's live gauges from the shared metrics."""
        if self.process is not None:
            multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                self.process.pid, str(self.metrics)
            )


def _taken(port: int) -> bool:
    """Whether another process listens on ``port`` (a replica that exited found it taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def stop_all(replicas: list[Replica], timeout_s: float) -> None:
    """SIGTERM to every replica at once: each drains (new requests 503, those in flight run
    to their end), then exits; ``timeout_s`` later what is left is killed."""
    processes.stop_all([r.process for r in replicas], signal.SIGTERM, timeout_s)
    for replica in replicas:
        replica.forget()
        replica.process = None
