"""The ``gateway`` command.

``gateway up`` runs the whole stack in the foreground: Redis (``redis-server``), the real
Triton server from the ``nvidia-pytriton`` wheel with the models of ``triton_repo/`` (or an
external Triton with ``--triton-url``), then the OpenAI API under uvicorn. Ctrl-C or
SIGTERM stops them all. ``gateway keys create | list | revoke`` manages API keys in Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import uvicorn
from pydantic import SecretStr, ValidationError

from gateway.api.middleware import Drain
from gateway.app import create_app
from gateway.backend import pool
from gateway.config import Settings, weak_key_problem
from gateway.errors import GatewayError
from gateway.stack import processes, secret_file
from gateway.stack.nginx import EmbeddedNginx, EmbeddedNginxError
from gateway.stack.redis_server import EmbeddedRedis, EmbeddedRedisError
from gateway.stack.replicas import Replica, ReplicaError, metrics_dir, settings_env
from gateway.stack.replicas import stop_all as stop_replicas
from gateway.stack.supervisor import GiveUp, Supervisor
from gateway.stack.triton_server import (
    EmbeddedTriton,
    EmbeddedTritonError,
    ensure_port_free,
    free_port,
    is_loopback,
)
from gateway.state.keys import ApiKey, KeyCreate, KeyStore
from gateway.state.redis import CLUSTER_SCHEME, SENTINEL_SCHEME, connect, migrate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up", help="run Triton and the OpenAI API in the foreground (Ctrl-C stops both)"
    )
    up.add_argument("--host", help="address of the OpenAI API (GATEWAY_HOST)")
    up.add_argument("--port", type=int, help="port of the OpenAI API (GATEWAY_PORT)")
    up.add_argument(
        "--triton-url",
        help="use this running Triton (gRPC host:port) instead of starting one",
    )
    up.add_argument("--models", help="comma-separated models to load (GATEWAY_MODELS)")
    up.add_argument("--triton-grpc-port", type=int, help="gRPC port of the embedded Triton")
    up.add_argument("--triton-http-port", type=int, help="HTTP port of the embedded Triton")
    up.add_argument("--triton-metrics-port", type=int, help="metrics port of the embedded Triton")
    up.add_argument(
        "--redis-url", help="use this running Redis (GATEWAY_REDIS_URL) instead of starting one"
    )
    up.add_argument(
        "--replicas", type=int, help="gateway processes behind nginx (GATEWAY_REPLICAS)"
    )
    up.add_argument(
        "--no-nginx",
        action="store_true",
        help="one gateway process serves the port itself (GATEWAY_EMBEDDED_NGINX=false)",
    )
    up.add_argument("--log-level", help="gateway log level (GATEWAY_LOG_LEVEL)")

    serve = commands.add_parser(
        "serve", help="serve the API only, with settings from GATEWAY_* (a replica, a container)"
    )
    serve.add_argument("--host", help="address to listen on (GATEWAY_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (GATEWAY_PORT)")

    keys = commands.add_parser("keys", help="manage API keys (in the Redis of GATEWAY_REDIS_URL)")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument("--role", choices=["user", "admin"], default="user")
    create.add_argument("--models", help="comma-separated models it may use (default: all)")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute")
    create.add_argument("--max-concurrency", type=int, help="requests running at once")
    create.add_argument("--expires-in-days", type=float, help="days until it stops working")
    actions.add_parser("list", help="list keys (never the keys themselves)")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    for sub in actions.choices.values():
        sub.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {"host": args.host, "port": args.port}
    if args.command == "serve":
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    overrides |= {
        "models": args.models,
        "triton_http_port": args.triton_http_port,
        "triton_metrics_port": args.triton_metrics_port,
        "log_level": args.log_level,
        "replicas": args.replicas,
    }
    if args.no_nginx:
        overrides["embedded_nginx"] = False
    if args.redis_url:
        overrides.update(redis_url=args.redis_url, embedded_redis=False)
    if args.triton_url:
        overrides.update(triton_url=args.triton_url, embedded_triton=False)
    elif args.triton_grpc_port:
        overrides["triton_url"] = f"127.0.0.1:{args.triton_grpc_port}"
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


class _Terminated(Exception):
    """SIGTERM or SIGINT arrived: stop everything in order."""


class _Signals:
    """SIGTERM and SIGINT stop ``gateway up``. The first one raises :class:`_Terminated`
    wherever the main thread is (a wait during start-up included); every later one only
    says that the stop is under way, so it can never cut the cleanup short."""

    def __init__(self) -> None:
        self.raised = False

    def install(self) -> _Signals:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def hold(self) -> None:
        """From now on no signal raises (the cleanup has begun)."""
        self.raised = True

    def _handle(self, _signum: int, _frame: types.FrameType | None) -> None:
        if not self.raised:
            self.raised = True
            raise _Terminated
        print("Stopping: waiting for requests in flight and the servers...", flush=True)


# uvicorn handles SIGINT/SIGTERM while it serves and re-raises the signal after its graceful
# shutdown; both paths end here, so an operator's stop is a clean exit (0).
_STOP_REQUESTS = (_Terminated, KeyboardInterrupt)


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


def _redis(settings: Settings) -> EmbeddedRedis:
    """The embedded Redis at the host and port of ``redis_url``, with its password."""
    url = urlsplit(settings.redis_url)
    if url.scheme in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        raise EmbeddedRedisError(
            "GATEWAY_REDIS_URL names Redis Sentinels or a Redis Cluster: the gateway cannot "
            "start those itself; set GATEWAY_EMBEDDED_REDIS=false (or pass --redis-url)"
        )
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    if not is_loopback(host):
        raise EmbeddedRedisError(
            f"the embedded Redis listens on loopback only, and GATEWAY_REDIS_URL names "
            f"{host}: use 127.0.0.1, or set GATEWAY_EMBEDDED_REDIS=false to use a Redis "
            "of your own there"
        )
    ensure_port_free(
        host,
        port,
        "Redis",
        "GATEWAY_REDIS_URL (or use the Redis already there: GATEWAY_EMBEDDED_REDIS=false)",
    )
    password = unquote(url.password) if url.password else None
    redis = EmbeddedRedis(
        settings.run_dir / "redis", port, host, password, settings.redis_maxmemory_mb
    )
    print(
        f"Starting Redis on {host}:{port} (data: {redis.directory}, "
        f"maxmemory {settings.redis_maxmemory_mb} MB)",
        flush=True,
    )
    return redis


def _triton(settings: Settings) -> EmbeddedTriton | None:
    if not settings.embedded_triton:
        print(f"Using the Triton server(s) at {settings.triton_url}", flush=True)
        return None
    if pool.is_pool(settings.triton_url):
        raise EmbeddedTritonError(
            "GATEWAY_TRITON_URL names several Triton servers: `gateway up` starts one "
            "itself; set GATEWAY_EMBEDDED_TRITON=false (or pass --triton-url) to use those"
        )
    host, _, port = settings.triton_url.rpartition(":")
    if host and not is_loopback(host):
        raise EmbeddedTritonError(
            f"the embedded Triton listens on loopback only, and GATEWAY_TRITON_URL names "
            f"{host}: use 127.0.0.1, or set GATEWAY_EMBEDDED_TRITON=false to use a Triton "
            "of your own there"
        )
    triton = EmbeddedTriton(
        repository=settings.model_repository,
        models=settings.models,
        run_dir=settings.run_dir,
        grpc_port=int(port),
        http_port=settings.triton_http_port,
        metrics_port=settings.triton_metrics_port,
        host=host or "127.0.0.1",
    )
    print(
        f"Starting Triton with models {', '.join(settings.models)} (log: {triton.log_path})",
        flush=True,
    )
    return triton


@dataclass
class _Parts:
    """What ``gateway up`` started, so that the cleanup stops exactly that."""

    redis: EmbeddedRedis | None = None
    triton: EmbeddedTriton | None = None
    replicas: list[Replica] = field(default_factory=list)
    nginx: EmbeddedNginx | None = None

    def stop(self, drain_timeout_s: float) -> None:
        """Stops everything, each part once (a second call goes on where the first was cut).
        The replicas drain first, nginx still in front of them: streams go on, new requests
        get 503."""
        if self.replicas:
            print(f"Stopping: draining the gateway replicas (up to {drain_timeout_s:.0f} s)")
            stop_replicas(self.replicas, drain_timeout_s + 15)
            self.replicas = []
        if self.nginx is not None:
            self.nginx.stop()
            self.nginx = None
        if self.triton is not None:
            if self.triton.process is not None:
                print("Stopping Triton...", flush=True)
            self.triton.stop()
            self.triton = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def up(settings: Settings) -> int:
    """Runs the stack in the foreground until Ctrl-C or SIGTERM (exit 0), or until a part
    of it fails to start or keeps dying (exit 1). Parts that die are started again (see
    :mod:`gateway.stack.supervisor`); at the end everything started is stopped in reverse
    order, and nothing started outlives this process however it ends (see
    :mod:`gateway.stack.processes`)."""
    signals = _Signals().install()
    parts = _Parts()
    processes.start_reaper()
    try:
        try:
            code = _up(settings, parts)
        except (
            EmbeddedTritonError,
            EmbeddedRedisError,
            EmbeddedNginxError,
            ReplicaError,
            GiveUp,
        ) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            code = 1
    except _STOP_REQUESTS:
        code = 0
    while True:
        try:
            signals.hold()
            parts.stop(settings.drain_timeout_s)
            break
        except _STOP_REQUESTS:  # the first signal came during the cleanup: go on with it
            continue
    processes.stop_reaper()
    return code


def _up(settings: Settings, parts: _Parts) -> int:
    ensure_port_free(settings.host, settings.port, "OpenAI API", "--port or GATEWAY_PORT")
    settings = admin_key(settings)
    # Each part is known to the cleanup before it starts, so a failed or interrupted start
    # (Ctrl-C while the models load, say) still stops it.
    if settings.embedded_redis:
        settings = redis_password(settings)
        parts.redis = _redis(settings)
        parts.redis.start()
    parts.triton = _triton(settings)
    if parts.triton is not None:
        parts.triton.start()
        parts.triton.wait_ready(
            settings.triton_start_timeout_s, progress=lambda line: print(line, flush=True)
        )
    if not settings.embedded_nginx:
        return _serve_here(settings, Supervisor(parts.redis, parts.triton))
    ensure_port_free(
        "127.0.0.1",
        settings.nginx_internal_port,
        "nginx internal",
        "GATEWAY_NGINX_INTERNAL_PORT",
    )
    env, metrics = settings_env(settings), metrics_dir(settings.run_dir)
    parts.replicas = [Replica(free_port(), env, metrics) for _ in range(settings.replicas)]
    for replica in parts.replicas:
        replica.start()
    for replica in parts.replicas:
        replica.wait_live(60)
    parts.nginx = EmbeddedNginx(
        [r.address for r in parts.replicas],
        settings.host,
        settings.port,
        settings.nginx_internal_port,
        # nginx takes every body the gateway may accept (a JSON body with base64 audio is
        # larger than the upload limit); the gateway's own 413s answer the rest.
        max(settings.max_audio_upload_mb, settings.max_request_mb),
    )
    parts.nginx.start()
    print(
        f"nginx on {settings.host}:{settings.port} -> gateway replicas on "
        f"{', '.join(r.address for r in parts.replicas)} (nginx logs: {parts.nginx.prefix})",
        flush=True,
    )
    print(f"OpenAI API: http://{settings.host}:{settings.port}/v1", flush=True)
    Supervisor(parts.redis, parts.triton, parts.nginx, parts.replicas).run()
    return 0  # not reached: the watch ends with a signal or GiveUp


class _DrainingServer(uvicorn.Server):
    """uvicorn with a drain before its graceful shutdown: on the first SIGTERM or SIGINT the
    app answers new requests 503 (``/health/ready`` too) while the requests in flight run
    to their end, for up to ``drain_timeout_s``; then uvicorn shuts down as usual. A second
    signal skips the rest of the drain."""

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_timeout_s = drain_timeout_s
        self._drain_until: float | None = None

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        if self._drain_until is None and self.started and self.drain_timeout_s > 0:
            self._captured_signals.append(sig)
            self.drain.draining = True
            self._drain_until = time.monotonic() + self.drain_timeout_s
            logging.getLogger("gateway").warning(
                "draining: %d request(s) in flight, new ones get 503 (up to %.0f s)",
                self.drain.busy,
                self.drain_timeout_s,
            )
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        draining = self._drain_until is not None and not self.should_exit
        if draining and (self.drain.busy == 0 or time.monotonic() >= (self._drain_until or 0)):
            self.should_exit = True
        return await super().on_tick(counter)


def _server(settings: Settings) -> _DrainingServer:
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=5,
        ws_max_size=int(settings.realtime_max_message_mb * 1024 * 1024),
    )
    return _DrainingServer(config, app.state.drain, settings.drain_timeout_s)


def _serve_here(settings: Settings, supervisor: Supervisor) -> int:
    """One gateway process serving ``host:port`` itself (no nginx); a thread restarts Redis
    and Triton when they die (the children it starts die with that thread, which lives as
    long as the server)."""
    server = _server(settings)
    failed: list[GiveUp] = []

    def watch() -> None:
        try:
            supervisor.run(lambda: server.should_exit)
        except GiveUp as exc:
            failed.append(exc)
            server.should_exit = True

    threading.Thread(target=watch, name="supervisor", daemon=True).start()
    print(f"OpenAI API: http://{settings.host}:{settings.port}/v1", flush=True)
    server.run()
    if failed:
        raise failed[0]
    return 0 if server.started else 1


def serve(settings: Settings) -> int:
    """``gateway serve``: the API only, on ``host:port`` (a replica, or a container)."""
    server = _server(settings)
    server.run()
    return 0 if server.started else 1


def _print_key(key: ApiKey, as_json: bool) -> None:
    if as_json:
        print(key.model_dump_json())
        return
    limits = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("rpm", key.rpm),
            ("tpm", key.tpm),
            ("concurrency", key.max_concurrency),
        )
        if value is not None
    )
    state = "revoked" if key.revoked else "expired" if key.expired() else "active"
    models = ",".join(key.models) if key.models is not None else "all models"
    print(f"{key.id}  {key.name}  {key.role}  {state}  {models}  {limits or 'no limits'}")


async def _keys_command(args: argparse.Namespace, settings: Settings) -> None:
    redis = connect(settings.redis_url, settings.redis_timeout_s)
    keys = KeyStore(redis)
    try:
        await migrate(redis)
        if args.action == "create":
            created = await keys.create(
                KeyCreate(
                    name=args.name,
                    role=args.role,
                    models=[m.strip() for m in args.models.split(",")] if args.models else None,
                    rpm=args.rpm,
                    tpm=args.tpm,
                    max_concurrency=args.max_concurrency,
                    expires_in_days=args.expires_in_days,
                )
            )
            if args.json:
                print(created.model_dump_json())
            else:
                print(f"Created key {created.id} ({created.name}, role {created.role}).")
                print("Store it now; it is not shown again:")
                print(created.key)
        elif args.action == "list":
            listed = await keys.all()
            if args.json:
                print(json.dumps([k.model_dump() for k in listed]))
            for key in [] if args.json else listed:
                _print_key(key, False)
        else:
            _print_key(await keys.revoke(args.key_id), args.json)
    finally:
        await redis.aclose()


def _run(command: Callable[[], Coroutine[Any, Any, None]]) -> int:
    try:
        asyncio.run(command())
    except GatewayError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _refused(exc: ValidationError) -> str:
    """One line per refused setting, named by its variable; never its value (it may be a
    secret, see :class:`Settings`)."""
    return "\n".join(
        f"  GATEWAY_{'__'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # readiness polls are not news
    try:
        settings = Settings() if args.command == "keys" else _settings(args)
    except ValidationError as exc:
        print(f"error: invalid settings:\n{_refused(exc)}", file=sys.stderr)
        return 2
    if args.command == "keys":
        return _run(lambda: _keys_command(args, redis_password(settings, make=False)))
    if args.command == "serve":
        return serve(settings)
    return up(settings)
