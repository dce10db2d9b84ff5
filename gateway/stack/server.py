"""The gateway's own HTTP server (``gateway serve``, and each replica ``gateway up`` runs):
uvicorn with a drain before its graceful shutdown."""

from __future__ import annotations

import logging
import time
import types

import uvicorn

from gateway.api.middleware import Drain
from gateway.app import create_app
from gateway.config import Settings


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


def create_server(settings: Settings) -> _DrainingServer:
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


def serve(settings: Settings) -> int:
    """``gateway serve``: the API only, on ``host:port`` (a replica, or a container)."""
    server = create_server(settings)
    server.run()
    return 0 if server.started else 1
