"""Images in chat: ``image_url`` content parts read, checked and made ready for the model.

A part is ``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`` (Responses'
``input_image`` parts are turned into these, see ``responses/conversion.py``):

- ``url``: a ``data:image/<jpeg|png|gif|webp>;base64,...`` URL, or an ``http(s)`` URL on a
  host the operator allows (``GATEWAY_IMAGE_URL_HOSTS``, empty by default: none). The
  gateway fetches it itself (the model never fetches: a backend that does, TensorRT-LLM's
  preprocessing, would do so with no bound), within ``GATEWAY_IMAGE_FETCH_TIMEOUT_S`` and
  ``GATEWAY_MAX_IMAGE_MB``, and takes it only with an image ``Content-Type``. Redirects are
  not followed, to any host: following one to another host would let an allowed host send
  the gateway anywhere, and a redirect on the same host is a URL the client can send
  itself.
- The bytes must be a JPEG, PNG, WebP or still GIF (OpenAI's formats) of at most
  ``GATEWAY_MAX_IMAGE_MEGAPIXELS``; at most ``GATEWAY_MAX_IMAGES`` per request.
- ``detail``: ``auto`` and ``high`` send the image as it came (the model's own processor
  sizes it), ``low`` sends it shrunk to fit 512 x 512 pixels (OpenAI's low-resolution
  image); any other value is a 400.

Only a model whose ``ModelInfo.images`` is set sees images; for any other an image part is
a 400 naming it. A model that decodes fewer encodings (TensorRT-LLM: JPEG only) gets the
others converted (transparency flattened onto white). Decoding and converting run in a
thread. A session (``X-Session-ID``) stores text only, so image parts are refused there.

The chat template of a model that sees images gets every message's content as a list of
parts in Hugging Face's shape (``{"type": "text", "text": ...}``, ``{"type": "image"}``),
as multimodal templates iterate it; other models keep plain text content.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from gateway.backend import ChatImage, ModelInfo
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import ChatMessage, ParamNames

#: The media types taken, and the encoding each names (Pillow's format, lowercase).
MEDIA_TYPES = {
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
}
FORMATS = ("jpeg", "png", "gif", "webp")
DETAILS = ("auto", "low", "high")
#: ``detail: low``: the image shrunk to fit this square (OpenAI's low-resolution size).
LOW_DETAIL_PX = 512
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ImagePart:
    """An ``image_url`` part where the request has it: its message, its place in the
    content, the name errors give it, and what it asks for."""

    message: int
    part: int
    param: str
    url: str
    detail: str
    url_param: str
    """The name of its URL (``...image_url.url``; Responses: ``...image_url``)."""


@dataclass(frozen=True)
class ImageLimits:
    """The bounds of the images of one request (the ``GATEWAY_*IMAGE*`` settings)."""

    hosts: tuple[str, ...] = ()
    max_images: int = 8
    max_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 32_000_000
    timeout_s: float = 10.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ImageLimits:
        return cls(
            hosts=tuple(settings.image_url_hosts),
            max_images=settings.max_images,
            max_bytes=int(settings.max_image_mb * 1024 * 1024),
            max_pixels=int(settings.max_image_megapixels * 1_000_000),
            timeout_s=settings.image_fetch_timeout_s,
        )


def _refused(message: str, param: str, code: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def image_parts(messages: Sequence[ChatMessage], names: ParamNames) -> list[ImagePart]:
    """The request's ``image_url`` parts, their shape checked, in order. ``names``: a
    converted request's names for them (``ParamNames.image_parts``), else the chat names."""
    found: list[ImagePart] = []
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if part.type != "image_url":
                continue
            index = len(found)
            converted = index < len(names.image_parts)
            if converted:  # a Responses input_image: image_url is its URL, detail beside it
                param = names.image_parts[index]
                url_param, detail_param = f"{param}.image_url", f"{param}.detail"
            else:
                param = f"{names.messages}.[{i}].content.[{j}]"
                url_param, detail_param = f"{param}.image_url.url", f"{param}.image_url.detail"
            if message.role != "user":
                raise _refused(
                    f"Only user messages carry images; this one is a {message.role} message.",
                    param,
                    "invalid_value",
                )
            value = part.image_url
            if isinstance(value, str):  # some clients send the URL bare
                value = {"url": value}
            if not isinstance(value, dict) or not isinstance(value.get("url"), str):
                raise _refused(
                    'An image_url part needs \'image_url\': {"url": ..., "detail": ...}.',
                    param,
                    "invalid_image_url",
                )
            unknown = sorted(set(value) - {"url", "detail"})
            if unknown:
                raise _refused(
                    f"image_url takes 'url' and 'detail'; '{unknown[0]}' is not one of them.",
                    f"{param}.image_url.{unknown[0]}",
                    "unknown_parameter",
                )
            detail = value.get("detail") or "auto"
            if detail not in DETAILS:
                raise _refused(
                    f"detail is '{detail}'; it takes 'auto', 'low' (the image shrunk to fit "
                    f"{LOW_DETAIL_PX}x{LOW_DETAIL_PX}) or 'high' (the image as sent).",
                    detail_param,
                    "invalid_value",
                )
            found.append(ImagePart(i, j, param, value["url"], detail, url_param))
    return found


