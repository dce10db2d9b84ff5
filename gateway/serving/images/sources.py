"""Where an image's file comes from: a ``data:`` URL, or an ``http(s)`` URL on a host the
operator allows, fetched within the limits and without following redirects."""

from __future__ import annotations

import asyncio
import base64
import binascii
from urllib.parse import urlsplit

import httpx

from gateway.serving.images.parts import ImageLimits, ImagePart, refused, too_large

#: The media types taken, and the encoding each names (Pillow's format, lowercase).
MEDIA_TYPES = {
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
}
_CHUNK = 64 * 1024


class ImageSources:
    """Reads image files within :class:`ImageLimits`. ``transport``: an httpx transport for
    the URL fetches (tests give a mock one)."""

    def __init__(
        self, limits: ImageLimits, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.limits = limits
        self.transport = transport

    async def file(self, part: ImagePart) -> bytes:
        """The part's file: its data URL decoded (in a thread), or its URL fetched."""
        url = part.url
        if url[:5].lower() == "data:":
            return await asyncio.to_thread(self._data_url, url, part.url_param)
        scheme = urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return await self._fetch(url, part.url_param)
        raise refused(
            "An image URL is a data: URL (data:image/png;base64,...) or an http(s) URL on a "
            "host the operator allows.",
            part.url_param,
            "invalid_image_url",
        )

    def _data_url(self, url: str, param: str) -> bytes:
        header, comma, payload = url.partition(",")
        fields = header[5:].split(";")
        media = fields[0].strip().lower()
        if not comma or "base64" not in (f.strip().lower() for f in fields[1:]):
            raise refused(
                "A data URL image is base64: data:image/png;base64,<data>.",
                param,
                "invalid_image_url",
            )
        if media not in MEDIA_TYPES:
            raise refused(
                f"The data URL's type is '{media or 'none'}'; images are taken as "
                "image/jpeg, image/png, image/gif or image/webp.",
                param,
                "invalid_image_format",
            )
        if len(payload) // 4 * 3 > self.limits.max_bytes + 3:
            raise too_large(self.limits, param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise refused(
                f"The data URL's base64 does not decode: {exc}.", param, "invalid_image_url"
            ) from exc

    def _allowed(self, url: httpx.URL) -> bool:
        host = url.host.lower()
        port = url.port or (443 if url.scheme == "https" else 80)
        return any(entry in (host, f"{host}:{port}") for entry in self.limits.hosts)

    async def _fetch(self, raw: str, param: str) -> bytes:
        try:
            url = httpx.URL(raw)
        except httpx.InvalidURL as exc:
            raise refused(
                f"The image URL is not valid: {exc}.", param, "invalid_image_url"
            ) from exc
        if not url.host or not self._allowed(url):
            allowed = (
                "no host is allowed here, so send the image as a data: URL"
                if not self.limits.hosts
                else "allowed hosts: " + ", ".join(self.limits.hosts)
            )
            raise refused(
                f"The gateway does not fetch images from '{url.host}' "
                f"(GATEWAY_IMAGE_URL_HOSTS; {allowed}).",
                param,
                "invalid_image_url",
            )
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                return await self._download(url, param)
        except TimeoutError as exc:
            raise refused(
                f"The image URL did not answer within {self.limits.timeout_s:g} s "
                "(GATEWAY_IMAGE_FETCH_TIMEOUT_S).",
                param,
                "invalid_image_url",
            ) from exc
        except httpx.HTTPError as exc:
            raise refused(
                f"The image URL could not be fetched: {type(exc).__name__}.",
                param,
                "invalid_image_url",
            ) from exc

    async def _download(self, url: httpx.URL, param: str) -> bytes:
        async with (
            httpx.AsyncClient(
                transport=self.transport,
                follow_redirects=False,
                timeout=self.limits.timeout_s,
                trust_env=False,  # no proxy from the environment: the host is the one allowed
            ) as client,
            client.stream("GET", url, headers={"Accept": "image/*"}) as response,
        ):
            if response.is_redirect:
                # Where it points is not repeated: it may name a host the client should not
                # learn of.
                raise refused(
                    f"The image URL answered {response.status_code}, a redirect; the gateway "
                    "follows no redirect, so send the image's own URL.",
                    param,
                    "invalid_image_url",
                )
            if response.status_code != 200:
                raise refused(
                    f"The image URL answered {response.status_code}.", param, "invalid_image_url"
                )
            media = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if media not in MEDIA_TYPES:
                raise refused(
                    f"The image URL's Content-Type is '{media or 'none'}'; images are taken "
                    "as image/jpeg, image/png, image/gif or image/webp.",
                    param,
                    "invalid_image_format",
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.limits.max_bytes:
                raise too_large(self.limits, param)
            data = bytearray()
            async for chunk in response.aiter_bytes(_CHUNK):
                data += chunk
                if len(data) > self.limits.max_bytes:
                    raise too_large(self.limits, param)
            return bytes(data)
