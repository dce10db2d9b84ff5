"""What the vision stand-ins do with images: decode them as the real backends do, and answer
with what they received, so tests can assert that every image arrived, whole and in order.

- vLLM backend (``vllm_backend`` ``src/utils/request.py``, r25.01+): each element of the
  ``image`` input is a plain base64 string, decoded with ``base64.b64decode`` and opened
  with PIL (``Image.open(...).convert("RGB")``), so anything PIL reads is taken.
- TensorRT-LLM (``tensorrtllm_backend`` ``preprocessing`` ``load_images_from_urls``,
  r25.02+): each ``image_url_input`` is decoded when it starts with
  ``data:image/jpeg;base64,``; any other URL the real preprocessing fetches with
  ``requests.get``. The stand-ins fetch nothing: such a URL is their error.
- The rendered prompt must hold one ``<image>`` placeholder per image (the chat template
  puts them where the image parts were); vLLM refuses a mismatch too, in its own words.

The answer is ``Saw N image(s): WxH FORMAT, ...`` (the format PIL read), generated token by
token like any other answer.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from PIL import Image

PLACEHOLDER = "<image>"
_JPEG_URL = "data:image/jpeg;base64,"


@dataclass(frozen=True)
class Seen:
    """An image as the model decoded it."""

    width: int
    height: int
    format: str


def _opened(data: bytes) -> Seen:
    with Image.open(io.BytesIO(data)) as image:
        seen = Seen(image.width, image.height, image.format or "unknown")
        image.convert("RGB")  # decoded whole, as the backends do
    return seen


def vllm_images(elements: list[bytes]) -> list[Seen]:
    """The vLLM backend's ``image`` input: base64 text per element."""
    return [_opened(base64.b64decode(element.decode("utf-8"))) for element in elements]


def url_images(urls: list[bytes]) -> list[Seen]:
    """TensorRT-LLM's ``image_url_input``: JPEG data URLs only (see the module doc)."""
    seen = []
    for raw in urls:
        url = raw.decode("utf-8")
        if not url.startswith(_JPEG_URL):
            raise ValueError(
                f"the stand-in fetches no URL ({url[:40]}...); the real preprocessing would "
                "fetch it with requests.get"
            )
        seen.append(_opened(base64.b64decode(url.split(",")[1])))
    return seen


def check_placeholders(prompt: str, images: list[Seen]) -> None:
    found = prompt.count(PLACEHOLDER)
    if found != len(images):
        raise ValueError(
            f"the prompt has {found} image placeholder(s) ({PLACEHOLDER}) for "
            f"{len(images)} image(s)"
        )


def describe(images: list[Seen]) -> str:
    listed = ", ".join(f"{i.width}x{i.height} {i.format}" for i in images)
    return f"Saw {len(images)} image{'s' if len(images) != 1 else ''}: {listed}."
