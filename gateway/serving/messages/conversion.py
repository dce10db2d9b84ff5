"""Between the Anthropic Messages API and the chat path: a request to the chat request it is
served as (with the Messages names of the parameters the chat path checks, so each error
names what the client sent), and an answer to a message's content blocks and its
``stop_reason``.

What the request alone can tell is checked here first: a block or tool the gateway does not
serve (documents, server tools), a ``tool_result`` that answers no ``tool_use``, an image
source without its data, a ``tool_choice`` of type ``tool`` without a ``name``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.serving.messages.protocol import (
    CountTokensRequest,
    ImageBlock,
    MessagesRequest,
    ServerTool,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.serving.protocol import ChatCompletionRequest, ParamNames, Usage
from gateway.serving.tool_parsers import ParsedCall

#: The Messages names of the chat request's fields.
_CHAT_NAMES = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "response_format": "output_config.format",
    "reasoning_effort": "output_config.effort",
}

#: The Messages names of the parameters the chat path checks against the model (a tool's
#: schema is named by the chat path's word for it, ``tools[i].parameters``: its
#: ``input_schema``).
MESSAGES_NAMES = ParamNames(
    max_tokens="max_tokens",
    tools="tools",
    tool="tools[{}]",
    tool_choice="tool_choice",
    response_format="output_config.format",
    json_schema="output_config.format",
    messages="messages",
    reasoning_effort="output_config.effort",
    effort_is_hint=True,
    image_url="source",
)


#: The block types served (each in the turns it belongs to).
_SERVED = ("text", "image", "tool_use", "tool_result", "thinking")


def _unsupported_block(kind: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Content blocks of type '{kind}' are not supported by this gateway (text, image, "
        "tool_use, tool_result and thinking are).",
        param=f"{param}.type",
        code="unsupported_value",
    )


def _image_url(block: ImageBlock, param: str) -> str:
    source = block.source
    if source.type == "url":
        if not source.url:
            raise InvalidRequestError("An image of type 'url' needs its url.", param=param)
        return source.url
    if not (source.data and source.media_type):
        raise InvalidRequestError(
            "An image of type 'base64' needs its media_type and data.", param=param
        )
    return f"data:{source.media_type};base64,{source.data}"


def _system(request: CountTokensRequest) -> list[dict[str, Any]]:
    if request.system is None:
        return []
    text = (
        request.system
        if isinstance(request.system, str)
        else "\n\n".join(block.text for block in request.system)
    )
    return [{"role": "system", "content": text}] if text else []


def _tool_result_text(block: ToolResultBlock, param: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    texts = []
    for index, part in enumerate(block.content):
        if not isinstance(part, TextBlock):
            raise InvalidRequestError(
                "A tool_result's content is text here; an image in a tool_result is not supported.",
                param=f"{param}.content[{index}].type",
                code="unsupported_value",
            )
        texts.append(part.text)
    return "\n".join(texts)


#: Opens a ``thinking`` block's ``signature`` (the reasoning sealed in it), or raises a
#: 400 naming the ``param`` given.
Opener = Callable[[str, str], str]


def _thinking(block: ThinkingBlock, param: str, opener: Opener | None) -> str:
    """A ``thinking`` block's reasoning: the one sealed in its ``signature`` (the thinking
    shown must be that one, or empty when its display was omitted), else its text as sent
    (a block without a signature: from another server)."""
    if not block.signature or opener is None:
        return block.thinking
    sealed = opener(block.signature, f"{param}.signature")
    if block.thinking and block.thinking != sealed:
        raise InvalidRequestError(
            "This thinking block's text is not the one its signature seals: send thinking "
            "blocks back unchanged.",
            param=f"{param}.thinking",
        )
    return sealed


def chat_messages(
    request: CountTokensRequest, opener: Opener | None = None
) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``system`` first; a user turn's ``tool_result``
    blocks become tool messages (before the rest of the turn, as the chat templates want
    them right after the calls); an assistant turn's ``tool_use`` blocks its tool calls and
    its ``thinking`` its reasoning (``opener`` opens a signed one)."""
    messages = _system(request)
    called: set[str] = set()
    for index, message in enumerate(request.messages):
        param = f"messages[{index}]"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            continue
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        results: list[dict[str, Any]] = []
        for j, block in enumerate(message.content):
            where = f"{param}.content[{j}]"
            if isinstance(block, TextBlock):
                parts.append({"type": "text", "text": block.text})
            elif isinstance(block, ImageBlock) and message.role == "user":
                url = _image_url(block, f"{where}.source")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif isinstance(block, ToolUseBlock) and message.role == "assistant":
                called.add(block.id)
                arguments = json.dumps(block.input)
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": arguments},
                    }
                )
            elif isinstance(block, ToolResultBlock) and message.role == "user":
                if block.tool_use_id not in called:
                    raise InvalidRequestError(
                        f"tool_use_id '{block.tool_use_id}' answers no tool_use block of an "
                        "earlier assistant turn.",
                        param=f"{where}.tool_use_id",
                    )
                text = _tool_result_text(block, where)
                if block.is_error:
                    text = f"Error: {text}"
                results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
            elif isinstance(block, ThinkingBlock) and message.role == "assistant":
                thinking.append(_thinking(block, where, opener))
            elif block.type in _SERVED:
                article = "An" if message.role == "assistant" else "A"
                raise InvalidRequestError(
                    f"{article} {message.role} turn cannot hold a '{block.type}' block.",
                    param=f"{where}.type",
                )
            else:
                raise _unsupported_block(block.type, where)
        messages.extend(results)
        if message.role == "assistant":
            reply: dict[str, Any] = {"role": "assistant", "content": _joined(parts)}
            if calls:
                reply["tool_calls"] = calls
            if thinking:
                reply["reasoning_content"] = "".join(thinking)
            messages.append(reply)
        elif parts:
            messages.append({"role": "user", "content": parts})
    return messages


