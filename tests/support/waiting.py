"""Waiting for what a test cannot know the moment of, by polling instead of sleeping a fixed
time: :func:`until` in async tests, for what the app's tasks do on the test's own event
loop; :func:`wait_until` in blocking code, for what other processes and threads do (a
server up, a counter reached)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(check: Callable[[], object], what: str) -> None:
    """Waits (up to a second) for ``check()`` to be true: for what a task started a moment
    ago does, on a machine whose other work may delay it."""
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(what)


def wait_until(
    check: Callable[[], object],
    what: str,
    timeout_s: float = 20,
    retry_on: tuple[type[Exception], ...] = (),
) -> None:
    """Waits for ``check()`` to be true, blocking; an exception of ``retry_on`` from it (a
    server not up yet) is another try. Fails naming ``what`` and the last result."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return
        except retry_on as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
