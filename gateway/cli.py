"""The ``gateway`` command.

``gateway up`` runs the whole stack in the foreground: Redis (``redis-server``), the real
Triton server from the ``nvidia-pytriton`` wheel with the models of ``triton_repo/`` (or an
external Triton with ``--triton-url``), then the OpenAI API under uvicorn. Ctrl-C or
SIGTERM stops them all. ``gateway keys create | list | revoke`` manages API keys in Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.stack.credentials import redis_password
from gateway.state.audit import Actor, AuditLog, Auditor
from gateway.state.keys import ApiKey, KeyCreate, KeyStore
from gateway.state.migration import migrate
from gateway.state.redis import connect


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
    create.add_argument(
        "--priority", type=int, help="scheduling priority, lower first (-100 to 100; default 0)"
    )
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
            ("priority", key.priority),
        )
        if value is not None
    )
    state = "revoked" if key.revoked else "expired" if key.expired() else "active"
    models = ",".join(key.models) if key.models is not None else "all models"
    print(f"{key.id}  {key.name}  {key.role}  {state}  {models}  {limits or 'no limits'}")


async def _keys_command(args: argparse.Namespace, settings: Settings) -> None:
    redis = connect(settings.redis_url, settings.redis_timeout_s, settings.redis_max_connections)
    keys = KeyStore(redis)
    # Key changes made here are admin actions too: recorded as the CLI's, by the OS user,
    # from this host.
    audit = Auditor(
        AuditLog(redis, settings.audit_retention_days, settings.audit_max_entries),
        Actor(id="cli", name=f"gateway keys ({_user()})"),
        client=socket.gethostname(),
        request_id=None,
    )
    try:
        await migrate(redis)
        if args.action == "create":
            spec = KeyCreate(
                name=args.name,
                role=args.role,
                models=[m.strip() for m in args.models.split(",")] if args.models else None,
                rpm=args.rpm,
                tpm=args.tpm,
                max_concurrency=args.max_concurrency,
                priority=args.priority,
                expires_in_days=args.expires_in_days,
            )
            async with audit("key.create", details=spec.model_dump(exclude_none=True)) as action:
                created = await keys.create(spec)
                action.target = created.id
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
            async with audit("key.revoke", args.key_id):
                revoked = await keys.revoke(args.key_id)
            _print_key(revoked, args.json)
    finally:
        await redis.aclose()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no name (a container's)
        return "unknown user"


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
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        name = "__".join(str(part) for part in error["loc"]).upper()
        # An error of no one setting (an unknown variable) names its variables itself.
        lines.append(f"  GATEWAY_{name}: {error['msg']}" if name else f"  {error['msg']}")
    return "\n".join(lines)


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
    # Imported here: the app and the stack take a second to import, which `keys` needs not.
    if args.command == "serve":
        from gateway.stack.server import serve

        return serve(settings)
    from gateway.stack.up import up

    return up(settings)
