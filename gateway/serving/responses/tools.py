"""A Responses request's ``tools`` as the chat path takes them.

- ``function`` tools become chat function tools.
- ``namespace`` tools (functions grouped under a name, as Codex sends its MCP tools) are
  flattened: each function is offered to the model as ``<namespace>__<name>``, with the
  namespace's description before its own. A call of one comes back as OpenAI reports it, a
  ``function_call`` item with ``name`` and ``namespace`` (:meth:`ToolNames.item_fields`), and
  such an item sent back is the same chat call again (:meth:`ToolNames.chat_name`).
- OpenAI's hosted tools (:data:`~gateway.serving.responses.protocol.HOSTED_TOOLS`) are a
  400 ``unsupported_tool`` naming the tool's type and saying what to turn off: nothing here
  searches the web, runs code or calls an MCP server for the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.serving.protocol import FUNCTION_NAME
from gateway.serving.responses.protocol import (
    FunctionTool,
    HostedTool,
    NamespaceTool,
    ResponsesRequest,
)

#: The most functions one request offers the model, namespaces' counted one each (as chat's
#: ``tools``).
MAX_FUNCTIONS = 128
#: Between a namespace and its function's name in the name the model sees.
SEPARATOR = "__"
#: What a client turns off instead of a hosted tool, where its setting is known.
_TURN_OFF = {
    "web_search": ' (Codex: web_search = "disabled" in its config.toml)',
}


@dataclass
class ToolNames:
    """The request's namespaced functions: the name the model sees for each, and back."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    """``<namespace>__<name>`` -> (namespace, name)."""

    def item_fields(self, chat_name: str) -> dict[str, str]:
        """A call's ``name`` (and ``namespace``) as its ``function_call`` item reports them."""
        if chat_name in self.namespaced:
            namespace, name = self.namespaced[chat_name]
            return {"name": name, "namespace": namespace}
        return {"name": chat_name}

    @staticmethod
    def chat_name(name: str, namespace: str | None) -> str:
        """The name the model knows a call by (a ``function_call`` item sent back)."""
        return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _hosted(tool: HostedTool, param: str) -> InvalidRequestError:
    kind = tool.type
    what = (
        "Custom tools (free-form input by a grammar) are not supported; declare a function tool."
        if kind == "custom"
        else f"'{kind}' is a tool OpenAI runs on its own servers, and this gateway runs no "
        f"hosted tools: remove it from tools{_TURN_OFF.get(kind.split('_20')[0], '')}."
    )
    return InvalidRequestError(what, param=f"{param}.type", code="unsupported_tool")


def _function(tool: FunctionTool, param: str, name: str | None = None) -> dict[str, Any]:
    if tool.type != "function":
        raise InvalidRequestError(
            f"Tools of type '{tool.type}' are not supported here (function, namespace).",
            param=f"{param}.type",
            code="unsupported_tool",
        )
    if not tool.name:
        raise InvalidRequestError("A function tool needs a name.", param=f"{param}.name")
    name = name or tool.name
    if not re.fullmatch(FUNCTION_NAME, name):
        raise InvalidRequestError(
            f"Invalid function name '{name}': letters, digits, '_' and '-' only, at most 64 "
            "characters (a namespace's function: '<namespace>__<name>' together).",
            param=f"{param}.name",
        )
    if tool.async_:
        raise InvalidRequestError(
            "Asynchronous functions are not supported: the model waits for each call's output.",
            param=f"{param}.async",
            code="unsupported_parameter",
        )
    if tool.allowed_callers is not None and "direct" not in tool.allowed_callers:
        raise InvalidRequestError(
            "Only the model calls tools here (allowed_callers must include 'direct').",
            param=f"{param}.allowed_callers",
            code="unsupported_parameter",
        )
    function: dict[str, Any] = {"name": name, "description": tool.description}
    function |= {"parameters": tool.parameters, "strict": tool.strict}
    return {"type": "function", "function": function}


def _namespace(tool: NamespaceTool, param: str, names: ToolNames) -> list[dict[str, Any]]:
    out = []
    for index, inner in enumerate(tool.tools):
        where = f"{param}.tools[{index}]"
        chat_name = ToolNames.chat_name(inner.name or "", tool.name)
        function = _function(inner, where, chat_name)
        if tool.description:
            told = function["function"]["description"]
            function["function"]["description"] = (
                f"{tool.description}\n\n{told}" if told else tool.description
            )
        names.namespaced[chat_name] = (tool.name, inner.name or "")
        out.append(function)
    return out


def chat_tools(request: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, ToolNames]:
    """The request's tools as chat tools, and the names of its namespaced functions."""
    names = ToolNames()
    if request.tools is None:
        return None, names
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(request.tools):
        param = f"tools[{index}]"
        if isinstance(tool, HostedTool):
            raise _hosted(tool, param)
        if isinstance(tool, NamespaceTool):
            out += _namespace(tool, param, names)
        else:
            out.append(_function(tool, param))
        if len(out) > MAX_FUNCTIONS:
            raise InvalidRequestError(
                f"The tools hold more than {MAX_FUNCTIONS} functions (a namespace's count "
                "one each), the most one request may offer the model.",
                param="tools",
            )
    return out, names


def stored_tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The tools as a response echoes them (their own fields, as sent)."""
    return [t.model_dump(by_alias=True, exclude_none=True) for t in request.tools or []]
