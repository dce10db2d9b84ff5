"""Streamed responses: SSE formatting, the start of a stream, and one place that turns a
failure after the stream began (the HTTP status is already sent) into an SSE ``error``
event."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar

from gateway.errors import GatewayError, error_body

logger = logging.getLogger("gateway.serving.sse")

#: Headers for SSE: no caching, and no buffering by nginx (``X-Accel-Buffering``).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


T = TypeVar("T")


async def first_or_close(items: AsyncGenerator[T, None]) -> T | None:
    """The first item of a backend stream (None if it is empty), awaited before the HTTP
    response starts so that an early failure gets a real status; closes the stream if that
    fails."""
    try:
        return await anext(items, None)
    except BaseException:
        await items.aclose()
        raise


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def with_error_event(
    events: AsyncGenerator[str, None], what: str
) -> AsyncGenerator[str, None]:
    """Passes ``events`` through; an error while producing them ends the stream with an
    ``{"error": {...}}`` event in the OpenAI error body."""
    async with aclosing(events):
        try:
            async for item in events:
                yield item
        except Exception as exc:
            yield event(failure(exc, what))


def failure(exc: Exception, what: str) -> dict[str, Any]:
    """The OpenAI error body for a failure after a stream began (logged here; call it from
    the ``except`` block): the error's own for a gateway error, a generic one otherwise."""
    if isinstance(exc, GatewayError):
        logger.warning("%s stream failed: %s", what, exc.detail or exc.message)
        return exc.body()
    logger.exception("%s stream failed", what)
    return error_body("The server had an error while streaming.", "server_error")


async def with_done(events: AsyncGenerator[str, None], what: str) -> AsyncGenerator[str, None]:
    """An OpenAI text stream: ``events``, an error event if they fail, then always
    ``data: [DONE]``."""
    async with aclosing(with_error_event(events, what)) as guarded:
        async for item in guarded:
            yield item
    yield "data: [DONE]\n\n"
