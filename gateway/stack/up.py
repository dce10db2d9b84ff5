"""``gateway up``: the whole stack in the foreground. Redis (``redis-server``), the real
Triton server from the ``nvidia-pytriton`` wheel with the models of ``triton_repo/`` (or an
external Triton), then the gateway replicas behind nginx (or one gateway serving the port
itself); Ctrl-C or SIGTERM stops them all, in order."""

from __future__ import annotations

import signal
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from gateway.backend import pool
from gateway.config import Settings
from gateway.stack import processes
from gateway.stack.credentials import admin_key, redis_password
from gateway.stack.nginx import EmbeddedNginx, EmbeddedNginxError
from gateway.stack.redis_server import EmbeddedRedis, EmbeddedRedisError
from gateway.stack.replicas import Replica, ReplicaError, metrics_dir, settings_env
from gateway.stack.replicas import stop_all as stop_replicas
from gateway.stack.server import create_server
from gateway.stack.supervisor import GiveUp, Supervisor
from gateway.stack.triton_server import (
    EmbeddedTriton,
    EmbeddedTritonError,
    ensure_port_free,
    free_port,
    is_loopback,
)
from gateway.state.redis import CLUSTER_SCHEME, SENTINEL_SCHEME
from gateway.tracing import traces_endpoint


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
        trace_url=traces_endpoint(settings.otlp_traces_endpoint),
        exit_timeout_s=settings.triton_exit_timeout_s,
    )
    print(
        f"Starting Triton with models {', '.join(settings.models)} (log: {triton.log_path})",
        flush=True,
    )
    if triton.trace_url:
        print(f"Traces: Triton and the gateway send spans to {triton.trace_url}", flush=True)
    return triton


@dataclass
class _Parts:
    """What ``gateway up`` started, so that the cleanup stops exactly that."""

    redis: EmbeddedRedis | None = None
    triton: EmbeddedTriton | None = None
    replicas: list[Replica] = field(default_factory=list)
    nginx: EmbeddedNginx | None = None

    def supervisor(self, settings: Settings) -> Supervisor:
        """The watch over what was started, with the settings' intervals."""
        return Supervisor(
            self.redis,
            self.triton,
            self.nginx,
            self.replicas,
            interval_s=settings.supervise_interval_s,
            restart_delay_s=settings.restart_delay_s,
            models_every_s=settings.triton_models_check_s,
        )

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
        began = time.monotonic()
        parts.triton.start()
        parts.triton.wait_ready(
            settings.triton_start_timeout_s, progress=lambda line: print(line, flush=True)
        )
        settings = _restart_hint(settings, time.monotonic() - began)
    if not settings.embedded_nginx:
        return _serve_here(settings, parts.supervisor(settings))
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
        replica.wait_live(60, retry_port=free_port)
    parts.nginx = EmbeddedNginx(
        [r.address for r in parts.replicas],
        settings.host,
        settings.port,
        settings.nginx_internal_port,
        settings.edge_body_mb,
    )
    parts.nginx.start()
    print(
        f"nginx on {settings.host}:{settings.port} -> gateway replicas on "
        f"{', '.join(r.address for r in parts.replicas)} (nginx logs: {parts.nginx.prefix})",
        flush=True,
    )
    print(f"OpenAI API: http://{settings.host}:{settings.port}/v1", flush=True)
    parts.supervisor(settings).run()
    return 0  # not reached: the watch ends with a signal or GiveUp


def _restart_hint(settings: Settings, start_s: float) -> Settings:
    """``settings`` with ``triton_restart_s`` (unless the operator set it): how long a
    restart of this Triton will take, from the start just timed, the supervisor's check
    interval and its first back-off (the replicas' first guess, see gateway/outages.py)."""
    if "triton_restart_s" in settings.model_fields_set:
        return settings
    hint = start_s + settings.supervise_interval_s + settings.restart_delay_s
    return settings.model_copy(update={"triton_restart_s": round(hint, 1)})


def _serve_here(settings: Settings, supervisor: Supervisor) -> int:
    """One gateway process serving ``host:port`` itself (no nginx); a thread restarts Redis
    and Triton when they die (the children it starts die with that thread, which lives as
    long as the server)."""
    server = create_server(settings)
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
