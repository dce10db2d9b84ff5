"""Structured outputs: ``response_format`` and forced tool calls as constraints the model
enforces while it decodes.

A constraint is sent in vLLM's terms (``{"json": schema}`` or ``{"json_object": true}``,
see :class:`gateway.backend.SamplingOptions`), so a production vLLM Triton enforces it with
no change and the models here build a grammar from it. A model whose config does not list
the kind of constraint a request needs gets a 400 naming the parameter: a constraint is
enforced or refused, never ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from gateway.backend import ModelInfo
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import ChatTool, ResponseFormat


def _refuse(model: ModelInfo, kind: str, param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The model '{model.name}' cannot enforce {what} (its config lists no '{kind}' "
        "structured outputs).",
        param=param,
        code="unsupported_parameter",
    )


#: The default of ``settings.max_schema_kb``, for a caller that passes no limit.
DEFAULT_MAX_SCHEMA_KB: int = Settings.model_fields["max_schema_kb"].default
#: How many schema checks are remembered, and how much of a problem's text (it can quote
#: the schema): the cache holds digests and short verdicts, never schemas.
_CHECKS_KEPT = 256
_PROBLEM_CHARS = 500
_checks: OrderedDict[bytes, str | None] = OrderedDict()


def check_schema(schema: Any, param: str, max_kb: int = DEFAULT_MAX_SCHEMA_KB) -> dict[str, Any]:
    """A JSON Schema, or a 400 naming ``param`` that says what is wrong with it: not an
    object, larger than ``max_kb`` KB of JSON (``settings.max_schema_kb``), or invalid.
    Callers: ``response_format`` (and Responses ``text.format``) through
    :func:`response_constraint`, a tool's ``parameters`` in :mod:`gateway.serving.tools`."""
    if not isinstance(schema, dict):
        raise InvalidRequestError("The schema must be a JSON object.", param=param)
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    size = len(canonical.encode())
    if size > max_kb * 1024:
        raise InvalidRequestError(
            f"The schema is {size:,} bytes of JSON; the gateway takes schemas of at most "
            f"{max_kb} KB (max_schema_kb).",
            param=param,
            code="schema_too_large",
        )
    problem = _schema_problem(canonical)
    if problem is not None:
        raise InvalidRequestError(problem, param=param, code="invalid_json_schema")
    return schema


def _schema_problem(canonical: str) -> str | None:
    """What is wrong with a schema (None when nothing is), remembered for the latest
    distinct schemas by a hash of their canonical JSON: the metaschema check costs about
    2 ms, and agents send the same tools on every call."""
    digest = hashlib.sha256(canonical.encode()).digest()
    if digest in _checks:
        _checks.move_to_end(digest)
        return _checks[digest]
    problem = None
    try:
        Draft202012Validator.check_schema(json.loads(canonical))
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        problem = f"Invalid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
        if len(problem) > _PROBLEM_CHARS:
            problem = problem[: _PROBLEM_CHARS - 1] + "…"
    _checks[digest] = problem
    if len(_checks) > _CHECKS_KEPT:
        _checks.popitem(last=False)
    return problem


def response_constraint(
    response_format: ResponseFormat | None,
    model: ModelInfo,
    max_schema_kb: int = DEFAULT_MAX_SCHEMA_KB,
) -> dict[str, Any] | None:
    """The constraint a ``response_format`` asks for (None for plain text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        if "json_object" not in model.structured_outputs:
            raise _refuse(model, "json_object", "response_format", "JSON output")
        return {"json_object": True}
    spec = response_format.json_schema
    if spec is None:
        raise InvalidRequestError(
            "response_format of type 'json_schema' needs a 'json_schema' object.",
            param="response_format.json_schema",
        )
    schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    check_schema(schema, "response_format.json_schema.schema", max_schema_kb)
    if "json" not in model.structured_outputs:
        raise _refuse(model, "json", "response_format", "a JSON schema")
    return {"json": schema}


def arguments_schema(tool: ChatTool) -> dict[str, Any]:
    parameters = tool.function.parameters
    return parameters if parameters else {"type": "object", "properties": {}}


def named_call_constraint(tool: ChatTool, model: ModelInfo) -> dict[str, Any]:
    """``tool_choice`` naming a function: the text is that function's arguments object."""
    if "json" not in model.structured_outputs:
        raise _refuse(model, "json", "tool_choice", "a forced tool call")
    return {"json": arguments_schema(tool)}


def required_calls_constraint(
    tools: list[ChatTool], parallel: bool, model: ModelInfo
) -> dict[str, Any]:
    """``tool_choice: required``: the text is a JSON array of calls to the given tools, at
    least one (exactly one without ``parallel_tool_calls``)."""
    if "json" not in model.structured_outputs:
        raise _refuse(model, "json", "tool_choice", "a required tool call")
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [tool.function.name]},
                "arguments": arguments_schema(tool),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
        "minItems": 1,
    }
    if not parallel:
        schema["maxItems"] = 1
    return {"json": schema}
