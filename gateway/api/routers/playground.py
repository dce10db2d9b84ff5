"""The browser playground and admin console: one static page (``GET /``, ``/playground``)
and its files (``/playground/assets/...``), shipped in the package. Nothing is built and
nothing is fetched from elsewhere: the page calls this gateway's public API with the key
typed into it, exactly as an SDK would, so it needs no route or permission of its own.

The page is public (it holds no data); its Content-Security-Policy lets it load only its
own files and talk only to its own origin (``connect-src 'self'`` covers the Realtime
WebSocket on the same host)."""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

ASSETS = Path(__file__).resolve().parents[2] / "static" / "playground"
ASSETS_PATH = "/playground/assets"

#: The page's policy: its own scripts, styles and icon only; fetch and WebSocket to its own
#: origin; audio from blob: URLs (recorded and synthesized audio, Media Source streams).
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page changes with the gateway; a browser asks again (ETag makes that cheap).
    "Cache-Control": "no-cache",
}

router = APIRouter(tags=["playground"], include_in_schema=False)


@router.api_route("/", methods=["GET", "HEAD"])
@router.api_route("/playground", methods=["GET", "HEAD"])
async def page() -> FileResponse:
    return FileResponse(ASSETS / "index.html", headers=HEADERS)


class Assets(StaticFiles):
    """The page's scripts, styles and icon, with the page's security headers."""

    def file_response(
        self,
        full_path: str | PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(HEADERS)
        return response


assets = Assets(directory=ASSETS)
