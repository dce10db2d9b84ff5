"""What the child processes of ``gateway up`` (Triton, Redis, nginx, the replicas) share:
starting one so that it cannot outlive ``gateway up``, stopping one with everything it
started, and reading the end of its log.

Every child starts in a session (and so a process group) of its own, so Ctrl-C in a terminal
reaches ``gateway up`` alone, which stops the children in order; the group also holds what
the child starts (Triton's model processes, nginx's workers), so stopping the group leaves
nothing behind. Two things tie a child's life to ``gateway up``'s, even when it is killed
with SIGKILL and no cleanup runs:

- the kernel sends the child SIGTERM when ``gateway up`` dies (``PR_SET_PDEATHSIG``);
- a small reaper process (:mod:`gateway.stack.reaper`) holds the read end of a pipe from
  ``gateway up`` and the list of the children's process groups; when the pipe closes (the
  kernel closes it however ``gateway up`` ends), it stops every group still there, the
  grandchildren that ``PR_SET_PDEATHSIG`` does not reach included.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_reaper: subprocess.Popen[bytes] | None = None


def _dies_with(parent: int) -> Callable[[], None]:
    """The ``preexec_fn`` of a child of ``parent``: SIGTERM when the parent dies (and at
    once if it died while this child was being made). Resolved before the fork; the child
    runs only the system call."""
    prctl = _libc.prctl

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def start_reaper() -> None:
    """Starts the reaper of this process's children (once). From then on every child
    :func:`spawn` starts is stopped when this process ends, however it ends."""
    global _reaper
    if _reaper is not None and _reaper.poll() is None:
        return
    _reaper = subprocess.Popen(
        [sys.executable, "-m", "gateway.stack.reaper"],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


def _tell_reaper(line: str) -> None:
    if _reaper is None or _reaper.stdin is None or _reaper.poll() is not None:
        return
    try:
        _reaper.stdin.write(line.encode() + b"\n")
        _reaper.stdin.flush()
    except OSError:  # it died: the death signal still covers the direct children
        pass


def stop_reaper() -> None:
    """Closes the reaper's pipe (it then stops what is left, normally nothing) and waits."""
    global _reaper
    if _reaper is None:
        return
    reaper, _reaper = _reaper, None
    if reaper.stdin is not None:
        reaper.stdin.close()
    try:
        reaper.wait(timeout=15)
    except subprocess.TimeoutExpired:
        reaper.kill()


def spawn(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """Starts a child in a session of its own that dies with this process (see the module
    docstring). Call it from the main thread: the death signal follows the thread that
    made the child."""
    process = subprocess.Popen(
        list(command),
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=_dies_with(os.getpid()),
    )
    _tell_reaper(f"+{process.pid}")
    return process


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL to what is left of the child's group (its leader has exited or is stuck)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    _tell_reaper(f"-{process.pid}")


def stop(process: subprocess.Popen[Any] | None, sig: int, timeout_s: float) -> None:
    """Sends ``sig`` (each server's graceful stop) and waits up to ``timeout_s``; then kills
    whatever is left of its group."""
    stop_all([process], sig, timeout_s)


def stop_all(processes: Iterable[subprocess.Popen[Any] | None], sig: int, timeout_s: float) -> None:
    """:func:`stop` for several children at once: all get ``sig`` together, then each is
    waited for until one shared deadline."""
    running = [p for p in processes if p is not None]
    for process in running:
        if process.poll() is None:
            process.send_signal(sig)
    deadline = time.monotonic() + timeout_s
    for process in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        kill_group(process)
        process.wait()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