def _joined(parts: list[dict[str, Any]]) -> str | None:
    texts = [part["text"] for part in parts]
    return "".join(texts) if texts else None


def chat_tools(request: CountTokensRequest) -> list[dict[str, Any]] | None:
    """The client tools as chat functions; a server tool is refused by name."""
    if not request.tools:
        return None
    tools = []
    for index, tool in enumerate(request.tools):
        if isinstance(tool, ServerTool):
            raise InvalidRequestError(
                f"Tools of type '{tool.type}' are Anthropic's server tools, which this "
                "gateway does not run; give client tools (name, description, input_schema) "
                "and run them yourself.",
                param=f"tools[{index}].type",
                code="unsupported_tool",
            )
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description:
            function["description"] = tool.description
        if tool.strict:
            function["strict"] = True
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(request: CountTokensRequest) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls``."""
    choice = request.tool_choice
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequestError(
                "tool_choice of type 'tool' needs the tool's name.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def image_names(request: CountTokensRequest) -> tuple[str, ...]:
    """The request's image blocks as it names them, in the order the chat request holds
    them (``ParamNames.image_parts``: an image's error names the block sent)."""
    return tuple(
        f"messages[{i}].content[{j}]"
        for i, message in enumerate(request.messages)
        if not isinstance(message.content, str)
        for j, block in enumerate(message.content)
        if isinstance(block, ImageBlock)
    )


def chat_request(
    request: CountTokensRequest, opener: Opener | None = None
) -> ChatCompletionRequest:
    """The chat request ``request`` is served as (a count's asks for one token: it
    generates nothing)."""
    tool_choice, parallel = _tool_choice(request)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request, opener),
        "max_completion_tokens": 1,
        "tools": chat_tools(request),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
    }
    config = request.output_config
    if config is not None and config.format is not None:
        schema = {"name": "output", "schema": config.format.schema_}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if config is not None and config.effort is not None:
        body["reasoning_effort"] = config.effort
    if isinstance(request, MessagesRequest):
        body |= {
            "max_completion_tokens": request.max_tokens,
            "stop": request.stop_sequences or None,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "user": request.metadata.user_id if request.metadata else None,
        }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # what the chat path cannot take, named as sent
        first = exc.errors()[0]
        where = [str(part) for part in first["loc"]]
        name = _CHAT_NAMES.get(where[0], where[0]) if where else "messages"
        raise InvalidRequestError(
            f"The request cannot be served as given: {first['msg']}.", param=name
        ) from None


def wants_thinking(request: CountTokensRequest) -> bool:
    """Whether the answer has ``thinking`` blocks (shown, or only signed: :func:`omitted`)."""
    thinking = request.thinking
    return thinking is not None and thinking.type != "disabled"


def omitted(request: CountTokensRequest) -> bool:
    """Whether a ``thinking`` block's text is left out (``display: "omitted"``): only its
    ``signature`` is sent, from which the reasoning is taken when it comes back."""
    return request.thinking is not None and request.thinking.display == "omitted"


def stop_reason(finish_reason: str, calls: bool, stop_sequence: str | None) -> str:
    """Anthropic's ``stop_reason`` for the chat path's ``finish_reason`` and the stop string
    the text was cut at."""
    if calls:
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def tool_use_block(call: ParsedCall) -> dict[str, Any]:
    """A call as a ``tool_use`` block (arguments that are not a JSON object: ``{}``, the
    text kept under ``"arguments"``, rather than a 500)."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = {"arguments": call.arguments}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def message(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stopped: str | None,
    counted: dict[str, Any],
    stop_sequence: str | None = None,
) -> dict[str, Any]:
    """A message object (the whole answer, or ``message_start``'s, with no content yet)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stopped,
        "stop_sequence": stop_sequence if stopped == "stop_sequence" else None,
        "usage": counted,
    }


def usage(counted: Usage) -> dict[str, Any]:
    return {
        "input_tokens": counted.prompt_tokens,
        "output_tokens": counted.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "service_tier": "standard",
    }
