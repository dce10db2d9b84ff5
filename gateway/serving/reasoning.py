"""Reasoning models: what a chat request sets in their template, and how their text is read.

A model whose config names a ``reasoning_parser`` (:mod:`gateway.serving.reasoning_parsers`)
reasons before it answers: its reasoning is sent as ``reasoning_content`` (and
``reasoning``), its answer as ``content``, and only the answer is read for tool calls and
held to ``response_format``. An engine behind Triton enforces a constraint from the first
token it generates (vLLM's own server waits for the reasoning to end; Triton's backends
cannot), so a reasoning model's constrained answer is generated in two steps: the
reasoning first, unconstrained, up to the marker that ends it, then the answer under the
constraint (:attr:`gateway.serving.generation.Generation.answer_after`).

``reasoning_effort`` and ``chat_template_kwargs`` reach the model through its chat
template: a variable the template reads is set, one it does not read is refused by name
(:func:`template_switches`). ``max`` is the template's highest effort
(:func:`highest_effort`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, get_args

from gateway.backend import ModelInfo
from gateway.errors import InvalidRequestError, unknown_parser
from gateway.serving.protocol import ChatCompletionRequest, ParamNames, ReasoningEffort
from gateway.serving.reasoning_parsers import ReasoningParser, get_parser, parser_names
from gateway.serving.templating import template_variables

#: Template variables the gateway sets itself: ``chat_template_kwargs`` cannot set them.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
#: The most ``chat_template_kwargs`` may hold: its JSON size, and how deep it nests.
MAX_KWARGS_BYTES = 16 * 1024
MAX_KWARGS_DEPTH = 8
_EFFORTS = get_args(ReasoningEffort)
#: The variables whose values the gateway knows: what they must be, and how that is told.
_SWITCHES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "enable_thinking": (lambda value: isinstance(value, bool), "true or false"),
    "reasoning_effort": (
        lambda value: isinstance(value, str) and value in _EFFORTS,
        "one of " + ", ".join(_EFFORTS),
    ),
}


def template_switches(
    request: ChatCompletionRequest, model: ModelInfo, template: str, names: ParamNames
) -> dict[str, Any]:
    """The template variables the request sets: its ``chat_template_kwargs``, and its
    ``reasoning_effort`` as the template takes it (``reasoning_effort`` itself, else
    ``enable_thinking``: false for ``none``, true otherwise). A variable the template does
    not read, or a ``reasoning_effort`` it has no switch for, is a 400 naming it; but
    ``none`` asks nothing of a model that does not reason (no ``reasoning_parser``), and an
    effort given as a hint (``names.effort_is_hint``: Anthropic's ``output_config.effort``)
    is passed over."""
    reads = template_variables(template)
    switches: dict[str, Any] = {}
    kwargs = request.chat_template_kwargs or {}
    if len(json.dumps(kwargs)) > MAX_KWARGS_BYTES or _depth(kwargs) > MAX_KWARGS_DEPTH:
        raise InvalidRequestError(
            f"chat_template_kwargs holds at most {MAX_KWARGS_BYTES // 1024} KB of JSON, "
            f"nested at most {MAX_KWARGS_DEPTH} deep.",
            param="chat_template_kwargs",
        )
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{key}"
        valid, told = _SWITCHES.get(key, (None, ""))
        if valid is not None and not valid(value):
            raise InvalidRequestError(f"{param} must be {told}.", param=param, code="invalid_value")
        if key in RESERVED:
            raise InvalidRequestError(
                f"'{key}' is set by the gateway from the request; it cannot be a "
                "chat_template_kwargs variable.",
                param=param,
            )
        if key not in reads:
            known = ", ".join(sorted(reads - RESERVED)) or "no other variable"
            raise InvalidRequestError(
                f"The chat template of '{model.name}' does not read '{key}' (it reads: {known}).",
                param=param,
                code="unsupported_parameter",
            )
        switches[key] = value
    effort = request.reasoning_effort
    if effort is None:
        return switches
    if "reasoning_effort" in reads:
        value = highest_effort(template) if effort == "max" else effort
        _agree(switches, "reasoning_effort", value, names)
    elif "enable_thinking" in reads:
        _agree(switches, "enable_thinking", effort != "none", names)
    elif names.effort_is_hint:
        return switches
    elif effort != "none" or model.reasoning_parser is not None:
        raise InvalidRequestError(
            f"The model '{model.name}' takes no reasoning effort: its chat template reads "
            "neither reasoning_effort nor an enable_thinking switch.",
            param=names.reasoning_effort,
            code="unsupported_parameter",
        )
    return switches


def highest_effort(template: str) -> str:
    """What ``reasoning_effort: "max"`` sets in a template that reads ``reasoning_effort``:
    the highest effort its text names as a string (gpt-oss's templates name ``low``,
    ``medium`` and ``high``), else ``high``, the highest every such template takes."""
    for effort in reversed(_EFFORTS[:-1]):
        if re.search(rf"""['"]{effort}['"]""", template):
            return str(effort)
    return "high"


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _agree(switches: dict[str, Any], key: str, value: Any, names: ParamNames) -> None:
    if key in switches and switches[key] != value:
        raise InvalidRequestError(
            f"{names.reasoning_effort} sets the template's '{key}' to {value!r}, but "
            f"chat_template_kwargs sets it to {switches[key]!r}.",
            param=names.reasoning_effort,
        )
    switches[key] = value


def parser_of(model: ModelInfo) -> type[ReasoningParser] | None:
    """The parser of a reasoning model (None for another model)."""
    if model.reasoning_parser is None:
        return None
    parser = get_parser(model.reasoning_parser)
    if parser is None:
        raise unknown_parser(model.name, "reasoning_parser", model.reasoning_parser, parser_names())
    return parser
