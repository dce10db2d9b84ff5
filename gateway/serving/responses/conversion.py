"""Conversion between the Responses API and the chat path: input items to chat messages
(and to stored items), the request to the chat request it is served as (tools and
``text.format`` in their chat form) with the Responses names of the chat parameters, and
generated output to output items, the response object and the record the store keeps.

What the chat path would refuse in what it is given is checked here first, on the
Responses request, so each error names the Responses parameter where it is raised: an
item's content parts, role and ``call_id``, a tool's type and name, the format's name.
The checks that need the model (the context, tools, constraints, what it takes) are the
chat path's, given the Responses names in :data:`RESPONSES_NAMES`."""

from __future__ import annotations

from typing import Any

from gateway.backend import TokenLogprob
from gateway.errors import InvalidRequestError
from gateway.serving.chat import PreparedChat
from gateway.serving.protocol import ChatCompletionRequest, ParamNames, Usage
from gateway.serving.responses.items import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    ReasoningItem,
    dump,
    dump_all,
)
from gateway.serving.responses.protocol import (
    ContentPart,
    InputItem,
    PreparedResponse,
    ResponsesRequest,
    TextConfig,
    ToolChoiceFunction,
)
from gateway.serving.responses.tools import ToolNames, stored_tools
from gateway.serving.sampling import logprob_items
from gateway.state.responses import StoredResponse, new_id


def _text_of(parts: str | list[ContentPart] | None, param: str) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    texts = []
    for index, part in enumerate(parts):
        if part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)  # what the assistant said, as OpenAI gives it back
            continue
        if part.type not in ("input_text", "output_text", "text"):
            raise InvalidRequestError(
                f"Content parts of type '{part.type}' are not supported; send input_text.",
                param=f"{param}[{index}].type",
            )
        if part.text is None:
            raise InvalidRequestError(
                f"A content part of type '{part.type}' needs its text.",
                param=f"{param}[{index}].text",
            )
        texts.append(part.text)
    return "".join(texts)


def _has_images(parts: str | list[ContentPart] | None) -> bool:
    return isinstance(parts, list) and any(p.type == "input_image" for p in parts)


