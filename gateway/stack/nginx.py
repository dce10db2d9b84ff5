"""nginx in front of the gateway replicas, for ``gateway up`` and the tests.

The config lives in ``nginx/``: ``gateway.conf.template`` (``${NAME}`` placeholders, also
filled by the nginx Docker image's envsubst), ``gateway-locations.conf`` and ``nginx.conf``
(a foreground nginx in a prefix directory). :func:`render` fills a prefix directory with
them; :class:`EmbeddedNginx` runs Debian's ``nginx`` on it.

Run as root, nginx's workers run as ``nobody`` and write request bodies under the prefix, so
the prefix must be reachable by them: it is made in the system temp directory (mode 755),
not under the project, whose parents may be private.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from gateway.config import PROJECT_ROOT
from gateway.stack import processes

NGINX_DIR = PROJECT_ROOT / "nginx"
_STATIC_FILES = ("nginx.conf", "gateway-locations.conf")
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


class EmbeddedNginxError(RuntimeError):
    """nginx could not be started; the message says why."""


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
    max_body_mb: float,
) -> Path:
    """Fills ``prefix`` for ``nginx -p PREFIX/ -c nginx.conf``; returns the rendered
    ``gateway.conf``. ``max_body_mb`` is the body cap (``Settings.edge_body_mb``)."""
    template = (NGINX_DIR / "gateway.conf.template").read_text()
    text = string.Template(template).safe_substitute(
        GATEWAY_UPSTREAMS=upstream_lines(upstreams),
        NGINX_LISTEN=listen,
        NGINX_INTERNAL_LISTEN=internal_listen,
        MAX_BODY_MB=str(math.ceil(max_body_mb)),
    )
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"unfilled placeholders in gateway.conf.template: {', '.join(left)}")
    prefix.mkdir(parents=True, exist_ok=True)
    os.chmod(prefix, 0o755)
    for name in _STATIC_FILES:
        shutil.copyfile(NGINX_DIR / name, prefix / name)
    out = prefix / "gateway.conf"
    out.write_text(text)
    return out


def _binary() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedNginxError(
        "nginx is not installed: run `make run` (it installs the Debian package nginx), or "
        "serve without it: GATEWAY_EMBEDDED_NGINX=false"
    )


class EmbeddedNginx:
    """One foreground ``nginx`` (master and workers) in a prefix directory of its own."""

    def __init__(
        self,
        upstreams: Sequence[str],
        host: str,
        port: int,
        internal_port: int,
        max_body_mb: float,
    ) -> None:
        self.upstreams = list(upstreams)
        self.host = host
        self.port = port
        self.internal_port = internal_port
        self.max_body_mb = max_body_mb
        self.prefix = Path(tempfile.mkdtemp(prefix=f"gateway-nginx-{port}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def error_log(self) -> Path:
        return self.prefix / "error.log"

    @property
    def access_log(self) -> Path:
        return self.prefix / "access.log"

    def start(self, timeout_s: float = 15.0) -> EmbeddedNginx:
        binary = _binary()
        render(
            self.prefix,
            self.upstreams,
            f"{self.host}:{self.port}",
            f"127.0.0.1:{self.internal_port}",
            self.max_body_mb,
        )
        command = [binary, "-p", f"{self.prefix}/", "-c", "nginx.conf", "-e", "stderr"]
        checked = subprocess.run([*command, "-t", "-q"], capture_output=True, text=True)
        if checked.returncode != 0:
            raise EmbeddedNginxError(f"the nginx config does not load:\n{checked.stderr}")
        log = self.error_log.open("ab")
        try:
            self.process = processes.spawn(command, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedNginxError(f"nginx exited while starting:\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise EmbeddedNginxError(f"nginx did not listen on port {self.port}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 10) -> str:
        return processes.log_tail(self.error_log, lines)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGQUIT: nginx finishes the requests it is serving, then exits; its prefix
        directory (config, logs, temp files) goes with it."""
        process, self.process = self.process, None
        processes.stop(process, signal.SIGQUIT, timeout_s)
        shutil.rmtree(self.prefix, ignore_errors=True)
