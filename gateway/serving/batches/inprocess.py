"""A batch's request served by this process's own app, as a live request is: the whole
middleware (body bounds, metrics, admission settled after the last byte), the route's
validation, the key's allow-list, rate limits and budgets, the scheduler.

The caller is not a header (a client could send one) but an entry of the ASGI scope,
:data:`BATCH_CALLER`, which nothing from the network can set: the admission reads the
batch's key from it (:func:`gateway.api.auth.admit`), as the key is now (a key revoked
since gets its 401 in the error file).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import ASGIApp, Message

#: The scope entry naming the key a batch's request runs as.
BATCH_CALLER = "gateway.batch_caller"


@dataclass(frozen=True)
class BatchCaller:
    """The key that made the batch: its id and hash (as a client secret holds them)."""

    key_id: str
    key_hash: str


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def call(
    app: ASGIApp, path: str, body: bytes, caller: BatchCaller, request_id: str
) -> Answer:
    """``POST path`` with ``body`` (JSON) as ``caller``, answered by ``app`` in this
    process, under ``request_id`` (its ``X-Request-ID``: the logs and traces name it).
    Cancelling it cancels the request, as a client that leaves."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"batch.internal"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ],
        "client": ("batch", 0),
        "server": ("batch.internal", 0),
        BATCH_CALLER: caller,
    }
    sent = False
    forever = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await forever.wait()  # no disconnect: the task is cancelled instead
        return {"type": "http.disconnect"}

    status, headers, chunks = 500, {}, []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return Answer(status, headers, b"".join(chunks))
