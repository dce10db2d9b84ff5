"""Runs a real ``redis-server`` (the Debian package) as a child process: for ``gateway up``,
the tests and the benchmarks. Data persists in an append-only file in its directory, so
keys and sessions survive a restart of the stack.

``gateway up`` gives it a password (without one, any local user could write a key record
with the admin role) and a ``maxmemory`` with the ``noeviction`` policy (when full, writes
fail, and the gateway answers 503, rather than Redis evicting keys or rate-limit windows
silently). The password reaches it on its standard input, never on its command line, which
every local user can read (``ps``). Its directory is its owner's alone: the data holds
sessions and key records.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.stack import processes


class EmbeddedRedisError(RuntimeError):
    """redis-server could not be started; the message says why."""


class EmbeddedRedis:
    def __init__(
        self,
        directory: Path,
        port: int,
        host: str = "127.0.0.1",
        password: str | None = None,
        maxmemory_mb: int | None = None,
    ) -> None:
        """No ``password``: anyone who reaches the port may use it (tests); no
        ``maxmemory_mb``: no memory limit."""
        self.directory = directory.resolve()
        self.port = port
        self.host = host
        self.password = password
        self.maxmemory_mb = maxmemory_mb
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

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
        self.directory.chmod(0o700)
        # Flags (no config file): loopback, persistence by append-only file, the memory
        # limit; "-" first: the password follows on stdin.
        command = [binary, "-"] if self.password else [binary]
        if self.maxmemory_mb is not None:
            command += [
                "--maxmemory",
                f"{self.maxmemory_mb}mb",
                "--maxmemory-policy",
                "noeviction",
            ]
        self.process = processes.spawn(
            [
                *command,
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
            stdin=subprocess.PIPE if self.password else None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        if self.password and self.process.stdin is not None:
            # In double quotes, every byte as \xHH: any password is one config argument.
            quoted = "".join(f"\\x{byte:02x}" for byte in self.password.encode())
            try:
                self.process.stdin.write(f'requirepass "{quoted}"\n'.encode())
                self.process.stdin.close()
            except OSError:  # it exited at once: the wait below says why
                pass
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
        client = redis.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            # One try: redis-py's default retries a refused connection with a back-off of
            # seconds, which made every start (and a crash loop's every try) that much
            # slower to notice; the caller polls anyway.
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM: Redis flushes its append-only file and exits."""
        process, self.process = self.process, None
        processes.stop(process, signal.SIGTERM, timeout_s)
