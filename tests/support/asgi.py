"""Driving the app's ASGI callable as a server does, for what httpx's ASGITransport cannot
show: a body received while the app still produces it (:class:`StreamingASGITransport`), and
a client that disconnects before any answer (:func:`leave_once`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI


def asgi_scope(request: httpx.Request) -> dict[str, Any]:
    """The ASGI scope a server makes of ``request`` (its headers as sent, duplicates kept),
    for tests that drive the app's ASGI callable themselves."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": request.url.scheme,
        "path": request.url.path,
        "raw_path": request.url.raw_path.split(b"?")[0],
        "query_string": request.url.query,
        "server": (request.url.host, request.url.port),
        "client": ("127.0.0.1", 123),
        "root_path": "",
    }


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Runs the ASGI app in a task and hands each body message to the client as it is sent.
    Closing the response tells the app the client disconnected, as a server does when the
    socket closes, and waits for the app to finish."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = asgi_scope(request)
        messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await messages.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)  # type: ignore[arg-type]
            finally:
                messages.put_nowait(None)

        task = asyncio.create_task(run())
        start = await messages.get()
        if start is None:
            await task  # raises what the app raised
            raise RuntimeError("the app returned without starting a response")
        return httpx.Response(
            start["status"],
            headers=start.get("headers", []),
            stream=_ASGIBodyStream(messages, disconnected, task),
        )


class _ASGIBodyStream(httpx.AsyncByteStream):
    def __init__(
        self,
        messages: asyncio.Queue[dict[str, Any] | None],
        disconnected: asyncio.Event,
        task: asyncio.Task[None],
    ) -> None:
        self._messages = messages
        self._disconnected = disconnected
        self._task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (message := await self._messages.get()) is not None:
            if message["type"] != "http.response.body":
                continue
            if message.get("body"):
                yield message["body"]
            if not message.get("more_body", False):
                return

    async def aclose(self) -> None:
        self._disconnected.set()
        await asyncio.wait_for(self._task, timeout=5)


async def leave_once(app: FastAPI, request: httpx.Request, when: asyncio.Event) -> int:
    """Sends ``request`` to ``app`` as a server would, the client disconnecting once
    ``when`` is set, before any answer; the status the app answered with."""
    body = request.read()
    scope = asgi_scope(request)
    sent: list[dict[str, Any]] = []
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await when.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)  # type: ignore[arg-type]
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))
