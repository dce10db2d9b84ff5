"""Images as a client sends them: a picture encoded in memory, its data URL, and a chat
template that takes image parts."""

from __future__ import annotations

import base64
import io
import os

from PIL import Image

#: ChatML whose content is Hugging Face's list of parts (as multimodal templates take it).
VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% for p in m.content %}{% if p.type == 'image' %}<image>{% else %}{{ p.text }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def picture(
    width: int, height: int, encoding: str = "PNG", mode: str = "RGB", noise: bool = False
) -> bytes:
    image = Image.new(mode, (width, height), (10, 200, 30, 0) if mode == "RGBA" else "red")
    if noise:
        image = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    buffer = io.BytesIO()
    image.save(buffer, format=encoding)
    return buffer.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"
