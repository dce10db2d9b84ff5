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
token like any other answer. In the TensorRT-LLM multimodal ensemble the image travels as the
real one's does, step to step: ``preprocessing_vision`` decodes it into ``PIXEL_VALUES``,
``multimodal_encoders`` turns those into a "prompt embedding table" (here one row per image
that holds its size: :func:`encode`), which ``tensorrt_llm`` reads (:func:`decode`).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

PLACEHOLDER = "<image>"
_JPEG_URL = "data:image/jpeg;base64,"


@dataclass(frozen=True)
class Seen:
    """An image as the model decoded it."""

    width: int
    height: int
    format: str


def _image(data: bytes) -> Any:
    # Imported here: the text stand-ins that import this module need no Pillow.
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _opened(data: bytes) -> Seen:
    with _image(data) as image:
        seen = Seen(image.width, image.height, image.format or "unknown")
        image.convert("RGB")  # decoded whole, as the backends do
    return seen


def vllm_images(elements: list[bytes]) -> list[Seen]:
    """The vLLM backend's ``image`` input: base64 text per element."""
    return [_opened(base64.b64decode(element.decode("utf-8"))) for element in elements]


def _url_file(raw: bytes) -> bytes:
    url = raw.decode("utf-8")
    if not url.startswith(_JPEG_URL):
        raise ValueError(
            f"the stand-in fetches no URL ({url[:40]}...); the real preprocessing would "
            "fetch it with requests.get"
        )
    return base64.b64decode(url.split(",")[1])


def url_images(urls: list[bytes]) -> list[Seen]:
    """TensorRT-LLM's ``image_url_input``: JPEG data URLs only (see the module doc)."""
    return [_opened(_url_file(raw)) for raw in urls]


def url_pixels(urls: list[bytes]) -> np.ndarray:
    """The preprocessing's ``PIXEL_VALUES`` of one batch item's image URLs: ``[images, 3,
    height, width]`` in [0, 1], FP16 (the images of one item must have one size)."""
    pictures = []
    for raw in urls:
        with _image(_url_file(raw)) as image:
            pictures.append(np.asarray(image.convert("RGB"), dtype=np.float16) / 255)
    return np.stack([p.transpose(2, 0, 1) for p in pictures]).astype(np.float16)


def encode(pixels: np.ndarray) -> np.ndarray:
    """The multimodal encoder stand-in's "embedding" of ``[images, 3, height, width]``
    pixels: ``[images, 4]`` rows, one per image holding its width and height, split so that
    FP16 holds them exactly (every value below 1024)."""
    _, _, height, width = pixels.shape
    row = [width // 1024, width % 1024, height // 1024, height % 1024]
    return np.array([row] * pixels.shape[0], dtype=np.float16)


def decode(table: np.ndarray) -> list[Seen]:
    """The rows of :func:`encode` back as images (JPEG: the one form the preprocessing
    decodes)."""
    rows = np.asarray(table, dtype=np.float32).reshape(-1, 4).astype(int)
    return [Seen(int(w1 * 1024 + w0), int(h1 * 1024 + h0), "JPEG") for w1, w0, h1, h0 in rows]


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
