"""What the child processes of ``gateway up`` (Triton, Redis, nginx, the replicas) share:
stopping one in order, and reading the end of its log."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any


def stop(process: subprocess.Popen[Any] | None, sig: int, timeout_s: float) -> None:
    """Sends ``sig`` (each server's graceful stop) and waits; kills the process's group if it
    is still running after ``timeout_s``. Every child is started in a session of its own, so
    its group holds it and its workers only."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
