"""Lay out a prefix directory to run nginx in front of local gateway replicas.

    python3 nginx/render.py --prefix /tmp/edge --listen 8088 \\
        --upstream 127.0.0.1:8080 --upstream 127.0.0.1:8081
    nginx -p /tmp/edge/ -c nginx.conf -e stderr

The directory gets nginx.conf and gateway-locations.conf copied from this folder and
gateway.conf rendered from gateway.conf.template with string.Template.safe_substitute (the
same ${NAME} placeholders the nginx Docker image fills with envsubst). Standard library only,
so it runs with any python3; ``render()`` can be imported by tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import string
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "gateway.conf.template"
STATIC_FILES = ("nginx.conf", "gateway-locations.conf")
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def upstream_lines(addresses: Sequence[str], max_fails: int = 3, fail_timeout: str = "10s") -> str:
    """The ``GATEWAY_UPSTREAMS`` value: one ``server`` line per ``host:port``."""
    if not addresses:
        raise ValueError("at least one upstream address is needed")
    return "\n".join(
        f"    server {address} max_fails={max_fails} fail_timeout={fail_timeout};"
        for address in addresses
    )


def render(
    prefix: Path,
    upstreams: Sequence[str],
    listen: str,
    internal_listen: str,
    max_upload_mb: int,
    *,
    max_fails: int = 3,
    fail_timeout: str = "10s",
) -> Path:
    """Fill ``prefix`` for ``nginx -p PREFIX/ -c nginx.conf``; return the rendered gateway.conf.

    Raises ValueError if a placeholder is left unfilled (safe_substitute would keep it).
    """
    text = string.Template(TEMPLATE.read_text()).safe_substitute(
        GATEWAY_UPSTREAMS=upstream_lines(upstreams, max_fails, fail_timeout),
        NGINX_LISTEN=listen,
        NGINX_INTERNAL_LISTEN=internal_listen,
        MAX_UPLOAD_MB=str(int(max_upload_mb)),
    )
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"unfilled placeholders in {TEMPLATE.name}: {', '.join(left)}")
    prefix.mkdir(parents=True, exist_ok=True)
    # nginx's workers (user "nobody" when the master runs as root) write request bodies
    # into PREFIX/client_body_temp, so they must be able to enter the directory.
    os.chmod(prefix, 0o755)
    for name in STATIC_FILES:
        shutil.copyfile(HERE / name, prefix / name)
    out = prefix / "gateway.conf"
    out.write_text(text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, required=True, help="directory to fill")
    parser.add_argument(
        "--upstream",
        action="append",
        required=True,
        help="gateway replica host:port (repeat for several)",
    )
    parser.add_argument("--listen", default="8088", help="public listen (default 8088)")
    parser.add_argument(
        "--internal-listen",
        default="127.0.0.1:9090",
        help="listen for /metrics and /nginx_status (default 127.0.0.1:9090)",
    )
    parser.add_argument(
        "--max-upload-mb",
        type=int,
        default=26,
        help="cap on a request body in MiB: the gateway's upload limit + 1 (default 26)",
    )
    parser.add_argument("--max-fails", type=int, default=3)
    parser.add_argument("--fail-timeout", default="10s")
    args = parser.parse_args(argv)
    render(
        args.prefix,
        args.upstream,
        args.listen,
        args.internal_listen,
        args.max_upload_mb,
        max_fails=args.max_fails,
        fail_timeout=args.fail_timeout,
    )
    prefix = args.prefix.resolve()
    print(f"nginx -t -p {prefix}/ -c nginx.conf -e stderr   # check")
    print(f"nginx -p {prefix}/ -c nginx.conf -e stderr      # run in the foreground")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
