"""Runs the real ``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel, no Docker.

The wheel carries the server, the Python backend and one backend stub per Python version.
Triton wants them laid out as ``<backend-dir>/python/``, with the running interpreter's
``libpython`` and the wheel's bundled libraries (``libcudart`` among them) on
``LD_LIBRARY_PATH``.

Model code must see this virtual environment's packages. The stub embeds an *isolated*
interpreter: it ignores ``PYTHONPATH``, and its ``sys.path`` holds the base interpreter's
site-packages, whose numpy may be 2.x, which the stub's bindings misread (BYTES tensors
arrive corrupted). Its ``sys.path`` does start with the working directory, so the server
runs with its working directory at this environment's site-packages: the environment's
packages, numpy < 2 included, are found first.

It listens on loopback only: ``--grpc-address``, ``--http-address`` and
``--metrics-address`` name the host of ``triton_url``, which ``gateway up`` requires to be a
loopback address. The other front ends Triton 2.51 has (SageMaker, Vertex AI) take no bind
address, so they are turned off explicitly (Vertex AI would otherwise start by itself when
``AIP_MODE=PREDICTION`` is in the environment). Its environment has no ``GATEWAY_*``
variables: model code has no business with the gateway's admin key or Redis password.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import random
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.stack import processes
from gateway.tracing import triton_flags


class EmbeddedTritonError(RuntimeError):
    """Triton could not be started; the message says why and what to do."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of Triton live inside the installed ``nvidia-pytriton`` wheel."""

    binary: Path
    python_backend: Path
    stub: Path
    libs: Path

    @classmethod
    def locate(cls) -> TritonInstall:
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddedTritonError(
                "the nvidia-pytriton package is not installed; run `make run` (or "
                "`pip install nvidia-pytriton`) to get the tritonserver binary"
            )
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
            libs=package.parent / "nvidia_pytriton.libs",
        )
        for path in (install.binary, install.python_backend, install.stub, install.libs):
            if not path.exists():
                raise EmbeddedTritonError(
                    f"{path} is missing: this nvidia-pytriton install is incomplete or has no "
                    f"stub for Python {version}; reinstall it with `make run`"
                )
        return install

    def backend_dir(self, run_dir: Path) -> Path:
        """Lays out ``<run_dir>/backends/python`` with links into the wheel; returns the
        folder to pass as ``--backend-directory``."""
        python_dir = run_dir / "backends" / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for source in (
            self.python_backend / "libtriton_python.so",
            self.python_backend / "triton_python_backend_utils.py",
            self.stub,
        ):
            link = python_dir / source.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source)
        return python_dir.parent

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, str(self.libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    @staticmethod
    def working_directory() -> str:
        """The running environment's site-packages (see the module docstring)."""
        return sysconfig.get_paths()["purelib"]


#: Where :func:`free_port` picks: below Linux's ephemeral range (32768 up), from which
#: the kernel gives outgoing connections their local ports, so none of those can take a
#: port between its pick and the server that binds it.
PORTS = range(20_000, 32_000)


#: The ports :func:`free_port` has handed out in this process: never twice, since a caller
#: picking several (Triton's gRPC, HTTP and metrics ports, the replicas') binds them only
#: later (a clean-clone test run once got one port for Triton's gRPC and HTTP).
_HANDED_OUT: set[int] = set()
#: Where :func:`free_port` records its picks for the other processes of this user on this
#: machine (several ``gateway up``, the test suite's workers and the stacks they start):
#: one file per port, so that a port another process picked but has not bound yet is not
#: picked again (the test suite once lost a module to a Triton metrics port two workers
#: had both picked).
_RESERVATIONS = Path(tempfile.gettempdir()) / f"triton-gateway-ports-{os.getuid()}"
#: How long a pick holds its port for the other processes: far longer than any server
#: takes to bind it; past it the pick is forgotten (whoever binds the port holds it).
RESERVED_S = 600.0


def _reserve(port: int) -> bool:
    """Whether ``port`` is this process's pick now: no other process picked it in the last
    :data:`RESERVED_S`. Best effort: without a usable directory, every port is."""
    path = _RESERVATIONS / str(port)
    try:
        _RESERVATIONS.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if time.time() - path.stat().st_mtime > RESERVED_S:
                path.unlink()
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, at random in :data:`PORTS`, never one this process
    was given before nor one another process picked lately (:func:`_reserve`); the
    kernel's pick when a hundred tries found none."""
    for _ in range(100):
        port = random.choice(PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        if not _reserve(port):
            continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an IPv4 or an IPv6 address, bracketed or not) is this
    machine's loopback, which no other machine can reach."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_port_free(host: str, port: int, what: str, setting: str) -> None:
    """Fails with a clear message when something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise EmbeddedTritonError(
                f"port {port} ({what}) is already in use on {host}: stop what uses it, "
                f"or choose another port with {setting}"
            ) from exc


class EmbeddedTriton:
    """One ``tritonserver`` child process in explicit model-control mode."""

    def __init__(
        self,
        repository: Path,
        models: list[str],
        run_dir: Path,
        grpc_port: int,
        http_port: int,
        metrics_port: int,
        host: str = "127.0.0.1",
        trace_url: str | None = None,
        exit_timeout_s: int = 30,
    ) -> None:
        """``trace_url``: the OTLP/HTTP URL Triton sends its spans to, joining the
        gateway's traces (:func:`gateway.tracing.triton_flags`); None: no tracing.
        ``exit_timeout_s``: how long Triton waits at shutdown for its models to finish and
        unload (``--exit-timeout-secs``)."""
        self.exit_timeout_s = exit_timeout_s
        self.repository = repository.resolve()
        self.models = models
        self.run_dir = run_dir.resolve()
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.metrics_port = metrics_port
        self.host = host
        self.trace_url = trace_url
        self.log_path = self.run_dir / "triton.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> None:
        if not self.repository.is_dir():
            raise EmbeddedTritonError(f"model repository {self.repository} does not exist")
        for model in self.models:
            if not (self.repository / model / "config.pbtxt").is_file():
                raise EmbeddedTritonError(
                    f"model '{model}' has no {self.repository / model / 'config.pbtxt'}"
                )
        for port, what, setting in (
            (self.grpc_port, "Triton gRPC", "--triton-grpc-port"),
            (self.http_port, "Triton HTTP", "--triton-http-port"),
            (self.metrics_port, "Triton metrics", "--triton-metrics-port"),
        ):
            ensure_port_free(self.host, port, what, setting)
        install = TritonInstall.locate()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={install.backend_dir(self.run_dir)}",
            "--model-control-mode=explicit",
            *(f"--load-model={model}" for model in self.models),
            f"--grpc-port={self.grpc_port}",
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            f"--grpc-address={self.host}",
            f"--http-address={self.host}",
            f"--metrics-address={self.host}",
            "--allow-sagemaker=false",
            "--allow-vertex-ai=false",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *(triton_flags(self.trace_url) if self.trace_url else ()),
        ]
        log = self.log_path.open("ab")
        try:
            # A session of its own: Ctrl-C in the terminal reaches the gateway, which then
            # stops Triton in order, instead of both racing to exit. Its model processes
            # are in its group: stopping the group stops them (see processes.spawn).
            self.process = processes.spawn(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=install.environment(),
                cwd=install.working_directory(),
            )
        finally:
            log.close()

    def log_tail(self, lines: int = 20) -> str:
        return processes.log_tail(self.log_path, lines)

    def wait_ready(self, timeout_s: float, progress: Callable[[str], None] = print) -> None:
        """Blocks until the server and every model report ready; raises with the log's tail
        when the process exits or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        base = f"http://{self.host}:{self.http_port}/v2"
        pending = ["server", *self.models]
        started = time.monotonic()
        last_note = 0.0
        with httpx.Client(timeout=2.0) as client:
            while pending:
                if self.process is not None and self.process.poll() is not None:
                    raise EmbeddedTritonError(
                        f"tritonserver exited with code {self.process.returncode} while "
                        f"starting; the end of {self.log_path}:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise EmbeddedTritonError(
                        f"Triton was not ready after {timeout_s:.0f} s (waiting for "
                        f"{', '.join(pending)}); the end of {self.log_path}:\n{self.log_tail()}"
                    )
                name = pending[0]
                url = f"{base}/health/ready" if name == "server" else f"{base}/models/{name}/ready"
                try:
                    ready = client.get(url).status_code == 200
                except httpx.TransportError:
                    ready = False
                if ready:
                    pending.pop(0)
                    progress(f"  ready: {name} ({time.monotonic() - started:.1f} s)")
                    continue
                if time.monotonic() - last_note > 10:
                    progress(f"  waiting for {name}...")
                    last_note = time.monotonic()
                time.sleep(0.2)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stops the server: SIGTERM (Triton unloads models gracefully, for up to its exit
        timeout), SIGKILL a few seconds after that."""
        wait = timeout_s if timeout_s is not None else self.exit_timeout_s + 5.0
        processes.stop(self.process, signal.SIGTERM, wait)
