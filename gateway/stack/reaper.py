"""The reaper of ``gateway up``'s children (``python -m gateway.stack.reaper``).

It reads lines from its stdin, a pipe from ``gateway up``: ``+PGID`` when a child's process
group starts, ``-PGID`` when ``gateway up`` stopped it itself. When the pipe closes, which
the kernel does however ``gateway up`` ends (SIGKILL included), every group still listed
gets SIGTERM, and SIGKILL after a grace period (5 s, or the first argument) if anything in
it is still running. It
ignores Ctrl-C and SIGTERM meant for a terminal's or a service's process group (it lives in a
session of its own anyway); it imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

GRACE_S = 5.0


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def reap(groups: set[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM to every group, then SIGKILL to those still running after ``grace_s``."""
    for group in groups:
        _signal(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.1)
    for group in groups:
        if _alive(group):
            _signal(group, signal.SIGKILL)


def main() -> None:
    grace_s = float(sys.argv[1]) if len(sys.argv) > 1 else GRACE_S
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if len(line) > 1 and line[1:].isdigit():
            if line[0] == "+":
                groups.add(int(line[1:]))
            elif line[0] == "-":
                groups.discard(int(line[1:]))
    reap({g for g in groups if _alive(g)}, grace_s)


if __name__ == "__main__":
    main()
