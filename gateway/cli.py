"""The ``gateway`` command.

``gateway up`` runs the whole stack in the foreground: the real Triton server from the
``nvidia-pytriton`` wheel with the models of ``triton_repo/`` (or an external Triton with
``--triton-url``), then the OpenAI API under uvicorn. Ctrl-C or SIGTERM stops both.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import types
from typing import Any

import uvicorn
from pydantic import ValidationError

from gateway.app import create_app
from gateway.config import Settings
from gateway.embedded import EmbeddedTriton, EmbeddedTritonError, ensure_port_free


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
    up.add_argument("--log-level", help="gateway log level (GATEWAY_LOG_LEVEL)")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "models": args.models,
        "triton_http_port": args.triton_http_port,
        "triton_metrics_port": args.triton_metrics_port,
        "log_level": args.log_level,
    }
    if args.triton_url:
        overrides.update(triton_url=args.triton_url, embedded_triton=False)
    elif args.triton_grpc_port:
        overrides["triton_url"] = f"127.0.0.1:{args.triton_grpc_port}"
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


class _Terminated(Exception):
    """SIGTERM arrived: stop everything in order."""


def _stop_on_sigterm(_signum: int, _frame: types.FrameType | None) -> None:
    raise _Terminated


# uvicorn handles SIGINT/SIGTERM while it serves and re-raises the signal after its graceful
# shutdown; both paths end here, so an operator's stop is a clean exit (0).
_STOP_REQUESTS = (_Terminated, KeyboardInterrupt)


def up(settings: Settings) -> int:
    triton: EmbeddedTriton | None = None
    # SIGTERM unwinds through `finally` below, which stops Triton.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        ensure_port_free(settings.host, settings.port, "OpenAI API", "--port or GATEWAY_PORT")
        if settings.embedded_triton:
            host, _, port = settings.triton_url.rpartition(":")
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
                f"Starting Triton with models {', '.join(settings.models)} "
                f"(log: {triton.log_path})",
                flush=True,
            )
            triton.start()
            triton.wait_ready(
                settings.triton_start_timeout_s, progress=lambda line: print(line, flush=True)
            )
        else:
            print(f"Using the Triton server at {settings.triton_url}", flush=True)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings),
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=10,
            )
        )
        died = threading.Event()
        if triton is not None:
            _watch(triton, server, died)
        print(f"OpenAI API: http://{settings.host}:{settings.port}/v1", flush=True)
        server.run()
        if died.is_set() and triton is not None:
            print(
                f"error: Triton exited unexpectedly; the end of {triton.log_path}:\n"
                f"{triton.log_tail()}",
                file=sys.stderr,
            )
            return 1
        return 0 if server.started else 1
    except EmbeddedTritonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except _STOP_REQUESTS:
        return 0
    finally:
        if triton is not None and triton.process is not None:
            print("Stopping Triton...", flush=True)
            triton.stop()


def _watch(triton: EmbeddedTriton, server: uvicorn.Server, died: threading.Event) -> None:
    """Stops the API when Triton dies, so a broken stack never looks healthy."""

    def watch() -> None:
        assert triton.process is not None
        while not server.should_exit:
            if triton.process.poll() is not None:
                died.set()
                server.should_exit = True
                return
            threading.Event().wait(0.5)

    threading.Thread(target=watch, name="triton-watchdog", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # readiness polls are not news
    try:
        settings = _settings(args)
    except ValidationError as exc:
        print(f"error: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    return up(settings)
