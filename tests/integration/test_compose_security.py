"""``compose/docker-compose.yml`` as rendered by ``docker-compose config`` (no Docker engine
needed): Redis asks for the password of ``.env`` and the gateway's URL carries it (both run
here, as rendered), each service shares a network only with the services it talks to, and
the replicas take X-Forwarded-For only from the network nginx reaches them on."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.support.deployed_redis import (
    REFUSED,
    gateway_writes,
    local_url,
    running,
    start_fails,
    with_image_entrypoint,
)
from tests.support.redis_server import ONE_TRY
from tests.support.stack import ROOT

COMPOSE = ROOT / "compose"


def render(tmp_path: Path, **settings: str) -> dict[str, Any]:
    """The compose file with ``.env.example``'s settings, ``settings`` replacing some."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose (Debian package) is installed by make test"
    env = (COMPOSE / ".env.example").read_text()
    for name, value in settings.items():
        env, count = re.subn(rf"^{name}=.*$", f"{name}={value}", env, flags=re.M)
        assert count == 1, name
    env_file = tmp_path / ".env"
    env_file.write_text(env)
    rendered = subprocess.run(
        [binary, "--env-file", str(env_file), "-f", "docker-compose.yml", "config"],
        cwd=COMPOSE,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    config: dict[str, Any] = yaml.safe_load(rendered)
    return config


def unescaped(argv: list[str]) -> list[str]:
    """A rendered command line as the container runs it (``config`` keeps ``$$`` for
    ``$``, so that its output is a compose file again)."""
    return [arg.replace("$$", "$") for arg in argv]


def redis_container(tmp_path: Path, service: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The Redis service's command line and environment as its container runs them."""
    return unescaped(service["command"]), with_image_entrypoint(service["environment"], tmp_path)


def test_redis_asks_for_the_env_password_and_the_gateway_sends_it(tmp_path: Path) -> None:
    services = render(tmp_path, REDIS_PASSWORD=secrets.token_hex(32))["services"]
    server = services["redis"]
    with running(*redis_container(tmp_path, server), tmp_path) as started:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=started.port, retry=ONE_TRY).set("gw:key:{x}", '{"role": "admin"}')
        url = services["gateway"]["environment"]["GATEWAY_REDIS_URL"]
        asyncio.run(gateway_writes(local_url(url, "redis", started.port)))
        # The health check (redis-cli, in the container's environment) still passes.
        _, probe, *args = server["healthcheck"]["test"]
        answer = subprocess.run(
            [probe, "-p", str(started.port), *args],
            env={"PATH": os.environ["PATH"], **server["environment"]},
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert answer.stdout.strip() == "PONG", answer


def test_redis_does_not_start_with_the_example_password(tmp_path: Path) -> None:
    # A forgotten REDIS_PASSWORD stops the stack at the start, as a forgotten admin key does.
    server = render(tmp_path)["services"]["redis"]
    assert start_fails(*redis_container(tmp_path, server), tmp_path) == REFUSED


def test_each_service_reaches_only_what_it_talks_to(tmp_path: Path) -> None:
    config = render(tmp_path, REDIS_PASSWORD=secrets.token_hex(32))
    services = config["services"]
    networks = {name: set(service["networks"]) for name, service in services.items()}

    def peers(name: str) -> set[str]:
        """The services that share a network with ``name`` (and so reach all its ports)."""
        return {other for other in services if other != name and networks[other] & networks[name]}

    # Redis: the replicas alone, on a network with no way out.
    assert peers("redis") == {"gateway"}
    assert config["networks"][next(iter(networks["redis"]))]["internal"] is True
    # Triton (no authentication, model control on): the replicas, and Prometheus for :8002.
    assert peers("triton") == {"gateway", "prometheus"}
    assert peers("grafana") == {"prometheus"}
    assert peers("nginx-exporter") == {"nginx", "prometheus"}
    # Only nginx publishes a port beyond the host's loopback.
    published = {
        name
        for name, service in services.items()
        for port in service.get("ports", [])
        if not str(port).startswith("127.0.0.1:")
    }
    assert published == {"nginx"}


def test_the_replicas_take_forwarded_addresses_from_nginx_only(tmp_path: Path) -> None:
    config = render(tmp_path, REDIS_PASSWORD=secrets.token_hex(32))
    services = config["services"]
    trusted = services["gateway"]["environment"]["FORWARDED_ALLOW_IPS"]
    assert trusted != "*"
    # The one network it names is the one where nginx reaches the replicas, and nobody
    # else is on it: Prometheus, Grafana and the rest reach the replicas from other
    # networks, so a header they make up is ignored (the audit log records their address).
    [edge] = [
        name
        for name, network in config["networks"].items()
        if [c["subnet"] for c in (network or {}).get("ipam", {}).get("config", [])] == [trusted]
    ]
    on_edge = {name for name, service in services.items() if edge in service["networks"]}
    assert on_edge == {"nginx", "gateway"}
    # nginx reaches the replicas on that network alone.
    assert set(services["nginx"]["networks"]) & set(services["gateway"]["networks"]) == {edge}
