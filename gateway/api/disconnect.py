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


async def _disconnected(request: Request) -> None:
    # The body was read already; the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work``; cancels it (closing any backend stream) if the client disconnects,
    and raises :class:`ClientDisconnect`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise ClientDisconnect
    return task.result()
