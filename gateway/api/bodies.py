"""A request body before the app reads it: its declared length, the limit on its size, a
JSON body measured before it is parsed, and a refused body read to its end and dropped.
:class:`BodyGate` holds the limits; :class:`gateway.api.middleware.GatewayMiddleware` calls
it for every HTTP request (the order and the answers are the middleware's: see its
docstring).

- **Size.** A body over ``GATEWAY_MAX_REQUEST_MB`` is refused at once when its
  ``Content-Length`` says so; a chunked one is read here, up to the limit, so that the
  answer can still be a 413 (:meth:`BodyGate.bounded`). An upload route may take more
  (:attr:`BodyGate.uploads`: ``POST /v1/files`` takes ``GATEWAY_MAX_FILE_MB`` plus 1 MiB of
  multipart framing when that is larger); its file's own limit is checked as it is stored.
- **Refused bodies are drained.** A body refused before it was read is read to its end and
  dropped, up to the largest body nginx lets through and for at most
  :data:`DISCARD_WAIT_S` (:meth:`BodyGate.discard`): a replica that answered and closed
  while nginx was still sending would reset the connection, and nginx would take the reset
  for the replica's failure (retry elsewhere, mark it down). Nothing read is kept.
- **JSON is measured before it is parsed** (:meth:`BodyGate.shaped`,
  :func:`gateway.serving.json_shape.json_shape`): nesting deeper than
  ``GATEWAY_MAX_JSON_DEPTH`` (the standard parser would recurse until it fails), or more
  objects and arrays or values than ``GATEWAY_MAX_JSON_CONTAINERS`` /
  ``GATEWAY_MAX_JSON_VALUES`` (each becomes a Python object), is a 400 in milliseconds with
  nothing built from it. So is one holding a lone UTF-16 surrogate (``\\ud800`` alone, or
  one encoded as UTF-8 bytes): the parser would make a string that nothing can encode later.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope

from gateway.errors import InvalidRequestError
from gateway.serving.json_shape import JsonLimits, json_shape, surrogate_refusal

#: What :func:`declared_length` says of a chunked body: its length is not known before.
CHUNKED = -1

#: The longest a refused body is read (and dropped) before the answer goes out regardless.
DISCARD_WAIT_S = 3.0
#: Bodies at most this large are measured on the event loop; larger ones in a thread.
_SHAPED_INLINE_BYTES = 256 * 1024
#: The one media type whose body is not measured as JSON: an audio upload's form (its file
#: is binary; its fields are parsed by the form parser, never as a JSON document). Every
#: other body is measured, whatever it calls itself: FastAPI parses ``application/*+json``
#: (and more) as JSON, so a list of types that are not JSON would be a way around it.
_MULTIPART = "multipart/form-data"
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def declared_length(scope: Scope) -> int | None:
    """A request body's length as its headers declare it: None without a body,
    :data:`CHUNKED` when a ``Transfer-Encoding`` frames it (which overrides any
    ``Content-Length``, RFC 9112 6.3, whatever order they come in: a server that honours the
    chunks must not be let in under a small declared length), and a malformed or repeated
    ``Content-Length`` as past every limit."""
    lengths = []
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            return CHUNKED
        if name == b"content-length":
            lengths.append(value)
    if not lengths:
        return None
    if len(set(lengths)) > 1 or not lengths[0].isdigit():
        return sys.maxsize
    return int(lengths[0])


class BodyGate:
    """The limits on a request body (see the module's docstring)."""

    def __init__(
        self,
        max_body_mb: float,
        edge_body_mb: float,
        json_limits: JsonLimits,
        uploads: Mapping[str, float] | None = None,
    ) -> None:
        self.max_body = int(max_body_mb * 1024 * 1024)
        self.uploads = {
            path: max(self.max_body, int(mb * 1024 * 1024)) for path, mb in (uploads or {}).items()
        }
        """The upload routes' paths and the largest body each takes (never less than the
        request limit)."""
        # The largest body nginx passes on (Settings.edge_body_mb, which nginx's cap is
        # rendered from): a refused body up to this size is read and dropped, not reset.
        self.discard_limit = math.ceil(edge_body_mb) * 1024 * 1024
        self.json_limits = json_limits

    def limit(self, path: str) -> int:
        """The largest body a request for ``path`` may have, in bytes."""
        return self.uploads.get(path, self.max_body)

    async def bounded(
        self, receive: Receive, length: int | None, limit: int | None = None
    ) -> Receive | None:
        """``receive`` for a body within ``limit`` (the request limit unless given); None
        for one past it."""
        limit = self.max_body if limit is None else limit
        if length is None:
            return receive
        if length != CHUNKED:
            return receive if length <= limit else None
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                return None
            if not message.get("more_body", False):
                break
        return replaying(messages, receive)

    async def discard(self, receive: Receive, length: int | None) -> bool:
        """Reads what is left of a refused body and drops it; True once it was read to its
        end. A body declared larger than nginx lets through (only a client that came
        around it sends one) is not read at all, nor what passes that size, nor what has
        not arrived within :data:`DISCARD_WAIT_S`."""
        if length is None:
            return True
        if length > self.discard_limit:
            return False

        async def drop() -> bool:
            read = 0
            while read <= self.discard_limit:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client went away
                read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
            return False

        try:
            # nginx sends a body it buffered at memory speed; a client that holds one back
            # does not hold the replica's answer for long.
            return await asyncio.wait_for(drop(), DISCARD_WAIT_S)
        except TimeoutError:
            return False

    async def shaped(
        self, scope: Scope, receive: Receive, length: int | None
    ) -> Receive | InvalidRequestError:
        """``receive`` replaying the whole body once it was measured, or the 400 for a
        JSON body past :attr:`json_limits` . Every body but a
        multipart upload is measured."""
        if length is None or scope["method"] not in _WITH_BODY:
            return receive
        media_type = Headers(scope=scope).get("content-type", "").split(";", 1)[0]
        if media_type.strip().lower() == _MULTIPART:
            return receive
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return replaying([message], receive)  # the app sees the disconnect
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        if len(body) <= _SHAPED_INLINE_BYTES:
            refused = self._refusal(body)
        else:
            refused = await asyncio.to_thread(self._refusal, body)
        if refused is not None:
            return refused
        return replaying([{"type": "http.request", "body": body, "more_body": False}], receive)

    def _refusal(self, body: bytes) -> InvalidRequestError | None:
        """The 400 for a JSON body past :attr:`json_limits`, or holding a lone surrogate."""
        refused = self.json_limits.refusal(json_shape(body, self.json_limits), _SUBJECT)
        if refused is not None:
            return InvalidRequestError(refused[0], code=refused[1])
        lone = surrogate_refusal(body, _SUBJECT)
        return None if lone is None else InvalidRequestError(lone, code="invalid_json")


_SUBJECT = "The request body's JSON"


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` first, then what ``receive`` gives."""
    replay = iter(messages)

    async def replayed() -> Message:
        return next(replay, None) or await receive()

    return replayed
