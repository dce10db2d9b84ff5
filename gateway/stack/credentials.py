"""The secrets ``gateway up`` hands to what it starts: the admin key and the embedded
Redis's password, each kept in a file under ``run_dir`` (see :mod:`gateway.stack.secret_file`)
so that every later start, and ``gateway keys``, finds the same one."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from gateway.config import Settings, weak_key_problem
from gateway.stack import secret_file
from gateway.stack.triton_server import is_loopback


def admin_key(settings: Settings) -> Settings:
    """Settings with an admin key: ``GATEWAY_ADMIN_KEY``, else the one generated on an
    earlier start (``<run_dir>/admin_key``, mode 600), else a new one kept there."""
    if settings.admin_key is not None:
        return settings
    path = settings.run_dir / "admin_key"
    key, made = secret_file.keep(
        path,
        usable=lambda kept: weak_key_problem(kept) is None,
        make=lambda: f"sk-gw-{secrets.token_urlsafe(32)}",
    )
    if made:
        # Printed once, when made; later starts only say where it is (logs keep stdout).
        print(
            f"Admin key (generated, kept in {path}; set GATEWAY_ADMIN_KEY to choose one):\n  {key}",
            flush=True,
        )
    else:
        print(f"Admin key: the one in {path}", flush=True)
    return settings.model_copy(update={"admin_key": SecretStr(key)})


def redis_password(settings: Settings, make: bool = True) -> Settings:
    """Settings whose ``redis_url`` (what every replica connects with) carries the embedded
    Redis's password: the URL's own, else the one kept in ``<run_dir>/redis_password``
    (mode 600), which ``make`` generates on the first start so that every later one keeps
    it. ``gateway keys`` reads it (``make=False``) to reach the Redis ``gateway up`` runs.
    A Redis that ``gateway up`` does not start is left as its URL says."""
    url = urlsplit(settings.redis_url)
    embedded = url.scheme == "redis" and is_loopback(url.hostname or "127.0.0.1")
    if not settings.embedded_redis or not embedded or url.password:
        return settings
    path = settings.run_dir / "redis_password"
    if make:
        password, _ = secret_file.keep(path, usable=bool, make=lambda: secrets.token_hex(32))
    elif path.is_file():
        password = path.read_text().strip()
    else:
        return settings
    user, _, hosts = url.netloc.rpartition("@")
    with_password = urlunsplit(url._replace(netloc=f"{user}:{password}@{hosts}"))
    return settings.model_copy(update={"redis_url": with_password})