def _with_images(
    parts: list[ContentPart], param: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Content with ``input_image`` parts: as chat content parts (``image_url`` parts, which
    the chat path reads, see :mod:`gateway.serving.images`), and as the items keep it."""
    chat: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        name = f"{param}[{index}]"
        if part.type != "input_image":
            text = _text_of([part], param)
            chat.append({"type": "text", "text": text})
            kept.append({"type": "input_text", "text": text})
            continue
        if part.file_id is not None:
            raise InvalidRequestError(
                "file_id is not supported: the gateway has no Files API. Send the image in "
                "image_url (a data: URL, or an http(s) URL on a host the operator allows).",
                param=f"{name}.file_id",
                code="unsupported_parameter",
            )
        if not isinstance(part.image_url, str) or not part.image_url:
            raise InvalidRequestError(
                "An input_image part needs its image_url (a data: or http(s) URL).",
                param=f"{name}.image_url",
            )
        detail = part.detail if part.detail is not None else "auto"
        chat.append({"type": "image_url", "image_url": {"url": part.image_url, "detail": detail}})
        kept.append({"type": "input_image", "image_url": part.image_url, "detail": detail})
    return chat, kept


def image_names(items: str | list[InputItem], history: list[dict[str, Any]]) -> tuple[str, ...]:
    """The Responses names of the images of the chat messages ``history`` + ``items``
    make, in order (see ``ParamNames.image_parts``): an image of the stored chain is named
    by ``previous_response_id``."""
    earlier = sum(
        1
        for message in history
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    )
    names = ["previous_response_id"] * earlier
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item.content, list) and (item.type or "message") == "message":
                names += [
                    f"input[{index}].content[{j}]"
                    for j, part in enumerate(item.content)
                    if part.type == "input_image"
                ]
    return tuple(names)


def input_messages(
    items: str | list[InputItem], history: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input as chat messages, and as stored input items (with ids). ``history``: the
    chat messages of the stored chain it continues, whose calls its outputs may answer."""
    if isinstance(items, str):
        only: dict[str, Any] = {"id": new_id("msg"), "type": "message", "role": "user"}
        only |= {"status": "completed", "content": [{"type": "input_text", "text": items}]}
        return [{"role": "user", "content": items}], [only]
    messages: list[dict[str, Any]] = []
    stored: list[dict[str, Any]] = []
    calls = {call["id"] for message in history for call in message.get("tool_calls") or ()}
    reasoning: str | None = None  # a reasoning item's, for the assistant message after it
    for index, item in enumerate(items):
        param = f"input[{index}]"
        kind = item.type or ("message" if item.role else None)
        if kind == "reasoning":
            reasoning = _reasoning_of(item, param)
            stored.append(dump(ReasoningItem.done(item.id or new_id("rs"), reasoning)))
            continue
        if kind == "message":
            if item.role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(
                    f"Unknown role '{item.role}'.", param=f"{param}.role", code="invalid_value"
                )
            part = "output_text" if item.role == "assistant" else "input_text"
            if _has_images(item.content):
                assert isinstance(item.content, list)
                chat_parts, kept = _with_images(item.content, f"{param}.content")
                messages.append({"role": item.role, "content": chat_parts})
            else:
                text = _text_of(item.content, f"{param}.content")
                messages.append({"role": item.role, "content": text})
                kept = [{"type": part, "text": text}]
            if item.role == "assistant" and reasoning:
                messages[-1]["reasoning_content"] = reasoning
            stored.append(
                {
                    "id": item.id or new_id("msg"),
                    "type": "message",
                    "role": item.role,
                    "status": "completed",
                    "content": kept,
                }
            )
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise InvalidRequestError(
                    "A function_call item needs call_id and name.", param=param
                )
            calls.add(item.call_id)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {
                    "name": ToolNames.chat_name(item.name, item.namespace),
                    "arguments": item.arguments or "{}",
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if reasoning:
                previous = messages[-1].get("reasoning_content", "")
                messages[-1]["reasoning_content"] = previous + reasoning
            stored.append(
                {
                    "id": item.id or new_id("fc"),
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    **({"namespace": item.namespace} if item.namespace else {}),
                    "arguments": item.arguments or "{}",
                    "status": "completed",
                }
            )
        elif kind == "function_call_output":
            if not item.call_id:
                raise InvalidRequestError(
                    "A function_call_output item needs call_id.", param=f"{param}.call_id"
                )
            if item.call_id not in calls:
                raise InvalidRequestError(
                    f"call_id '{item.call_id}' matches no function_call before this output "
                    "(in input, or in the response of previous_response_id and its chain).",
                    param=f"{param}.call_id",
                )
            output = _text_of(item.output, f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
            stored.append(
                {
                    "id": item.id or new_id("fco"),
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": output,
                    "status": "completed",
                }
            )
        else:
            raise InvalidRequestError(
                f"Input items of type '{kind}' are not supported (message, function_call, "
                "function_call_output, reasoning).",
                param=f"{param}.type",
            )
        reasoning = None
    return messages, stored


def _reasoning_of(item: InputItem, param: str) -> str:
    """The text of a reasoning item sent back (an earlier response's output)."""
    parts = item.content if isinstance(item.content, list) else []
    for number, part in enumerate(parts):
        if part.type != "reasoning_text" or part.text is None:
            raise InvalidRequestError(
                "A reasoning item's content parts are reasoning_text parts with their text.",
                param=f"{param}.content[{number}]",
            )
    if isinstance(item.content, str):
        return item.content
    if not parts and item.summary:  # an item with only its summary stands for it
        parts = item.summary
    return "".join(part.text or "" for part in parts)


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    form = text.format if text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if not form.name:
        raise InvalidRequestError("A json_schema format needs a name.", param="text.format.name")
    schema = {"name": form.name, "schema": form.schema_, "strict": form.strict}
    return {"type": "json_schema", "json_schema": schema | {"description": form.description}}


#: The Responses parameters the chat request's are built from, for the chat path's errors.
RESPONSES_NAMES = ParamNames(
    max_tokens="max_output_tokens",
    logprobs="include",
    tool="tools[{}]",
    response_format="text.format",
    json_schema="text.format",
    messages="input",
    reasoning_effort="reasoning.effort",
)


def chat_request(
    request: ResponsesRequest,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> ChatCompletionRequest:
    """The chat request ``request`` is served as: ``instructions`` as the system message,
    then ``messages`` (the stored chain and the new input). Its errors are the chat path's
    (see :data:`RESPONSES_NAMES`): the Responses checks leave none for its schema."""
    system = [{"role": "system", "content": request.instructions}]
    tool_choice: Any = request.tool_choice
    if isinstance(tool_choice, ToolChoiceFunction):
        name = ToolNames.chat_name(tool_choice.name, tool_choice.namespace)
        tool_choice = {"type": "function", "function": {"name": name}}
    if not messages and not request.instructions:
        raise InvalidRequestError(
            "The input holds no message to answer (a reasoning item alone is not one).",
            param="input",
        )
    body = {
        "model": request.model,
        "messages": (system if request.instructions else []) + messages,
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls,
        "response_format": _response_format(request.text),
        "logprobs": request.wants_logprobs() or None,
        "top_logprobs": request.top_logprobs,
        "reasoning_effort": request.reasoning.effort if request.reasoning else None,
    }
    return ChatCompletionRequest.model_validate(body)


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": (
                usage.completion_tokens_details.reasoning_tokens
                if usage.completion_tokens_details is not None
                else 0
            )
        },
        "total_tokens": usage.total_tokens,
    }


def output_logprobs(chat: PreparedChat, tokens: list[TokenLogprob]) -> list[dict[str, Any]]:
    """The tokens as an ``output_text`` part lists them (none unless asked for)."""
    if chat.logprobs is None:
        return []
    return [item.model_dump() for item in logprob_items(tokens, chat.logprobs)]


def response_object(
    prepared: PreparedResponse,
    status: str,
    output: list[OutputItem],
    usage: Usage | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    request = prepared.request
    tool_choice: Any = request.tool_choice or "auto"
    if isinstance(tool_choice, ToolChoiceFunction):
        tool_choice = tool_choice.model_dump()
    text_format = request.text.format if request.text and request.text.format else None
    return {
        "id": prepared.id,
        "object": "response",
        "created_at": prepared.created_at,
        "status": status,
        "error": error,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "model": request.model,
        "output": dump_all(output),
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "conversation": (
            {"id": prepared.conversation.id} if prepared.conversation is not None else None
        ),
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {
            "effort": request.reasoning.effort if request.reasoning else None,
            "summary": request.reasoning.summary if request.reasoning else None,
        },
        "safety_identifier": request.safety_identifier,
        "service_tier": "default",
        "store": request.store is not False,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {
            "format": (
                text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format
                else {"type": "text"}
            )
        },
        "tool_choice": tool_choice,
        "tools": stored_tools(request),
        "top_logprobs": request.top_logprobs,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": request.truncation or "disabled",
        "truncated_messages": prepared.truncated,
        "usage": _usage(usage) if usage is not None else None,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def _stored_tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The tools as the stored response keeps them. A continuation never reads them (tools
    are per request, as with OpenAI): they are only shown again by ``GET``. With
    ``tool_choice: "none"`` the model was not shown them (:mod:`gateway.serving.tools`), so
    only their names are kept, not descriptions and schemas that shaped nothing."""
    if request.tool_choice != "none":
        return stored_tools(request)
    return [{"type": t.type, "name": getattr(t, "name", None)} for t in request.tools or []]


def stored_record(
    prepared: PreparedResponse, response: dict[str, Any], output: list[OutputItem]
) -> StoredResponse:
    """What is stored of a response (``output``: its items): the object (its tools as
    :func:`_stored_tools` keeps them), the conversation it answered as items, and the
    conversation with its answer as chat messages (what a continuation reads)."""
    reply: dict[str, Any] = {"role": "assistant", "content": None}
    texts = [p.text for item in output if isinstance(item, MessageItem) for p in item.content]
    calls = [
        {
            "id": item.call_id,
            "type": "function",
            "function": {
                "name": ToolNames.chat_name(item.name, item.namespace),
                "arguments": item.arguments,
            },
        }
        for item in output
        if isinstance(item, FunctionCallItem)
    ]
    if texts:
        reply["content"] = "".join(texts)
    if calls:
        reply["tool_calls"] = calls
    return StoredResponse(
        owner=prepared.owner,
        response={**response, "tools": _stored_tools(prepared.request)},
        input_items=prepared.input_items,
        messages=[*prepared.messages, reply],
        root=prepared.root or None,
    )
