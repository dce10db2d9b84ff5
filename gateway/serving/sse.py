"""Streamed responses: SSE formatting, the chunks of streamed chat completions and
completions (:class:`ChunkWriter`), the start of a stream, and one place that turns a
failure after the stream began (the HTTP status is already sent) into an SSE ``error``
event."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar

from gateway.errors import GatewayError, error_body
from gateway.serving.protocol import Usage

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


class ChunkWriter:
    """The ``data:`` events of a streamed chat completion (``chat.completion.chunk``: each
    choice a ``delta``) or legacy completion (``text_completion``: each choice a
    ``text``). Only the choice changes from chunk to chunk, so the fixed parts are encoded
    once: this runs once per token on the hot path. ``logprobs`` arguments are JSON
    already."""

    def __init__(self, head: dict[str, Any], usage_null: bool) -> None:
        """``head``: the fields every chunk starts with; ``usage_null``: every chunk but
        the last carries ``"usage": null`` (``stream_options.include_usage``)."""
        self._prefix = "data: " + json.dumps(head)[:-1] + ',"choices":[{"index":'
        self._suffix = "}]" + (',"usage":null' if usage_null else "") + "}\n\n"
        self._head = head

    @classmethod
    def chat(cls, id: str, created: int, model: str, usage_null: bool) -> ChunkWriter:
        head = {
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "service_tier": "default",
        }
        return cls(head, usage_null)

    @classmethod
    def completion(cls, id: str, created: int, model: str, usage_null: bool) -> ChunkWriter:
        head = {"id": id, "object": "text_completion", "created": created, "model": model}
        return cls(head, usage_null)

    def delta(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: str = "null",
    ) -> str:
        """A chat chunk: choice ``index``'s ``delta``."""
        reason = json.dumps(finish_reason)
        return (
            f'{self._prefix}{index},"delta":{json.dumps(delta)},"logprobs":{logprobs},'
            f'"finish_reason":{reason}{self._suffix}'
        )

    def content(self, index: int, text: str, logprobs: str = "null") -> str:
        """A chat chunk whose delta is ``text`` as content (:meth:`delta`, faster)."""
        return (
            f'{self._prefix}{index},"delta":{{"content":{json.dumps(text)}}},'
            f'"logprobs":{logprobs},"finish_reason":null{self._suffix}'
        )

    def text(
        self,
        index: int,
        text: str,
        finish_reason: str | None = None,
        logprobs: str = "null",
    ) -> str:
        """A completion chunk: choice ``index``'s next ``text``."""
        reason = json.dumps(finish_reason)
        return (
            f'{self._prefix}{index},"text":{json.dumps(text)},"logprobs":{logprobs},'
            f'"finish_reason":{reason}{self._suffix}'
        )

    def usage(self, usage: Usage) -> str:
        """The last chunk, with ``stream_options.include_usage``: no choices, the usage."""
        return event({**self._head, "choices": [], "usage": usage.model_dump()})


async def with_error_event(
    events: AsyncGenerator[str, None], what: str, done: bool = False
) -> AsyncGenerator[str, None]:
    """Passes ``events`` through; an error while producing them ends the stream with an
    ``{"error": {...}}`` event in the OpenAI error body. ``done``: then always
    ``data: [DONE]`` (one generator for both: this runs once per streamed chunk)."""
    async with aclosing(events):
        try:
            async for item in events:
                yield item
        except Exception as exc:
            yield event(failure(exc, what))
    if done:
        yield "data: [DONE]\n\n"


def failure(exc: Exception, what: str) -> dict[str, Any]:
    """The OpenAI error body for a failure after a stream began (logged here; call it from
    the ``except`` block): the error's own for a gateway error, a generic one otherwise."""
    if isinstance(exc, GatewayError):
        logger.warning("%s stream failed: %s", what, exc.detail or exc.message)
        return exc.body()
    logger.exception("%s stream failed", what)
    return error_body("The server had an error while streaming.", "server_error")


def with_done(events: AsyncGenerator[str, None], what: str) -> AsyncGenerator[str, None]:
    """An OpenAI text stream: ``events``, an error event if they fail, then always
    ``data: [DONE]``."""
    return with_error_event(events, what, done=True)
