"""Tool calling: the request's tools and messages checked, and how the reply is read.

- ``tool_choice`` ``auto`` (the default with tools): the model's chat template gets the tools
  and the model decides; the parser its config names (``tool_call_parser``) reads calls
  out of its text. A model without one cannot serve ``auto`` (400).
- ``required`` and a named function: enforced with constrained decoding (see
  :mod:`gateway.serving.structured`), so the call always parses, even from a small model.
- ``none``: the tools are not shown to the model.
- ``parallel_tool_calls: false`` with ``auto``: the parser stops after the first call, and
  so does the answer (with ``required``, the constraint allows one call).
- ``strict: true`` tools with ``auto``: the model writes its calls freely, so each strict
  call's arguments are checked against the schema once complete; arguments that do not
  match are generated again, under the schema as a constraint, from the point in the text
  where they started (the model keeps its choice of function and what it wrote before).
  Checking first costs nothing when the model was right, and keeps the calls it wrote
  after; a model that cannot enforce a schema is refused strict tools up front. Streamed,
  a strict call's arguments are sent once checked, in one piece. The check runs on the
  event loop, so it is bounded: patterns are matched by RE2, in linear time, and a schema
  that cannot be checked in time is a 400 (see
  :func:`~gateway.serving.structured.arguments_problem`).
- Legacy ``functions`` / ``function_call`` are these tools and choices (``none``, ``auto``
  or a name), with one call at most; the answer takes their shape (``message.function_call``,
  finish reason ``function_call``).

Messages keep OpenAI's shape (assistant ``tool_calls`` with JSON-string arguments, ``tool``
results with ``tool_call_id``; legacy ``function_call`` and ``function`` results are read
as one call and its result); :func:`for_template` turns them into what Hugging Face chat
templates expect (arguments as objects, a tool result's function ``name``). A call's
arguments in the history are parsed for that, so together they may hold what one request
body may (``GATEWAY_MAX_JSON_DEPTH``, ``_CONTAINERS``, ``_VALUES``; measured before parsing
by :func:`gateway.serving.json_shape.json_shape`): past it they are a 400 ``json_too_deep``
or ``json_too_complex``, not a parser that recurses until it fails or builds millions of
objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.backend import ModelInfo
from gateway.errors import InvalidRequestError, unknown_parser
from gateway.serving.json_shape import JsonLimits, JsonShape, json_shape
from gateway.serving.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    NamedFunction,
    NamedToolChoice,
    ParamNames,
)
from gateway.serving.structured import (
    DEFAULT_MAX_SCHEMA_KB,
    UncheckableSchema,
    arguments_problem,
    arguments_schema,
    check_schema,
    check_strict_schema,
    named_call_constraint,
    required_calls_constraint,
)
from gateway.serving.tool_parsers import ToolParser, get_parser, parser_names
from gateway.serving.tool_parsers.forced import CallArrayParser, NamedCallParser

#: ``GATEWAY_MAX_JSON_DEPTH``'s default.


@dataclass(frozen=True)
class ToolPlan:
    """How a request's reply is read for calls."""

    mode: str
    """``auto``, ``required`` or ``named``."""
    names: tuple[str, ...]
    parser: type[ToolParser] | None = None
    function: str | None = None
    max_calls: int | None = None
    """``auto`` without parallel calls: 1."""
    strict: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``auto``: the arguments schema of each strict tool, by name."""
    legacy: bool = False
    """The request used ``functions``: the answer takes the legacy shape."""

    def new_parser(self) -> ToolParser:
        """A parser for one choice (parsers keep state)."""
        if self.mode == "named" and self.function is not None:
            return NamedCallParser(self.function)
        if self.mode == "required":
            return CallArrayParser(self.names)
        assert self.parser is not None
        return self.parser(self.names, self.max_calls)

    def mismatch(self, name: str, arguments: str) -> str | None:
        """Why a call's arguments break its strict schema (None when they match, or the
        tool is not strict); a 400 when they cannot be checked against it (see
        :func:`~gateway.serving.structured.arguments_problem`)."""
        schema = self.strict.get(name)
        if schema is None:
            return None
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's limit
            return "the arguments are not JSON"
        try:
            return arguments_problem(schema, value)
        except UncheckableSchema as exc:
            raise InvalidRequestError(
                f"The arguments of '{name}' cannot be checked against its strict schema: "
                f"{exc}. Simplify the schema, or leave strict out.",
                param="functions" if self.legacy else "tools",
                code="uncheckable_schema",
            ) from None


@dataclass(frozen=True)
class ToolSetup:
    plan: ToolPlan | None
    constraint: dict[str, Any] | None
    """The constraint a forced call needs."""
    template_tools: list[dict[str, Any]] | None
    """The tools as the chat template gets them (None: not shown)."""


_NO_TOOLS = ToolSetup(None, None, None)


def from_functions(request: ChatCompletionRequest) -> ChatCompletionRequest:
    """A request with legacy ``functions`` / ``function_call`` as its tools and
    ``tool_choice``, one call at most (the legacy answer holds one)."""
    if request.tools is not None:
        raise InvalidRequestError(
            "functions (deprecated) and tools cannot be combined; send tools.",
            param="functions",
        )
    if request.parallel_tool_calls:
        raise InvalidRequestError(
            "Legacy function calling answers with one call: parallel_tool_calls must not be "
            "true with functions.",
            param="parallel_tool_calls",
        )
    choice = request.function_call
    named = isinstance(choice, NamedFunction)
    tools = [ChatTool(type="function", function=f) for f in request.functions or []] or None
    return request.model_copy(
        update={
            "tools": tools,
            "tool_choice": NamedToolChoice(type="function", function=choice) if named else choice,
            "parallel_tool_calls": False,
            "functions": None,
            "function_call": None,
        }
    )


def setup(
    request: ChatCompletionRequest,
    model: ModelInfo,
    names: ParamNames,
    legacy: bool = False,
    max_schema_kb: int = DEFAULT_MAX_SCHEMA_KB,
) -> ToolSetup:
    """How the request's tools are shown and its reply read; errors name the tools and the
    choice as ``names`` do (``functions`` and ``function_call`` for legacy ones);
    ``legacy``: they came from ``functions`` (see :func:`from_functions`), and the answer
    takes their shape. Each tool's parameters schema may be ``max_schema_kb`` of JSON at
    most."""
    tools_param, choice_param = names.tools, names.tool_choice
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError(
                f"{choice_param} is only allowed when {tools_param} are specified.",
                param=choice_param,
            )
        return _NO_TOOLS
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    declared: list[str] = []
    for index, tool in enumerate(request.tools):
        where = names.tool.format(index)
        if tool.function.name in declared:
            raise InvalidRequestError(
                f"Two tools are named '{tool.function.name}'.", param=f"{where}.name"
            )
        declared.append(tool.function.name)
        if tool.function.parameters is not None:
            # A tool only shown to the model builds no grammar: its counts (Claude Code's
            # tools ask for maxLength 524,288) are bounded only when it may be compiled.
            compiled = forced or bool(tool.function.strict)
            check_schema(tool.function.parameters, f"{where}.parameters", max_schema_kb, compiled)
    if choice == "none":
        return _NO_TOOLS
    shown = [tool.model_dump(exclude_none=True) for tool in request.tools]
    if isinstance(choice, NamedToolChoice):
        wanted = choice.function.name
        named = next((t for t in request.tools if t.function.name == wanted), None)
        if named is None:
            raise InvalidRequestError(
                f"{choice_param} names '{wanted}', which is not one of the {tools_param}.",
                param=choice_param,
            )
        plan = ToolPlan("named", tuple(declared), function=wanted, legacy=legacy)
        return ToolSetup(plan, named_call_constraint(named, model), shown)
    if choice == "required":
        parallel = request.parallel_tool_calls is not False
        constraint = required_calls_constraint(request.tools, parallel, model)
        return ToolSetup(ToolPlan("required", tuple(declared)), constraint, shown)
    if model.tool_call_parser is None:
        raise InvalidRequestError(
            f"The model '{model.name}' cannot choose to call tools: its config names no "
            "tool_call_parser. Use tool_choice 'required' or a named function.",
            param=choice_param if choice else tools_param,
            code="unsupported_parameter",
        )
    parser = get_parser(model.tool_call_parser)
    if parser is None:
        raise unknown_parser(model.name, "tool_call_parser", model.tool_call_parser, parser_names())
    strict = {}
    for index, tool in enumerate(request.tools):
        if not tool.function.strict:
            continue
        if "json" not in model.structured_outputs:
            raise InvalidRequestError(
                f"The model '{model.name}' cannot enforce a strict schema (its config lists "
                "no 'json' structured outputs); leave strict out.",
                param=f"{names.tool.format(index)}.strict",
                code="unsupported_parameter",
            )
        schema = arguments_schema(tool)
        check_strict_schema(schema, f"{names.tool.format(index)}.parameters")
        strict[tool.function.name] = schema
    plan = ToolPlan(
        "auto",
        tuple(declared),
        parser=parser,
        max_calls=1 if request.parallel_tool_calls is False else None,
        strict=strict,
        legacy=legacy,
    )
    return ToolSetup(plan, None, shown)


def _text(index: int, message: ChatMessage) -> str | None:
    if message.content is None:
        return message.refusal
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)  # what the assistant said, as OpenAI gives it back
            continue
        if part.type == "image_url":
            continue  # read and checked against the model by serving/images/
        if part.type != "text":
            raise InvalidRequestError(
                f"Content parts of type '{part.type}' are not supported; only 'text' (and "
                "'image_url', for a model that sees images) are.",
                param=f"messages.[{index}].content",
            )
        if part.text is None:
            raise InvalidRequestError(
                "A content part of type 'text' needs a 'text' field.",
                param=f"messages.[{index}].content",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _legacy_result(index: int, message: ChatMessage, pending: dict[str, str]) -> str:
    """The id of the call a ``function`` message answers: the latest unanswered
    ``function_call`` of its ``name``."""
    if not message.name:
        raise InvalidRequestError(
            "A function message needs the name of the function it answers.",
            param=f"messages.[{index}].name",
        )
    call_id = pending.pop(message.name, None)
    if call_id is None:
        raise InvalidRequestError(
            f"The function message answers '{message.name}', which no earlier assistant "
            "function_call called.",
            param=f"messages.[{index}].name",
        )
    return call_id


def openai_messages(
    messages: list[ChatMessage],
    limits: JsonLimits | None = None,
    names: ParamNames | None = None,
) -> list[dict[str, Any]]:
    """The request's messages checked and as plain dicts (content as text); a ``tool``
    message must answer a call an earlier assistant message made. A legacy assistant
    ``function_call`` is a tool call, and the ``function`` message answering it its
    ``tool`` result. The calls' arguments are JSON the templates get parsed: together they
    may hold what one body may (``limits``, the ``GATEWAY_MAX_JSON_*`` settings), or it is a
    400 (named as ``names`` name the messages: a converted request's ``input``)."""
    limits = limits or JsonLimits.defaults()
    held = JsonShape(0, 0, 0)  # what the arguments so far hold together
    calls: dict[str, str] = {}  # call id -> function name
    pending: dict[str, str] = {}  # function name -> id of its legacy call not yet answered
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        # "developer" is the newer name of "system"; chat templates know "system".
        role = {"developer": "system", "function": "tool"}.get(message.role, message.role)
        content = _text(index, message)
        item: dict[str, Any] = {"role": role, "content": content}
        made = [call.model_dump() for call in message.tool_calls or ()]
        if message.function_call is not None:
            legacy_id = f"call_legacy_{index}"
            pending[message.function_call.name] = legacy_id
            function = message.function_call.model_dump()
            made.append({"id": legacy_id, "type": "function", "function": function})
        if made and role != "assistant":
            raise InvalidRequestError(
                "Only assistant messages carry tool_calls or function_call.",
                param=f"messages.[{index}].role",
            )
        wheres = [
            f"messages.[{index}].tool_calls.[{n}].function.arguments" for n in range(len(made))
        ]
        if message.function_call is not None:
            wheres[-1] = f"messages.[{index}].function_call.arguments"
        for call, where in zip(made, wheres, strict=True):
            held = _check_arguments(call["function"]["arguments"], held, limits, where, names)
        reasoning = message.reasoning_content or message.reasoning
        if message.reasoning and message.reasoning_content not in (None, message.reasoning):
            raise InvalidRequestError(
                "reasoning_content and reasoning are two names of one text: send one, or the "
                "same text in both.",
                param=f"messages.[{index}].reasoning",
            )
        if reasoning and role != "assistant":
            raise InvalidRequestError(
                "Only assistant messages carry reasoning_content or reasoning.",
                param=f"messages.[{index}].role",
            )
        if reasoning:
            item["reasoning_content"] = reasoning
        if made:
            item["tool_calls"] = made
            calls.update({call["id"]: call["function"]["name"] for call in made})
        elif content is None:
            raise InvalidRequestError(
                f"Messages with role '{message.role}' need content.",
                param=f"messages.[{index}].content",
            )
        if message.role == "function":
            item["tool_call_id"] = _legacy_result(index, message, pending)
            item["name"] = message.name
        elif role == "tool":
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


def _check_arguments(
    arguments: str, held: JsonShape, limits: JsonLimits, param: str, names: ParamNames | None
) -> JsonShape:
    """What ``held`` and ``arguments`` hold together, measured before anything parses
    them; a 400 when it passes ``limits`` (a string value is one value of the body, but
    its JSON becomes objects once parsed: a 30 MB ``[{},{},...]`` would be millions)."""
    left = JsonLimits(
        limits.depth, limits.containers - held.containers, limits.values - held.values
    )
    shape = json_shape(arguments, left)
    together = JsonShape(
        max(held.depth, shape.depth), held.containers + shape.containers, held.values + shape.values
    )
    refused = limits.refusal(together, "The tool calls' arguments in the messages (together)")
    if refused is None:
        return together
    if names is not None and names.messages != "messages":
        param = names.messages  # a converted request's name for its history (``input``)
    raise InvalidRequestError(refused[0], param=param, code=refused[1])


def _arguments(raw: str, limits: JsonLimits) -> Any:
    if limits.exceeded(json_shape(raw, limits)) is not None:
        return raw  # a stored turn's, from a model: kept as the text it was
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a bound set past the parser's
        return raw


def for_template(
    messages: list[dict[str, Any]], limits: JsonLimits | None = None
) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates take them: a call's arguments as an object
    (when they are valid JSON within ``limits``, each call's own: the request's own
    were checked by :func:`openai_messages`, a session's stored ones are kept as text
    past it), content never None."""
    limits = limits or JsonLimits.defaults()
    rendered = []
    for message in messages:
        item = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            item["tool_calls"] = [
                {
                    **call,
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _arguments(call["function"]["arguments"], limits),
                    },
                }
                for call in message["tool_calls"]
            ]
        rendered.append(item)
    return rendered
