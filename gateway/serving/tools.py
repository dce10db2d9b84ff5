"""Tool calling: the request's tools and messages checked, and how the reply is read.

- ``tool_choice`` ``auto`` (the default with tools): the model's chat template gets the tools
  and the model decides; the parser its config names (``tool_call_parser``) reads calls
  out of its text. A model without one cannot serve ``auto`` (400).
- ``required`` and a named function: enforced with constrained decoding (see
  :mod:`gateway.serving.structured`), so the call always parses, even from a small model.
- ``none``: the tools are not shown to the model.

Messages keep OpenAI's shape (assistant ``tool_calls`` with JSON-string arguments, ``tool``
results with ``tool_call_id``); :func:`for_template` turns them into what Hugging Face chat
templates expect (arguments as objects, a tool result's function ``name``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.backend import ModelInfo
from gateway.errors import BackendError, InvalidRequestError
from gateway.serving.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from gateway.serving.structured import (
    check_schema,
    named_call_constraint,
    required_calls_constraint,
)
from gateway.serving.tool_parsers import ToolParser, get_parser, parser_names
from gateway.serving.tool_parsers.forced import CallArrayParser, NamedCallParser


@dataclass(frozen=True)
class ToolPlan:
    """How a request's reply is read for calls."""

    mode: str
    """``auto``, ``required`` or ``named``."""
    names: tuple[str, ...]
    parser: type[ToolParser] | None = None
    function: str | None = None

    def new_parser(self) -> ToolParser:
        """A parser for one choice (parsers keep state)."""
        if self.mode == "named" and self.function is not None:
            return NamedCallParser(self.function)
        if self.mode == "required":
            return CallArrayParser(self.names)
        assert self.parser is not None
        return self.parser(self.names)


@dataclass(frozen=True)
class ToolSetup:
    plan: ToolPlan | None
    constraint: dict[str, Any] | None
    """The constraint a forced call needs."""
    template_tools: list[dict[str, Any]] | None
    """The tools as the chat template gets them (None: not shown)."""


_NO_TOOLS = ToolSetup(None, None, None)


def setup(request: ChatCompletionRequest, model: ModelInfo) -> ToolSetup:
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError(
                "tool_choice is only allowed when tools are specified.", param="tool_choice"
            )
        return _NO_TOOLS
    names: list[str] = []
    for index, tool in enumerate(request.tools):
        if tool.function.name in names:
            raise InvalidRequestError(
                f"Two tools are named '{tool.function.name}'.",
                param=f"tools.[{index}].function.name",
            )
        names.append(tool.function.name)
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools.[{index}].function.parameters")
    if choice == "none":
        return _NO_TOOLS
    shown = [tool.model_dump(exclude_none=True) for tool in request.tools]
    if isinstance(choice, NamedToolChoice):
        wanted = choice.function.name
        named = next((t for t in request.tools if t.function.name == wanted), None)
        if named is None:
            raise InvalidRequestError(
                f"tool_choice names '{wanted}', which is not one of the tools.",
                param="tool_choice",
            )
        plan = ToolPlan("named", tuple(names), function=wanted)
        return ToolSetup(plan, named_call_constraint(named, model), shown)
    if choice == "required":
        parallel = request.parallel_tool_calls is not False
        constraint = required_calls_constraint(request.tools, parallel, model)
        return ToolSetup(ToolPlan("required", tuple(names)), constraint, shown)
    if model.tool_call_parser is None:
        raise InvalidRequestError(
            f"The model '{model.name}' cannot choose to call tools: its config names no "
            "tool_call_parser. Use tool_choice 'required' or a named function.",
            param="tool_choice" if choice else "tools",
            code="unsupported_parameter",
        )
    parser = get_parser(model.tool_call_parser)
    if parser is None:
        raise BackendError(
            f"The model '{model.name}' names an unknown tool_call_parser "
            f"'{model.tool_call_parser}' (known: {', '.join(parser_names())}).",
            code="model_config_error",
        )
    return ToolSetup(ToolPlan("auto", tuple(names), parser=parser), None, shown)


def _text(index: int, message: ChatMessage) -> str | None:
    if message.content is None or isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.type != "text":
            raise InvalidRequestError(
                f"Content parts of type '{part.type}' are not supported; only 'text' is.",
                param=f"messages.[{index}].content",
            )
        if part.text is None:
            raise InvalidRequestError(
                "A content part of type 'text' needs a 'text' field.",
                param=f"messages.[{index}].content",
            )
        texts.append(part.text)
    return "\n".join(texts)


def openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages checked and as plain dicts (content as text); a ``tool``
    message must answer a call an earlier assistant message made."""
    calls: dict[str, str] = {}  # call id -> function name
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message.role == "function":
            raise InvalidRequestError(
                "Messages with role 'function' (deprecated) are not supported; use 'tool'.",
                param=f"messages.[{index}].role",
            )
        # "developer" is the newer name of "system"; chat templates know "system".
        role = "system" if message.role == "developer" else message.role
        content = _text(index, message)
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and message.tool_calls:
            item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
            calls.update({call.id: call.function.name for call in message.tool_calls})
        elif content is None:
            raise InvalidRequestError(
                f"Messages with role '{message.role}' need content.",
                param=f"messages.[{index}].content",
            )
        if role == "tool":
            if not message.tool_call_id:
                raise InvalidRequestError(
                    "A tool message needs the tool_call_id of the call it answers.",
                    param=f"messages.[{index}].tool_call_id",
                )
            if message.tool_call_id not in calls:
                raise InvalidRequestError(
                    f"tool_call_id '{message.tool_call_id}' matches no tool call of an earlier "
                    "assistant message.",
                    param=f"messages.[{index}].tool_call_id",
                )
            item["tool_call_id"] = message.tool_call_id
            item["name"] = calls[message.tool_call_id]
        out.append(item)
    return out


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates take them: a call's arguments as an object
    (when they are valid JSON), content never None."""
    rendered = []
    for message in messages:
        item = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            item["tool_calls"] = [
                {
                    **call,
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _arguments(call["function"]["arguments"]),
                    },
                }
                for call in message["tool_calls"]
            ]
        rendered.append(item)
    return rendered
