"""``gateway up``'s watch over the servers it started: a part that dies is started again.

- **Redis** comes back with its data (the append-only file in its directory).
- **Triton**: its model processes are stopped with it (they are in its process group), and
  it starts again loading every model that was ready before it died, the ones loaded
  through the admin API included (the supervisor reads Triton's repository index every few
  seconds while it runs).
- **nginx** and the **gateway replicas** start again as they were.

A part that died starts again after a back-off that doubles (``restart_delay_s``: 0.5 s,
1 s, 2 s, ... 8 s); one that died ``limit`` times within ``window_s`` is a crash loop, and
:class:`GiveUp` ends ``gateway up`` with the reason. Meanwhile the replicas answer 503 with
``Retry-After`` and ``/health/ready`` fails; they reconnect by themselves when the part is
back.

Why not supervisord: it would not know which models to load into a restarted Triton, nor
stop Triton's model processes with it, nor tie the children's lives to its own when it is
killed (see :mod:`gateway.stack.processes`); what is left to do here is this small loop.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from gateway.stack import processes
from gateway.stack.nginx import EmbeddedNginx, EmbeddedNginxError
from gateway.stack.redis_server import EmbeddedRedis, EmbeddedRedisError
from gateway.stack.replicas import Replica, ReplicaError
from gateway.stack.triton_server import EmbeddedTriton, EmbeddedTritonError

_START_ERRORS = (EmbeddedRedisError, EmbeddedTritonError, EmbeddedNginxError, ReplicaError)


class _Part(Protocol):
    """What the supervisor watches: a server started as one child process."""

    process: subprocess.Popen[bytes] | None


class GiveUp(RuntimeError):
    """A part keeps dying: ``gateway up`` stops, with this one-line reason."""


@dataclass
class Restarts:
    """When a part that died starts again, and when to stop trying."""

    what: str
    limit: int = 5
    window_s: float = 60.0
    first_delay_s: float = 0.5
    max_delay_s: float = 8.0  # 16 x the first
    deaths: list[float] = field(default_factory=list)
    due_at: float | None = None
    down_since: float | None = None

    def died(self, now: float, detail: str = "") -> float:
        """Notes a death; returns the delay before the next start. Raises :class:`GiveUp`
        on a crash loop."""
        self.deaths = [t for t in self.deaths if now - t < self.window_s] + [now]
        if len(self.deaths) >= self.limit:
            raise GiveUp(
                f"{self.what} died {len(self.deaths)} times within {self.window_s:.0f} s; "
                f"giving up{detail}"
            )
        delay = min(self.first_delay_s * 2.0 ** (len(self.deaths) - 1), self.max_delay_s)
        self.due_at = now + delay
        if self.down_since is None:
            self.down_since = now
        return delay

    def due(self, now: float) -> bool:
        return self.due_at is not None and now >= self.due_at

    def started(self) -> None:
        self.due_at = None


class Supervisor:
    """Call :meth:`tick` every ``interval_s`` from the thread that started the parts (the
    children's death signal follows that thread; see :func:`processes.spawn`); :meth:`run`
    does. ``restart_delay_s``: the first back-off; ``models_every_s``: how often the models
    Triton has ready are read (to load them again after a crash)."""

    def __init__(
        self,
        redis: EmbeddedRedis | None,
        triton: EmbeddedTriton | None,
        nginx: EmbeddedNginx | None = None,
        replicas: list[Replica] | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        *,
        interval_s: float = 0.5,
        restart_delay_s: float = 0.5,
        models_every_s: float = 2.0,
    ) -> None:
        self.redis = redis
        self.triton = triton
        self.nginx = nginx
        self.replicas = replicas or []
        self.say = say
        self.interval_s = interval_s
        self.models_every_s = models_every_s
        self.restarts: dict[object, Restarts] = {}
        for part, what in (
            (redis, "Redis"),
            (triton, "Triton"),
            (nginx, "nginx"),
            *((r, f"the gateway replica on port {r.port}") for r in self.replicas),
        ):
            if part is not None:
                self.restarts[part] = Restarts(
                    what, first_delay_s=restart_delay_s, max_delay_s=16 * restart_delay_s
                )
        self.models = list(triton.models) if triton is not None else []
        self._models_read = 0.0
        self._triton_starting = False
        # No kept connection: Triton waits for open HTTP connections when it stops.
        self._http = httpx.Client(timeout=1.0, limits=httpx.Limits(max_keepalive_connections=0))

    def close(self) -> None:
        self._http.close()

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Ticks every ``interval_s`` until ``stop()`` says so (or :class:`GiveUp`)."""
        try:
            while not stop():
                self.tick()
                time.sleep(self.interval_s)
        finally:
            self.close()

    def tick(self) -> None:
        now = time.monotonic()
        if (redis := self.redis) is not None:
            self._keep(
                redis,
                now,
                start=redis.start,
                log=lambda: processes.log_tail(redis.log_path, 5),
                note=" (data from its append-only file)",
            )
        if (triton := self.triton) is not None:
            self._keep(
                triton,
                now,
                start=lambda: self._start_triton(triton),
                log=lambda: triton.log_tail(5),
                note=None,  # back once it is ready, which _triton_running finds out
                running=lambda: self._triton_running(triton, now),
                died=self._triton_died,
            )
        if (nginx := self.nginx) is not None:
            self._keep(nginx, now, start=nginx.start, log=lambda: nginx.log_tail(5))
        for replica in self.replicas:
            self._keep(replica, now, start=replica.start, log=lambda: "", died=replica.forget)

    # -- the watch over one part -------------------------------------------------------------

    def _keep(
        self,
        part: _Part,
        now: float,
        *,
        start: Callable[[], object],
        log: Callable[[], str],
        note: str | None = "",
        running: Callable[[], None] | None = None,
        died: Callable[[], None] | None = None,
    ) -> None:
        """A part that exited has its process group killed (``died`` is told) and starts
        again once its back-off is due; ``running`` runs while it runs. ``note`` ends the
        "is back" line said after a start (None: the part's own check says it)."""
        restarts = self.restarts[part]
        if restarts.due_at is None:
            code = part.process.poll() if part.process is not None else -1
            if code is None:
                if running is not None:
                    running()
                return
            if part.process is not None:
                processes.kill_group(part.process)
            if died is not None:
                died()
            self._died(part, code, log(), now)
            return
        if restarts.due(now):
            restarts.started()
            try:
                start()
            except _START_ERRORS as exc:
                self._died(part, None, str(exc), time.monotonic())
                return
            if note is not None:
                self._back(part, time.monotonic(), note)

    def _died(self, part: object, code: int | None, log: str, now: float) -> None:
        restarts = self.restarts[part]
        detail = f"; the end of its log:\n{log}" if log else ""
        delay = restarts.died(now, detail)
        how = "did not start" if code is None else f"exited ({code})"
        self.say(f"{restarts.what} {how}; starting it again in {delay:.1f} s")

    def _back(self, part: object, now: float, note: str = "") -> None:
        restarts = self.restarts[part]
        since = restarts.down_since
        restarts.down_since = None
        after = f" {now - since:.1f} s after it died" if since is not None else ""
        self.say(f"{restarts.what} is back{after}{note}")

    # -- Triton --------------------------------------------------------------------------

    def _triton_running(self, triton: EmbeddedTriton, now: float) -> None:
        if self._triton_starting:
            self._check_triton_ready(triton, now)
        elif now - self._models_read >= self.models_every_s:
            self._read_models(triton, now)

    def _triton_died(self) -> None:
        self._triton_starting = False

    def _start_triton(self, triton: EmbeddedTriton) -> None:
        """Starts Triton again with every model it had ready (the group kill stopped its
        model processes)."""
        triton.models = list(self.models)
        names = ", ".join(self.models) or "none"
        self.say(f"Starting Triton again with models {names} (log: {triton.log_path})")
        triton.start()
        self._triton_starting = True

    def _check_triton_ready(self, triton: EmbeddedTriton, now: float) -> None:
        base = f"http://{triton.host}:{triton.http_port}/v2"
        try:
            if self._http.get(f"{base}/health/ready").status_code != 200:
                return
            for model in triton.models:
                if self._http.get(f"{base}/models/{model}/ready").status_code != 200:
                    return
        except httpx.HTTPError:
            return
        self._triton_starting = False
        self._models_read = now
        self._back(triton, now, f", models ready: {', '.join(triton.models) or 'none'}")

    def _read_models(self, triton: EmbeddedTriton, now: float) -> None:
        """Remembers the models Triton has ready (those loaded through the admin API too)."""
        self._models_read = now
        url = f"http://{triton.host}:{triton.http_port}/v2/repository/index"
        try:
            answer = self._http.post(url, json={"ready": True})
            if answer.status_code == 200:
                ready = {m["name"] for m in answer.json() if m.get("state") == "READY"}
                self.models = sorted(ready)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass  # unreachable for a moment: keep the last list