class ImageReader:
    """Reads the images of a request within :class:`ImageLimits`. ``transport``: an httpx
    transport for the URL fetches (tests give a mock one)."""

    def __init__(
        self, limits: ImageLimits, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.limits = limits
        self.transport = transport

    async def read(
        self,
        messages: Sequence[ChatMessage],
        model: ModelInfo,
        names: ParamNames,
        session: bool = False,
    ) -> tuple[ChatImage, ...]:
        """The images of ``messages`` for ``model``, in order, or a 400 naming the part."""
        parts = image_parts(messages, names)
        if not parts:
            return ()
        first = parts[0]
        if model.images is None:
            raise _refused(
                f"The model '{model.name}' does not see images (its capabilities in "
                "/v1/models say which models do); send this message as text only.",
                first.param,
                "image_not_supported",
            )
        if session:
            raise _refused(
                "A session (X-Session-ID) stores text only, so it cannot keep this image for "
                "later turns; send the conversation without X-Session-ID.",
                first.param,
                "image_not_supported",
            )
        bound = self.limits.max_images
        if model.images.max_images is not None and model.images.max_images < bound:
            bound = model.images.max_images
        if len(parts) > bound:
            whose = (
                "the gateway takes (GATEWAY_MAX_IMAGES)"
                if bound == self.limits.max_images
                else f"the model '{model.name}' takes"
            )
            raise _refused(
                f"The request has {len(parts)} images; at most {bound} per request {whose}.",
                parts[bound].param,
                "too_many_images",
            )
        target = model.images.formats
        fetches = [asyncio.ensure_future(self._file(part)) for part in parts]
        try:
            files = await asyncio.gather(*fetches)
        except BaseException:
            for fetch in fetches:  # the first refusal ends the others' fetches
                fetch.cancel()
            await asyncio.gather(*fetches, return_exceptions=True)
            raise
        return tuple(
            await asyncio.gather(
                *(
                    asyncio.to_thread(self._checked, data, part, target)
                    for data, part in zip(files, parts, strict=True)
                )
            )
        )

    # -- the file ----------------------------------------------------------------------

    async def _file(self, part: ImagePart) -> bytes:
        url = part.url
        if url[:5].lower() == "data:":
            return self._data_url(url, part.url_param)
        scheme = urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return await self._fetch(url, part.url_param)
        raise _refused(
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
            raise _refused(
                "A data URL image is base64: data:image/png;base64,<data>.",
                param,
                "invalid_image_url",
            )
        if media not in MEDIA_TYPES:
            raise _refused(
                f"The data URL's type is '{media or 'none'}'; images are taken as "
                "image/jpeg, image/png, image/gif or image/webp.",
                param,
                "invalid_image_format",
            )
        if len(payload) // 4 * 3 > self.limits.max_bytes + 3:
            raise self._too_large(param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _refused(
                f"The data URL's base64 does not decode: {exc}.", param, "invalid_image_url"
            ) from exc

    def _too_large(self, param: str) -> InvalidRequestError:
        return _refused(
            f"The image is larger than {self.limits.max_bytes / 1024 / 1024:g} MB "
            "(GATEWAY_MAX_IMAGE_MB).",
            param,
            "image_too_large",
        )

    def _allowed(self, url: httpx.URL) -> bool:
        host = url.host.lower()
        port = url.port or (443 if url.scheme == "https" else 80)
        return any(entry in (host, f"{host}:{port}") for entry in self.limits.hosts)

    async def _fetch(self, raw: str, param: str) -> bytes:
        try:
            url = httpx.URL(raw)
        except httpx.InvalidURL as exc:
            raise _refused(
                f"The image URL is not valid: {exc}.", param, "invalid_image_url"
            ) from exc
        if not url.host or not self._allowed(url):
            allowed = (
                "no host is allowed here, so send the image as a data: URL"
                if not self.limits.hosts
                else "allowed hosts: " + ", ".join(self.limits.hosts)
            )
            raise _refused(
                f"The gateway does not fetch images from '{url.host}' "
                f"(GATEWAY_IMAGE_URL_HOSTS; {allowed}).",
                param,
                "invalid_image_url",
            )
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                return await self._download(url, param)
        except TimeoutError as exc:
            raise _refused(
                f"The image URL did not answer within {self.limits.timeout_s:g} s "
                "(GATEWAY_IMAGE_FETCH_TIMEOUT_S).",
                param,
                "invalid_image_url",
            ) from exc
        except httpx.HTTPError as exc:
            raise _refused(
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
                target = response.headers.get("location", "elsewhere")
                raise _refused(
                    f"The image URL answered {response.status_code}, a redirect to {target}; "
                    "the gateway follows no redirect, so send the image's own URL.",
                    param,
                    "invalid_image_url",
                )
            if response.status_code != 200:
                raise _refused(
                    f"The image URL answered {response.status_code}.", param, "invalid_image_url"
                )
            media = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if media not in MEDIA_TYPES:
                raise _refused(
                    f"The image URL's Content-Type is '{media or 'none'}'; images are taken "
                    "as image/jpeg, image/png, image/gif or image/webp.",
                    param,
                    "invalid_image_format",
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.limits.max_bytes:
                raise self._too_large(param)
            data = bytearray()
            async for chunk in response.aiter_bytes(_CHUNK):
                data += chunk
                if len(data) > self.limits.max_bytes:
                    raise self._too_large(param)
            return bytes(data)

    # -- the picture (in a thread) -----------------------------------------------------

    def _checked(self, data: bytes, part: ImagePart, target: tuple[str, ...]) -> ChatImage:
        """``data`` checked as an image, shrunk for ``detail: low`` and converted to the
        first of ``target`` when the model does not decode its encoding."""
        if len(data) > self.limits.max_bytes:
            raise self._too_large(part.param)
        try:
            picture = Image.open(io.BytesIO(data))
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as exc:
            raise _refused(
                "The image is not a JPEG, PNG, GIF or WebP file the gateway can read.",
                part.param,
                "invalid_image_format",
            ) from exc
        with picture:
            encoding = (picture.format or "").lower()
            width, height = picture.size
            if encoding not in FORMATS:
                raise _refused(
                    f"The image is {picture.format or 'of an unknown format'}; images are "
                    "taken as JPEG, PNG, GIF or WebP.",
                    part.param,
                    "invalid_image_format",
                )
            if width * height > self.limits.max_pixels:
                raise _refused(
                    f"The image is {width}x{height} pixels, more than "
                    f"{self.limits.max_pixels / 1_000_000:g} megapixels "
                    "(GATEWAY_MAX_IMAGE_MEGAPIXELS).",
                    part.param,
                    "image_too_large",
                )
            if getattr(picture, "is_animated", False):
                raise _refused(
                    "Animated images are not taken; send one frame.",
                    part.param,
                    "invalid_image_format",
                )
            shrink = part.detail == "low" and max(width, height) > LOW_DETAIL_PX
            convert = bool(target) and encoding not in target
            if not (shrink or convert):
                return ChatImage(data, encoding, width, height)
            try:
                picture.load()
                if shrink:
                    picture.thumbnail((LOW_DETAIL_PX, LOW_DETAIL_PX))
                out = target[0] if convert else encoding
                encoded = _encode(picture, out)
            except (OSError, ValueError) as exc:
                raise _refused(
                    f"The image could not be decoded: {exc}.",
                    part.param,
                    "invalid_image_format",
                ) from exc
            return ChatImage(encoded, out, *picture.size)


def _encode(picture: Image.Image, encoding: str) -> bytes:
    """``picture`` as a file of ``encoding``; JPEG has no transparency, so what was
    transparent becomes white."""
    if encoding == "jpeg" and picture.mode != "RGB":
        rgba = picture.convert("RGBA")
        flat = Image.new("RGB", rgba.size, "white")
        flat.paste(rgba, mask=rgba.getchannel("A"))
        picture = flat
    buffer = io.BytesIO()
    options: dict[str, Any] = {"quality": 90} if encoding in ("jpeg", "webp") else {}
    picture.save(buffer, format=encoding.upper(), **options)
    return buffer.getvalue()


def template_messages(
    messages: list[dict[str, Any]],
    request: Sequence[ChatMessage],
    model: ModelInfo,
) -> list[dict[str, Any]]:
    """``messages`` (as :func:`gateway.serving.tools.for_template` made them) for a model
    that sees images: each content a list of Hugging Face parts, a message of ``request``
    with image parts keeping its parts' order. Other models' messages are unchanged.
    ``request``'s messages are the last of ``messages`` (a session's come first)."""
    if model.images is None:
        return messages
    offset = len(messages) - len(request)
    shaped = []
    for index, message in enumerate(messages):
        own = request[index - offset] if index >= offset else None
        parts: list[dict[str, Any]]
        if own is not None and isinstance(own.content, list):
            parts = []
            for part in own.content:
                if part.type == "image_url":
                    parts.append({"type": "image"})
                elif part.type == "text" and part.text is not None:
                    parts.append({"type": "text", "text": part.text})
                elif part.type == "refusal" and part.refusal is not None:
                    parts.append({"type": "text", "text": part.refusal})
        else:
            text = message.get("content") or ""
            parts = [{"type": "text", "text": text}] if text else []
        shaped.append({**message, "content": parts})
    return shaped
