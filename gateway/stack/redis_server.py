"""Runs a real ``redis-server`` (the Debian package) as a child process: for ``gateway up``,
the tests and the benchmarks. Data persists in an append-only file in its directory, so
keys and sessions survive a restart of the stack."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from gateway.stack import processes


class EmbeddedRedisError(RuntimeError):
    """redis-server could not be started; the message says why."""


class EmbeddedRedis:
    def __init__(self, directory: Path, port: int, host: str = "127.0.0.1") -> None:
        self.directory = directory.resolve()
        self.port = port
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Starts the server and returns once it answers PING."""
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if binary is None:
            raise EmbeddedRedisError(
                "redis-server is not installed: run `make run` (it installs the Debian "
                "package redis-server), or point GATEWAY_REDIS_URL at a running Redis "
                "with GATEWAY_EMBEDDED_REDIS=false"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        # Flags only (no config file): loopback, persistence by append-only file.
        self.process = processes.spawn(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                self.host,
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(self.log_path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedRedisError(
                    f"redis-server exited with code {self.process.returncode}; the end of "
                    f"{self.log_path}:\n{processes.log_tail(self.log_path, 10)}"
                )
            if self.answers():
                return self
            time.sleep(0.05)
        raise EmbeddedRedisError(f"redis-server did not answer on port {self.port}")

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM: Redis flushes its append-only file and exits."""
        process, self.process = self.process, None
        processes.stop(process, signal.SIGTERM, timeout_s)
