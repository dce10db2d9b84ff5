"""Image parts where a request has them, checked for shape, and the messages a vision
model's chat template gets (Hugging Face's parts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import Environment, TemplateSyntaxError, nodes

from gateway.backend import ModelInfo
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import ChatMessage, ParamNames

DETAILS = ("auto", "low", "high")
#: ``detail: low``: the image shrunk to fit this square (OpenAI's low-resolution size).
LOW_DETAIL_PX = 512
#: Parses chat templates for :func:`takes_parts` (never renders).
_PARSER = Environment()


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


def refused(message: str, param: str, code: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def too_large(limits: ImageLimits, param: str) -> InvalidRequestError:
    return refused(
        f"The image is larger than {limits.max_bytes / 1024 / 1024:g} MB (GATEWAY_MAX_IMAGE_MB).",
        param,
        "image_too_large",
    )


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
            if converted:  # a Responses input_image (detail beside its URL) or Messages image
                param = names.image_parts[index]
                url_param, detail_param = f"{param}.{names.image_url}", f"{param}.detail"
            else:
                param = f"{names.messages}.[{i}].content.[{j}]"
                url_param, detail_param = f"{param}.image_url.url", f"{param}.image_url.detail"
            if message.role != "user":
                raise refused(
                    f"Only user messages carry images; this one is a {message.role} message.",
                    param,
                    "invalid_value",
                )
            value = part.image_url
            if isinstance(value, str):  # some clients send the URL bare
                value = {"url": value}
            if not isinstance(value, dict) or not isinstance(value.get("url"), str):
                raise refused(
                    'An image_url part needs \'image_url\': {"url": ..., "detail": ...}.',
                    param,
                    "invalid_image_url",
                )
            unknown = sorted(set(value) - {"url", "detail"})
            if unknown:
                raise refused(
                    f"image_url takes 'url' and 'detail'; '{unknown[0]}' is not one of them.",
                    f"{param}.image_url.{unknown[0]}",
                    "unknown_parameter",
                )
            detail = value.get("detail") or "auto"
            if detail not in DETAILS:
                raise refused(
                    f"detail is '{detail}'; it takes 'auto', 'low' (the image shrunk to fit "
                    f"{LOW_DETAIL_PX}x{LOW_DETAIL_PX}) or 'high' (the image as sent).",
                    detail_param,
                    "invalid_value",
                )
            found.append(ImagePart(i, j, param, value["url"], detail, url_param))
    return found


@lru_cache(maxsize=64)
def takes_parts(template: str) -> bool:
    """Whether a chat template loops over a message's content (``{% for part in
    message['content'] %}``, filtered or not), as multimodal templates do: only then can it
    place images, and only then is content given to it as a list of parts (the test vLLM's
    chat utilities make of a template, read from its syntax tree)."""
    try:
        tree = _PARSER.parse(template)
    except TemplateSyntaxError:
        return False  # rendering reports it
    for loop in tree.find_all(nodes.For):
        for node in (loop.iter, *loop.iter.find_all((nodes.Getitem, nodes.Getattr))):
            if isinstance(node, nodes.Getattr) and node.attr == "content":
                return True
            key = node.arg if isinstance(node, nodes.Getitem) else None
            if isinstance(key, nodes.Const) and key.value == "content":
                return True
    return False


def template_messages(
    messages: list[dict[str, Any]],
    request: Sequence[ChatMessage],
    model: ModelInfo,
    template: str,
    names: ParamNames,
) -> list[dict[str, Any]]:
    """``messages`` (as :func:`gateway.serving.tools.for_template` made them) for a model
    that sees images and whose ``template`` takes parts (:func:`takes_parts`): each content
    a list of Hugging Face parts, a message of ``request`` with image parts keeping its
    parts' order. Other models' messages are unchanged; images for a template that cannot
    place them are a 400 (named as ``names`` does). ``request``'s messages are the last of
    ``messages`` (a session's come first)."""
    if model.image_input is None:
        return messages
    if not takes_parts(template):
        found = image_parts(request, names)
        if found:
            raise refused(
                f"The model '{model.name}' sees images, but its chat template does not loop "
                "over message content parts, so it has no place for them (the operator can "
                "give it a multimodal template).",
                found[0].param,
                "image_not_supported",
            )
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
