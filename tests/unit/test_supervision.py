"""``gateway up``'s supervision without the servers: the restart policy, and the reaper
that stops every child process group when ``gateway up`` ends however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gateway.stack.supervisor import GiveUp, Restarts

# Waits on restarted processes: handed out with the long groups (tests/conftest.py).
pytestmark = pytest.mark.long


def test_restarts_back_off_and_give_up_on_a_crash_loop() -> None:
    restarts = Restarts("Redis", limit=5, window_s=60)
    delays = [restarts.died(100.0 + i) for i in range(4)]
    assert delays == [0.5, 1.0, 2.0, 4.0]  # doubling
    assert restarts.down_since == 100.0
    assert not restarts.due(103.0 + 3.9) and restarts.due(103.0 + 4.0)
    with pytest.raises(GiveUp, match="Redis died 5 times within 60 s; giving up"):
        restarts.died(104.0)


def test_deaths_far_apart_are_no_crash_loop() -> None:
    restarts = Restarts("Triton", limit=3, window_s=60)
    for minute in range(10):  # one death a minute, for ten minutes: never gives up
        assert restarts.died(minute * 61.0) == 0.5
        restarts.started()
        assert restarts.due_at is None


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_reaper_stops_every_group_when_its_pipe_closes() -> None:
    # A child that ignores SIGTERM and has a grandchild in its group (as Triton's model
    # processes are in Triton's): both must be gone once the pipe closes, as when
    # `gateway up` is killed with SIGKILL.
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,subprocess,time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen(['sleep', '600']); time.sleep(600)",
        ],
        start_new_session=True,
    )
    polite = subprocess.Popen(["sleep", "600"], start_new_session=True)
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    reaper = subprocess.Popen(
        [sys.executable, "-m", "gateway.stack.reaper", "1.0"], stdin=subprocess.PIPE
    )
    assert reaper.stdin is not None
    time.sleep(0.3)  # the grandchild is started
    reaper.stdin.write(f"+{stubborn.pid}\n+{polite.pid}\n+{gone.pid}\n-{gone.pid}\n".encode())
    reaper.stdin.close()
    assert polite.wait(timeout=5) == -signal.SIGTERM  # asked first
    assert stubborn.wait(timeout=10) == -signal.SIGKILL  # then made to
    assert reaper.wait(timeout=10) == 0
    deadline = time.monotonic() + 5
    while _group_alive(stubborn.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(stubborn.pid), "the grandchild outlived the reaper's work"
