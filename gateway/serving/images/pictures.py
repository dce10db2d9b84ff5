"""An image's file checked as a picture (JPEG, PNG, WebP or still GIF, within the pixel
bound), shrunk for ``detail: low``, converted for a model that decodes fewer encodings. CPU
work: called in a thread."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, UnidentifiedImageError

from gateway.backend import ChatImage
from gateway.serving.images.parts import LOW_DETAIL_PX, ImageLimits, ImagePart, refused, too_large

FORMATS = ("jpeg", "png", "gif", "webp")


def checked(
    data: bytes, part: ImagePart, target: tuple[str, ...], limits: ImageLimits
) -> ChatImage:
    """``data`` checked as an image, shrunk for ``detail: low`` and converted to the
    first of ``target`` when the model does not decode its encoding."""
    if len(data) > limits.max_bytes:
        raise too_large(limits, part.param)
    try:
        # Only these formats' parsers run on a client's bytes.
        picture = Image.open(io.BytesIO(data), formats=[f.upper() for f in FORMATS])
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as exc:
        raise refused(
            "The image is not a JPEG, PNG, GIF or WebP file the gateway can read.",
            part.param,
            "invalid_image_format",
        ) from exc
    with picture:
        encoding = (picture.format or "").lower()
        if encoding == "mpo":  # a phone's JPEG with more pictures after the first: a JPEG
            encoding = "jpeg"
        width, height = picture.size
        if encoding not in FORMATS:
            raise refused(
                f"The image is {picture.format or 'of an unknown format'}; images are "
                "taken as JPEG, PNG, GIF or WebP.",
                part.param,
                "invalid_image_format",
            )
        if width * height > limits.max_pixels:
            raise refused(
                f"The image is {width}x{height} pixels, more than "
                f"{limits.max_pixels / 1_000_000:g} megapixels "
                "(GATEWAY_MAX_IMAGE_MEGAPIXELS).",
                part.param,
                "image_too_large",
            )
        if getattr(picture, "is_animated", False):
            raise refused(
                "Animated images are not taken; send one frame.",
                part.param,
                "invalid_image_format",
            )
        shrink = part.detail == "low" and max(width, height) > LOW_DETAIL_PX
        convert = bool(target) and encoding not in target
        if not (shrink or convert):
            return ChatImage(data, encoding, width, height)
        try:
            if shrink:  # a JPEG is decoded at a fraction of its size (Pillow's draft mode)
                picture.thumbnail((LOW_DETAIL_PX, LOW_DETAIL_PX))
            out = target[0] if convert else encoding
            encoded = _encode(picture, out)
        except (OSError, ValueError) as exc:  # Pillow's words (may name its internals)
            raise refused(
                f"The image's {encoding.upper()} data could not be decoded (a truncated or "
                "damaged file?).",
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
