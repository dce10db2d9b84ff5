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
(:func:`template_switches`).
"""

from __future__ import annotations

from typing import Any

from gateway.backend import ModelInfo
from gateway.errors import BackendError, InvalidRequestError
from gateway.serving.protocol import ChatCompletionRequest, ParamNames
from gateway.serving.reasoning_parsers import ReasoningParser, get_parser, parser_names
from gateway.serving.templating import template_variables

#: Template variables the gateway sets itself: ``chat_template_kwargs`` cannot set them.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def template_switches(
    request: ChatCompletionRequest, model: ModelInfo, template: str, names: ParamNames
) -> dict[str, Any]:
    """The template variables the request sets: its ``chat_template_kwargs``, and its
    ``reasoning_effort`` as the template takes it (``reasoning_effort`` itself, else
    ``enable_thinking``: false for ``none``, true otherwise). A variable the template does
    not read, or a ``reasoning_effort`` it has no switch for, is a 400 naming it; but
    ``none`` asks nothing of a model that does not reason (no ``reasoning_parser``)."""
    reads = template_variables(template)
    switches: dict[str, Any] = {}
    for key, value in (request.chat_template_kwargs or {}).items():
        param = f"chat_template_kwargs.{key}"
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
        _agree(switches, "reasoning_effort", effort, names)
    elif "enable_thinking" in reads:
        _agree(switches, "enable_thinking", effort != "none", names)
    elif effort != "none" or model.reasoning_parser is not None:
        raise InvalidRequestError(
            f"The model '{model.name}' takes no reasoning effort: its chat template reads "
            "neither reasoning_effort nor an enable_thinking switch.",
            param=names.reasoning_effort,
            code="unsupported_parameter",
        )
    return switches


def _agree(switches: dict[str, Any], key: str, value: Any, names: ParamNames) -> None:
    if key in switches and switches[key] != value:
        raise InvalidRequestError(
            f"{names.reasoning_effort} sets the template's '{key}' to {value!r}, but "
            f"chat_template_kwargs sets it to {switches[key]!r}.",
            param=names.reasoning_effort,
        )
    switches[key] = value


def reasoning_parser(model: ModelInfo) -> type[ReasoningParser] | None:
    """The parser of a reasoning model (None for another model)."""
    if model.reasoning_parser is None:
        return None
    parser = get_parser(model.reasoning_parser)
    if parser is None:
        raise BackendError(
            f"The model '{model.name}' names an unknown reasoning_parser "
            f"'{model.reasoning_parser}' (known: {', '.join(parser_names())}).",
            code="model_config_error",
        )
    return parser
