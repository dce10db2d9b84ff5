"""The Redis of a deployment file (``k8s/``, ``compose/``) run for real: its container's
command line and environment, as rendered, run here on a free loopback port, and the URL
the same file gives the gateway pointed at it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import redis

from gateway.state.redis import connect, ping
from tests.support.redis_server import NOT_YET, ONE_TRY
from tests.support.stack import free_port
from tests.support.waiting import wait_until

#: The exit status of the deployments' Redis start script when the password is unfit.
REFUSED = 64


def local_url(url: str, host: str, port: int) -> str:
    """``url`` (a gateway's ``GATEWAY_REDIS_URL`` naming ``host:6379``) with that address
    replaced by ``127.0.0.1:port``, its password kept."""
    local, count = re.subn(rf"(?<=[@/]){re.escape(host)}:6379(?=/|$)", f"127.0.0.1:{port}", url)
    assert count == 1, f"{url!r} names {host}:6379 once"
    return local


def with_image_entrypoint(env: Mapping[str, str], directory: Path) -> dict[str, str]:
    """``env`` with a stand-in for the Redis image's ``docker-entrypoint.sh`` first on
    ``PATH``. The deployments' command hands over to it; run as the redis user (as the
    pod does, or once it has handed over from root to that user, as compose runs it) it
    runs its arguments, as this stand-in does."""
    folder = directory / "image-bin"
    folder.mkdir(exist_ok=True)
    script = folder / "docker-entrypoint.sh"
    script.write_text('#!/bin/sh\nexec "$@"\n')
    script.chmod(0o755)
    return {**env, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@dataclass
class Started:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _command(argv: Sequence[str], port: int, directory: Path) -> list[str]:
    # The container's data folder is this machine's ``directory`` (Redis enters it as it
    # reads the option, so it must exist); the port and address follow the container's
    # options, and a later option wins.
    command = list(argv)
    if "--dir" in command:
        command[command.index("--dir") + 1] = str(directory)
    else:
        command += ["--dir", str(directory)]
    return [*command, "--port", str(port), "--bind", "127.0.0.1"]


def start_fails(argv: Sequence[str], env: Mapping[str, str], directory: Path) -> int:
    """Runs the container's command line expecting it to stop by itself; its exit status."""
    done = subprocess.run(
        _command(argv, free_port(), directory),
        env={**os.environ, **env},
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.returncode


@contextmanager
def running(argv: Sequence[str], env: Mapping[str, str], directory: Path) -> Iterator[Started]:
    """The container's command line (``argv``, then this machine's port, address and data
    folder) with the container's environment ``env``, until it answers (any answer,
    ``NOAUTH`` included)."""
    port = free_port()
    log = directory / "redis.log"
    process = subprocess.Popen(
        _command(argv, port, directory),
        env={**os.environ, **env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    started = Started(port, process, log)

    def answers() -> bool:
        assert process.poll() is None, f"Redis stopped: {started.output()}"
        with suppress(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=1, retry=ONE_TRY).ping()
        return True

    try:
        wait_until(answers, "the deployment's Redis answers", 10, retry_on=NOT_YET)
        yield started
    finally:
        process.terminate()
        process.wait(timeout=10)


async def gateway_writes(url: str) -> None:
    """The gateway's own Redis client, given ``url`` as a deployment gives it, connects,
    pings and writes."""
    client = connect(url, timeout_s=2, max_connections=2)
    try:
        assert await ping(client)
        await client.set("gw:deployed", "1")
        assert await client.get("gw:deployed") == "1"
    finally:
        await client.aclose()
