"""Stops work for clients that have gone away.

Starlette cancels a streaming response when its client disconnects, which closes the
backend stream and cancels the Triton request. A plain (non-streaming) endpoint keeps
running instead, so a client that timed out would leave the model generating up to
``max_tokens``. :func:`cancel_on_disconnect` closes that gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request

T = TypeVar("T")


async def _watch(request: Request, task: asyncio.Task[object], gone: list[bool]) -> None:
    # The body was read already; the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.append(True)
    task.cancel()


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work`` in this task; cancels it (closing any backend stream) if the client
    disconnects, and raises :class:`ClientDisconnect`. One watcher task, not a task for the
    work too: this runs on every non-streaming request."""
    task = asyncio.current_task()
    assert task is not None
    gone: list[bool] = []
    watcher = asyncio.ensure_future(_watch(request, task, gone))
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientDisconnect from None
    finally:
        watcher.cancel()
