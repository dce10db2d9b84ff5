"""Structured outputs: ``response_format`` and forced tool calls as constraints the model
enforces while it decodes.

A constraint is sent in vLLM's terms (``{"json": schema}`` or ``{"json_object": true}``,
see :class:`gateway.backend.SamplingOptions`), so a production vLLM Triton enforces it with
no change and the models here build a grammar from it. A model whose config does not list
the kind of constraint a request needs gets a 400 naming the parameter: a constraint is
enforced or refused, never ignored.

A client's schema is bounded before anything walks it recursively or expands it (see
:func:`check_schema`): its size (``settings.max_schema_kb``), its nesting
(:data:`MAX_SCHEMA_DEPTH`), the counts it asks for (:data:`MAX_SCHEMA_COUNT`; a tool's
only when its call may be compiled, forced or strict), and its
patterns (:data:`MAX_SCHEMA_PATTERNS`), which must compile with RE2. A strict tool's
arguments are checked in :func:`arguments_problem` with RE2 (linear time: no pattern
backtracks for hours on the event loop) and within :data:`STRICT_CHECK_S`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import re2  # type: ignore[import-untyped]
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

from gateway.backend import ModelInfo
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import ChatTool, ParamNames, ResponseFormat


def _refuse(model: ModelInfo, kind: str, param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The model '{model.name}' cannot enforce {what} (its config lists no '{kind}' "
        "structured outputs).",
        param=param,
        code="unsupported_parameter",
    )


#: The default of ``settings.max_schema_kb``, for a caller that passes no limit.
DEFAULT_MAX_SCHEMA_KB: int = Settings.model_fields["max_schema_kb"].default
#: How deeply a schema's JSON may nest, in objects and arrays (a property's schema is two
#: levels below its object: ``properties``, then the schema). Checking, converting and
#: validating a schema recurse at least once per level; 64 is about 30 levels of nested
#: objects, far more than a tool's parameters use.
MAX_SCHEMA_DEPTH = 64
#: The largest ``minItems``, ``maxItems``, ``minLength``, ``maxLength``, ``minProperties``,
#: ``maxProperties``, ``minContains`` or ``maxContains`` a schema may ask for. Grammar
#: builders expand these one element at a time (llama.cpp's writes a grammar term per item
#: or character, maxItems of them nested), so 60 bytes asking for 200,000,000 items would
#: build gigabytes. 4096 is about what a reply of ``default_max_tokens`` (1024 tokens of a
#: few characters) can hold.
MAX_SCHEMA_COUNT = 4096
_COUNT_KEYWORDS = frozenset(
    {
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    }
)
#: Keywords whose values are JSON data (not walked as schemas), and keywords whose values
#: map names to schemas (their keys are names, not keywords).
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
#: The most distinct patterns (``pattern``, and ``patternProperties`` names) one schema may
#: have: compiling one RE2 program takes up to about 10 ms (see :data:`_RE2_OPTIONS`).
MAX_SCHEMA_PATTERNS = 64
#: How long checking one strict call's arguments may take on the event loop (every keyword
#: looks at the clock; a pattern is one RE2 match, linear in the text).
STRICT_CHECK_S = 0.25
#: How many schema checks are remembered, and how much of a problem's text (it can quote
#: the schema): the cache holds digests and short verdicts, never schemas.
_CHECKS_KEPT = 256
_PROBLEM_CHARS = 500
#: A schema's problem: (where in the schema, what is wrong, the error code).
_Problem = tuple[str, str, str]
_checks: OrderedDict[bytes, _Problem | None] = OrderedDict()


def check_schema(
    schema: Any, param: str, max_kb: int = DEFAULT_MAX_SCHEMA_KB, compiled: bool = True
) -> dict[str, Any]:
    """A JSON Schema, or a 400 naming ``param`` that says what is wrong with it: not an
    object, nested deeper than :data:`MAX_SCHEMA_DEPTH`, larger than ``max_kb`` KB of JSON
    (``settings.max_schema_kb``), a count over :data:`MAX_SCHEMA_COUNT` (only for a schema
    ``compiled`` into a grammar: the count is what a grammar builder expands), more than
    :data:`MAX_SCHEMA_PATTERNS` patterns or one RE2 cannot compile (the param then names
    the keyword's place), or invalid.
    Callers: ``response_format`` (and Responses ``text.format``) through
    :func:`response_constraint`, a tool's ``parameters`` in :mod:`gateway.serving.tools`."""
    if not isinstance(schema, dict):
        raise InvalidRequestError("The schema must be a JSON object.", param=param)
    # Before anything that recurses (json.dumps, the metaschema check).
    if _nests_deeper(schema, MAX_SCHEMA_DEPTH):
        raise InvalidRequestError(
            f"The schema nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays.",
            param=param,
            code="schema_too_large",
        )
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    size = len(canonical.encode())
    if size > max_kb * 1024:
        raise InvalidRequestError(
            f"The schema is {size:,} bytes of JSON; the gateway takes schemas of at most "
            f"{max_kb} KB (max_schema_kb).",
            param=param,
            code="schema_too_large",
        )
    problem = _schema_problem(canonical, compiled)
    if problem is not None:
        where, message, code = problem
        raise InvalidRequestError(message, param=f"{param}.{where}" if where else param, code=code)
    return schema


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` objects and arrays deep (level by
    level, without recursion)."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _schema_problem(canonical: str, compiled: bool = True) -> _Problem | None:
    """What is wrong with a schema (None when nothing is), remembered for the latest
    distinct schemas by a hash of their canonical JSON: the metaschema check costs about
    2 ms, and agents send the same tools on every call."""
    digest = hashlib.sha256(canonical.encode() + (b"c" if compiled else b"")).digest()
    if digest in _checks:
        _checks.move_to_end(digest)
        return _checks[digest]
    schema = json.loads(canonical)
    problem = _bounds_problem(schema, compiled)
    if problem is None:
        try:
            Draft202012Validator.check_schema(schema, format_checker=_SCHEMA_FORMATS)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path)
            message = f"Invalid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
            problem = ("", message, "invalid_json_schema")
        except RecursionError:  # not expected within MAX_SCHEMA_DEPTH; never a 500
            problem = ("", "The schema is nested too deeply to check.", "schema_too_large")
    if problem is not None and len(problem[1]) > _PROBLEM_CHARS:
        problem = (problem[0], problem[1][: _PROBLEM_CHARS - 1] + "…", problem[2])
    _checks[digest] = problem
    if len(_checks) > _CHECKS_KEPT:
        _checks.popitem(last=False)
    return problem


#: The formats the metaschema check asserts, less ``regex``: that one compiles patterns with
#: Python's ``re``, and patterns are RE2's (:func:`_bounds_problem`, ECMA-262 syntax such as
#: ``\p{L}`` or ``(?<name>...)`` included).
_SCHEMA_FORMATS = FormatChecker(
    [name for name in Draft202012Validator.FORMAT_CHECKER.checkers if name != "regex"]
)


def _keywords(schema: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], str, Any]]:
    """``(path, keyword, value)`` for each keyword of ``schema`` and of its subschemas,
    without recursion; ``path`` leads to the keyword (see :func:`_where`)."""
    stack: list[tuple[tuple[str, ...], Any, bool]] = [((), schema, True)]
    while stack:
        path, node, keyed = stack.pop()
        if isinstance(node, list):
            stack.extend(((*path, f"[{i}]"), item, True) for i, item in enumerate(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                here = (*path, str(key))
                if not keyed:  # a name (of a property, a definition): its value is a schema
                    stack.append((here, value, True))
                    continue
                yield here, key, value
                if key not in _DATA_KEYWORDS:
                    stack.append((here, value, key not in _NAMED_SCHEMAS))


def _where(path: tuple[str, ...]) -> str:
    """A path as a param names it (``properties.tags.minItems``), cut short if long."""
    where = ".".join(path)
    return where if len(where) <= _PROBLEM_CHARS else where[: _PROBLEM_CHARS - 1] + "…"


def _bounds_problem(schema: dict[str, Any], counts: bool = True) -> _Problem | None:
    """A count over :data:`MAX_SCHEMA_COUNT` (with ``counts``), more than
    :data:`MAX_SCHEMA_PATTERNS` patterns, or a pattern RE2 cannot compile."""
    seen: set[str] = set()
    for path, key, value in _keywords(schema):
        count = isinstance(value, int | float) and not isinstance(value, bool)
        if counts and key in _COUNT_KEYWORDS and count and value > MAX_SCHEMA_COUNT:
            return (
                _where(path),
                f"{key} is {value:,}; the gateway takes at most {MAX_SCHEMA_COUNT:,} "
                "(items, characters, properties or matches).",
                "schema_too_large",
            )
        patterns = []
        if key == "pattern" and isinstance(value, str):
            patterns = [(path, value)]
        elif key == "patternProperties" and isinstance(value, dict):
            patterns = [((*path, p), p) for p in value]
        for place, pattern in patterns:
            seen.add(pattern)
            if len(seen) > MAX_SCHEMA_PATTERNS:
                return (
                    _where(place),
                    f"The schema has more than {MAX_SCHEMA_PATTERNS} distinct patterns.",
                    "schema_too_large",
                )
            try:
                _compiled(pattern)
            except re2.error as exc:
                reason = exc.args[0].decode() if isinstance(exc.args[0], bytes) else exc
                return (
                    _where(place),
                    f"The pattern {pattern!r} is not one RE2 can match ({reason}): patterns "
                    "are matched in linear time, without lookarounds or backreferences.",
                    "invalid_json_schema",
                )
    return None


#: RE2 bounds the memory of each compiled pattern (1 MiB here, 8 MiB by default), and so
#: the time compiling it takes (about 10 ms at most): a larger program, such as a counted
#: repetition of a large Unicode class (``[\p{L} ]{1,64}``), is refused.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.max_mem = 1 << 20
_RE2_OPTIONS.log_errors = False
#: \uXXXX (ECMA-262, which JSON Schema patterns follow) is \x{XXXX} to RE2; any other
#: escape pair is kept as it is (so \\u0041 stays an escaped backslash).
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|.)", re.DOTALL)
#: How many compiled patterns are kept (re2's own cache, of 128, is emptied after each
#: compile): 64 MiB at most.
_PATTERNS_KEPT = MAX_SCHEMA_PATTERNS
_patterns: OrderedDict[str, Any] = OrderedDict()


def _compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``re2.error`` when it cannot be)."""
    compiled = _patterns.get(pattern)
    if compiled is None:
        translated = _ESCAPE.sub(lambda m: f"\\x{{{m[1]}}}" if m[1] else m[0], pattern)
        compiled = re2.compile(translated, _RE2_OPTIONS)
        re2.purge()
        _patterns[pattern] = compiled
        if len(_patterns) > _PATTERNS_KEPT:
            _patterns.popitem(last=False)
    else:
        _patterns.move_to_end(pattern)
    return compiled


def _matches(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


class UncheckableSchema(Exception):
    """A strict schema the arguments cannot be checked against (the message says why)."""


_deadline: ContextVar[float] = ContextVar("strict_check_deadline")


class _TooSlow(Exception):
    pass


_Keyword = Callable[[Any, Any, Any, Any], Iterator[ValidationError]]


def _timed(keyword: _Keyword) -> _Keyword:
    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if time.monotonic() > _deadline.get():
            raise _TooSlow
        return keyword(validator, value, instance, schema)

    return timed


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _matches(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [
        key
        for key in instance
        if key not in named and not any(_matches(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


#: jsonschema's Draft 2020-12 with patterns matched by RE2 and every keyword timed. Its
#: ``unevaluatedProperties`` still matches ``patternProperties`` with Python's ``re``:
#: strict schemas may not combine the two (:func:`check_strict_schema`).
_ArgumentsValidator = validators.create(
    meta_schema=Draft202012Validator.META_SCHEMA,
    validators={
        name: _timed(keyword)
        for name, keyword in {
            **Draft202012Validator.VALIDATORS,
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        }.items()
    },
    type_checker=Draft202012Validator.TYPE_CHECKER,
)
#: References resolve within the schema only: jsonschema would fetch a remote ``$ref``
#: (any URL a client names) from the gateway, on the event loop.
_NO_REMOTE = Registry()


def _without_dialects(node: Any, keyed: bool = True) -> Any:
    """A copy of schema ``node`` without its ``$schema`` keywords: jsonschema validates a
    (sub)schema that names a dialect with that dialect's own validator, whose patterns are
    Python's ``re`` (``keyed``: ``node``'s keys are keywords, not names). Recursive: the
    schema passed :func:`check_schema` (:data:`MAX_SCHEMA_DEPTH`)."""
    if isinstance(node, list):
        return [_without_dialects(item) for item in node]
    if not isinstance(node, dict):
        return node
    if not keyed:
        return {name: _without_dialects(value) for name, value in node.items()}
    return {
        key: value if key in _DATA_KEYWORDS else _without_dialects(value, key not in _NAMED_SCHEMAS)
        for key, value in node.items()
        if key != "$schema"
    }


def check_strict_schema(schema: dict[str, Any], param: str) -> None:
    """A 400 naming ``param`` unless :func:`arguments_problem` can check arguments against
    ``schema`` (already through :func:`check_schema`): ``unevaluatedProperties`` with
    ``patternProperties`` would match the patterns with Python's backtracking ``re``."""
    used = {key for _, key, _ in _keywords(schema)}
    if {"unevaluatedProperties", "patternProperties"} <= used:
        raise InvalidRequestError(
            "A strict schema cannot combine unevaluatedProperties with patternProperties; "
            "use additionalProperties, or leave strict out.",
            param=param,
            code="unsupported_parameter",
        )


def arguments_problem(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` breaks ``schema`` (None when it matches), for a strict tool's
    arguments (``schema`` through :func:`check_strict_schema`). Raises
    :class:`UncheckableSchema` when the check cannot finish: past :data:`STRICT_CHECK_S`,
    a ``$ref`` outside the schema, references that recurse without end."""
    if _nests_deeper(value, MAX_SCHEMA_DEPTH):
        return f"the arguments nest deeper than {MAX_SCHEMA_DEPTH} levels"
    token = _deadline.set(time.monotonic() + STRICT_CHECK_S)
    try:
        validator = _ArgumentsValidator(_without_dialects(schema), registry=_NO_REMOTE)
        error = best_match(validator.iter_errors(value))
    except _TooSlow:
        raise UncheckableSchema(
            f"checking them took longer than {STRICT_CHECK_S * 1000:.0f} ms"
        ) from None
    except Unresolvable:
        raise UncheckableSchema(
            "a $ref points outside the schema (only references within it are resolved)"
        ) from None
    except RecursionError:
        raise UncheckableSchema("its references recurse without end") from None
    except re2.error:  # not expected: check_schema refuses such patterns
        raise UncheckableSchema("a pattern is not one RE2 can match") from None
    finally:
        _deadline.reset(token)
    return None if error is None else str(error.message)


def response_constraint(
    response_format: ResponseFormat | None,
    model: ModelInfo,
    max_schema_kb: int = DEFAULT_MAX_SCHEMA_KB,
    names: ParamNames | None = None,
) -> dict[str, Any] | None:
    """The constraint a ``response_format`` asks for (None for plain text); errors name it
    as ``names`` do (by default, ``response_format``)."""
    names = names or ParamNames()
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        if "json_object" not in model.structured_outputs:
            raise _refuse(model, "json_object", names.response_format, "JSON output")
        return {"json_object": True}
    spec = response_format.json_schema
    if spec is None:
        raise InvalidRequestError(
            f"{names.response_format} of type 'json_schema' needs a 'json_schema' object.",
            param=names.json_schema,
        )
    schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    check_schema(schema, f"{names.json_schema}.schema", max_schema_kb)
    if "json" not in model.structured_outputs:
        raise _refuse(model, "json", names.response_format, "a JSON schema")
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
