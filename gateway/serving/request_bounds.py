"""Bounds on what one chat request may hold: messages, content parts, and its tools' size.

They come after :mod:`gateway.serving.json_shape` has bounded the body as a whole (so what
is counted here was already cheap to build), and before any work: the prompt is not
rendered, nothing is sent to a model. Responses requests are checked here too, once turned
into a chat request, and their errors name the Responses parameters (``input``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter

from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import (
    ChatCompletionRequest,
    ChatTool,
    FunctionDefinition,
    ParamNames,
)

_TOOLS = TypeAdapter(list[ChatTool])
_FUNCTIONS = TypeAdapter(list[FunctionDefinition])


@dataclass(frozen=True)
class RequestBounds:
    """``GATEWAY_MAX_MESSAGES``, ``GATEWAY_MAX_CONTENT_PARTS`` and ``GATEWAY_MAX_TOOLS_KB``."""

    messages: int = Settings.model_fields["max_messages"].default
    content_parts: int = Settings.model_fields["max_content_parts"].default
    tools_kb: int = Settings.model_fields["max_tools_kb"].default

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestBounds:
        return cls(settings.max_messages, settings.max_content_parts, settings.max_tools_kb)

    def check(self, request: ChatCompletionRequest, names: ParamNames) -> None:
        """A 400 naming the first bound ``request`` passes."""
        if len(request.messages) > self.messages:
            raise InvalidRequestError(
                f"The request has {len(request.messages)} messages; at most {self.messages} "
                "are allowed per request (GATEWAY_MAX_MESSAGES).",
                param=names.messages,
                code="too_many_messages",
            )
        parts = sum(
            len(message.content)
            for message in request.messages
            if isinstance(message.content, list)
        )
        if parts > self.content_parts:
            raise InvalidRequestError(
                f"The request's messages have {parts} content parts together; at most "
                f"{self.content_parts} are allowed per request (GATEWAY_MAX_CONTENT_PARTS).",
                param=names.messages,
                code="too_many_content_parts",
            )
        # Legacy ``functions`` are tools too (they become them after this check).
        tools, functions = request.tools or [], request.functions or []
        if tools or functions:
            size = len(_TOOLS.dump_json(tools, exclude_unset=True)) + len(
                _FUNCTIONS.dump_json(functions, exclude_unset=True)
            )
            if size > self.tools_kb * 1024:
                raise InvalidRequestError(
                    f"The request's tools are {size // 1024} KB of JSON together; at most "
                    f"{self.tools_kb} KB are allowed (GATEWAY_MAX_TOOLS_KB).",
                    param=names.tools,
                    code="tools_too_large",
                )
