"""``docs/conformance.md`` checked against the pinned openai SDK and against the app.

Every request field of openai-python's request types (its ``TypedDict``s, both stream
variants) has one row in the doc's table for its endpoint, with one class: honoured,
refused (with a code) or metadata. Each is declared by the gateway's request model, so it is
never "unrecognized"; through the app (fake backend), a refused field set to a sample value
is a 400 with the doc's code and a ``param`` naming it, a metadata field is served, and a
made-up field is a 400 "Unrecognized request argument". A new SDK release therefore fails
here, naming the field, before a user's request does.
"""

from __future__ import annotations

import io
import json
import re
import typing
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import httpx
import numpy as np
import openai.types.audio.speech_create_params as speech_params
import openai.types.audio.transcription_create_params as transcription_params
import openai.types.audio.translation_create_params as translation_params
import openai.types.chat.completion_create_params as chat_params
import openai.types.completion_create_params as completion_params
import openai.types.embedding_create_params as embedding_params
import openai.types.responses.response_create_params as response_params
import pytest
from openai.types import realtime
from openai.types.responses.function_tool_param import FunctionToolParam
from openai.types.responses.response_includable import ResponseIncludable
from openai.types.responses.tool_param import ToolParam
from openai.types.shared_params.reasoning import Reasoning
from pydantic import BaseModel

from gateway.api.routers.audio import TranscriptionForm, TranslationForm
from gateway.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    SpeechRequest,
)
from gateway.serving.realtime_secrets import ClientSecretRequest
from gateway.serving.responses.protocol import FunctionTool, ReasoningConfig, ResponsesRequest
from tests.unit.conftest import USER_HI, assert_openai_error

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
CLASSES = re.compile(r"^(honoured|metadata|refused: `([a-z_]+)`)$")
MADE_UP = "x_made_up"


# --- the doc's tables ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    field: str
    kind: Literal["honoured", "refused", "metadata"]
    code: str | None
    """The error code of a refused field."""


def _tables(text: str) -> dict[str, dict[str, list[Row]]]:
    """Each heading's table: field -> its rows (one, unless the doc repeats a field)."""
    tables: dict[str, dict[str, list[Row]]] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line[:1] == "|" else []
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        match = CLASSES.match(cells[1])
        assert match, f"{heading}: {cells[0]} has no class: {cells[1]!r}"
        kind = "refused" if match.group(2) else match.group(1)
        row = Row(cells[0].strip("`"), kind, match.group(2))  # type: ignore[arg-type]
        tables.setdefault(heading, {}).setdefault(row.field, []).append(row)
    return tables


TABLES = _tables(DOC.read_text(encoding="utf-8"))


# --- what the SDK defines -----------------------------------------------------------------


def _keys(*types: type) -> set[str]:
    """The keys of ``TypedDict``s, those of their bases included."""
    return {key for t in types for c in t.__mro__ for key in getattr(c, "__annotations__", {})}


def _literals(hint: object) -> list[str]:
    """The string values of a ``Literal`` inside ``hint`` (through Optional, Union)."""
    if typing.get_origin(hint) is Literal:
        return [v for v in typing.get_args(hint) if isinstance(v, str)]
    if typing.get_origin(hint) in (Union, typing.Required, typing.NotRequired):
        return [v for arg in typing.get_args(hint) for v in _literals(arg)]
    return []


def _tool_types() -> set[str]:
    return {
        value
        for member in typing.get_args(ToolParam)
        for value in _literals(typing.get_type_hints(member)["type"])
    }


Model = type[BaseModel]


@dataclass(frozen=True)
class Table:
    heading: str
    """The doc's heading above the table."""
    sdk: Callable[[], set[str]]
    """The fields (or, for a table of values, the values) the SDK defines."""
    sdk_type: type | None = None
    """The ``TypedDict`` whose ``Literal`` values a metadata field is also sent with."""
    model: Model | None = None
    """The request model that declares each field (None: checked through the app)."""


def _fields(*types: type) -> Callable[[], set[str]]:
    return lambda: _keys(*types)


SDK_TABLES = {
    "chat": Table(
        "Chat completions: `POST /v1/chat/completions`",
        _fields(
            chat_params.CompletionCreateParamsNonStreaming,
            chat_params.CompletionCreateParamsStreaming,
        ),
        chat_params.CompletionCreateParamsBase,
        ChatCompletionRequest,
    ),
    "completions": Table(
        "Completions: `POST /v1/completions`",
        _fields(
            completion_params.CompletionCreateParamsNonStreaming,
            completion_params.CompletionCreateParamsStreaming,
        ),
        completion_params.CompletionCreateParamsBase,
        CompletionRequest,
    ),
    "responses": Table(
        "Responses: `POST /v1/responses`",
        _fields(
            response_params.ResponseCreateParamsNonStreaming,
            response_params.ResponseCreateParamsStreaming,
        ),
        response_params.ResponseCreateParamsBase,
        ResponsesRequest,
    ),
    "responses.reasoning": Table(
        "Responses `reasoning`", _fields(Reasoning), Reasoning, ReasoningConfig
    ),
    "responses.tools": Table("Responses `tools`, by `type`", _tool_types),
    "responses.function_tool": Table(
        "Responses function tools", _fields(FunctionToolParam), FunctionToolParam, FunctionTool
    ),
    "responses.include": Table(
        "Responses `include`", lambda: set(typing.get_args(ResponseIncludable))
    ),
    "embeddings": Table(
        "Embeddings: `POST /v1/embeddings`",
        _fields(embedding_params.EmbeddingCreateParams),
        embedding_params.EmbeddingCreateParams,
        EmbeddingRequest,
    ),
    "speech": Table(
        "Speech: `POST /v1/audio/speech`",
        _fields(speech_params.SpeechCreateParams),
        speech_params.SpeechCreateParams,
        SpeechRequest,
    ),
    "transcriptions": Table(
        "Transcriptions: `POST /v1/audio/transcriptions`",
        _fields(
            transcription_params.TranscriptionCreateParamsNonStreaming,
            transcription_params.TranscriptionCreateParamsStreaming,
        ),
        transcription_params.TranscriptionCreateParamsBase,
        TranscriptionForm,
    ),
    "translations": Table(
        "Translations: `POST /v1/audio/translations`",
        _fields(translation_params.TranslationCreateParams),
        translation_params.TranslationCreateParams,
        TranslationForm,
    ),
    "realtime.session": Table(
        "Realtime `session.update`: `session`",
        _fields(realtime.RealtimeSessionCreateRequestParam),
        realtime.RealtimeSessionCreateRequestParam,
    ),
    "realtime.session.audio.input": Table(
        "Realtime `session.audio.input`",
        _fields(realtime.RealtimeAudioConfigInputParam),
        realtime.RealtimeAudioConfigInputParam,
    ),
    "realtime.session.audio.input.transcription": Table(
        "Realtime `session.audio.input.transcription`",
        _fields(realtime.AudioTranscriptionParam),
        realtime.AudioTranscriptionParam,
    ),
    "realtime.session.audio.output": Table(
        "Realtime `session.audio.output`",
        _fields(realtime.RealtimeAudioConfigOutputParam),
        realtime.RealtimeAudioConfigOutputParam,
    ),
    "realtime.response": Table(
        "Realtime `response.create`: `response`",
        _fields(realtime.RealtimeResponseCreateParamsParam),
        realtime.RealtimeResponseCreateParamsParam,
    ),
    "realtime.client_secrets": Table(
        "Realtime client secrets: `POST /v1/realtime/client_secrets`",
        _fields(realtime.ClientSecretCreateParams),
        realtime.ClientSecretCreateParams,
        ClientSecretRequest,
    ),
}

#: The gateway's extensions, by the SDK table of the same endpoint.
BEYOND = {
    "chat": "Chat completions beyond the SDK's types",
    "completions": "Completions beyond the SDK's types",
    "responses": "Responses beyond the SDK's types",
    "embeddings": "Embeddings beyond the SDK's types",
}


def _rows(heading: str) -> dict[str, list[Row]]:
    return TABLES.get(heading, {})


def all_rows() -> Iterator[tuple[str, Row]]:
    """(table name, row) of every SDK table and every extension table."""
    for name, table in SDK_TABLES.items():
        for rows in _rows(table.heading).values():
            yield name, rows[0]
    for name, heading in BEYOND.items():
        for rows in _rows(heading).values():
            yield f"{name}+", rows[0]


def _declared(model: Model, field: str) -> bool:
    """Whether ``model`` takes ``field`` (by name, or by its alias: a form's ``name[]``)."""
    return any(
        field in (name, (info.alias or "").removesuffix("[]"))
        for name, info in model.model_fields.items()
    )


def _sdk_cases() -> list[tuple[str, str]]:
    return sorted((name, field) for name, t in SDK_TABLES.items() for field in t.sdk())


# --- (a) and (b): every SDK field has a class and is declared ----------------------------


@pytest.mark.parametrize(("table", "field"), _sdk_cases())
def test_every_sdk_field_has_one_class_in_the_doc(table: str, field: str) -> None:
    heading = SDK_TABLES[table].heading
    rows = _rows(heading).get(field, [])
    assert rows, f"docs/conformance.md, '{heading}': no row for the SDK's field '{field}'"
    assert len(rows) == 1, f"'{heading}': '{field}' has {len(rows)} rows"


@pytest.mark.parametrize("table", sorted(SDK_TABLES))
def test_the_doc_names_no_field_the_sdk_lacks(table: str) -> None:
    spec = SDK_TABLES[table]
    stale = set(_rows(spec.heading)) - spec.sdk()
    assert not stale, f"'{spec.heading}' has rows the SDK does not define: {sorted(stale)}"


@pytest.mark.parametrize(
    ("table", "field"), [case for case in _sdk_cases() if SDK_TABLES[case[0]].model]
)
def test_every_sdk_field_is_declared_by_the_request_model(table: str, field: str) -> None:
    model = SDK_TABLES[table].model
    assert model is not None
    assert _declared(model, field), f"{model.__name__} does not declare '{field}'"


@pytest.mark.parametrize("table", sorted(BEYOND))
def test_every_extension_is_documented_and_declared(table: str) -> None:
    """The request model's fields beyond the SDK's are exactly the doc's extension table."""
    model = SDK_TABLES[table].model
    assert model is not None
    names = {(info.alias or name).removesuffix("[]") for name, info in model.model_fields.items()}
    extensions = names - SDK_TABLES[table].sdk()
    documented = set(_rows(BEYOND[table]))
    assert extensions == documented, (
        f"{model.__name__}: undocumented {sorted(extensions - documented)}, "
        f"documented but not declared {sorted(documented - extensions)}"
    )


# --- (c): through the app ----------------------------------------------------------------

FUNCTION_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}

#: What a client sends with each hosted tool (besides its ``type``).
TOOL_FIELDS: dict[str, dict[str, Any]] = {
    "web_search": {"external_web_access": False},
    "file_search": {"vector_store_ids": ["vs_1"]},
    "mcp": {"server_label": "docs", "server_url": "https://mcp.example.com"},
    "code_interpreter": {"container": {"type": "auto"}},
    "computer_use_preview": {"display_width": 1024, "display_height": 768, "environment": "linux"},
    "custom": {"name": "apply_patch", "description": "Applies a patch."},
}

#: Sample values of the refused and metadata fields (a metadata field whose SDK type is a
#: ``Literal`` is also sent with each of its values).
SAMPLES: dict[tuple[str, str], list[Any]] = {
    ("chat", "logit_bias"): [{"50256": -100}],
    ("chat", "moderation"): [{"model": "omni-moderation-latest"}],
    ("chat", "prediction"): [{"type": "content", "content": "Hello"}],
    ("chat", "verbosity"): ["low"],
    ("chat", "web_search_options"): [{"search_context_size": "low"}],
    ("chat", "prompt_cache_options"): [{"mode": "explicit", "ttl": "12h"}],
    ("chat", "prompt_cache_retention"): [],
    ("chat", "safety_identifier"): ["user-1234"],
    ("chat", "service_tier"): [],
    ("chat", "user"): ["user-1234"],
    ("completions", "logit_bias"): [{"50256": -100}],
    ("completions", "suffix"): ["!"],
    ("completions", "user"): ["user-1234"],
    ("responses", "access_programs"): [{"cyber": "standard"}],
    ("responses", "context_management"): [[{"type": "compaction", "compact_threshold": 1000}]],
    ("responses", "image"): [{"context_compression": "auto"}],
    ("responses", "moderation"): [{"model": "omni-moderation-latest"}],
    ("responses", "prompt"): [{"id": "pmpt_123"}],
    ("responses", "prompt_cache_options"): [{"mode": "explicit", "ttl": "12h"}],
    ("responses", "prompt_cache_retention"): [],
    ("responses", "safety_identifier"): ["user-1234"],
    ("responses", "service_tier"): [],
    ("responses", "user"): ["user-1234"],
    ("responses+", "client_metadata"): [{"session_id": "s-1", "turn_id": "t-1"}],
    ("responses.reasoning", "context"): ["all_turns"],
    ("responses.reasoning", "mode"): ["pro"],
    ("responses.function_tool", "async"): [True],
    ("responses.function_tool", "defer_loading"): [True],
    ("responses.function_tool", "output_schema"): [{"type": "string"}],
    ("embeddings", "user"): ["user-1234"],
    ("transcriptions", "include"): [["logprobs"]],
    ("transcriptions", "keywords"): [["Triton"]],
    ("transcriptions", "known_speaker_names"): [["Ann"]],
    ("transcriptions", "known_speaker_references"): [["data:audio/wav;base64,UklGRg=="]],
    ("transcriptions", "languages"): [["en", "fr"]],
    ("realtime.session", "include"): [["item.input_audio_transcription.logprobs"]],
    ("realtime.session", "prompt"): [{"id": "pmpt_123"}],
    ("realtime.session", "reasoning"): [{"effort": "low"}],
    ("realtime.session", "tracing"): [{"workflow_name": "voice"}],
    ("realtime.session", "truncation"): ["auto"],
    ("realtime.session.audio.input", "noise_reduction"): [{"type": "near_field"}],
    ("realtime.session.audio.input.transcription", "delay"): ["low"],
    ("realtime.session.audio.input.transcription", "keywords"): [["Triton"]],
    ("realtime.session.audio.input.transcription", "languages"): [["en", "fr"]],
    ("realtime.response", "metadata"): [{"topic": "demo"}],
    ("realtime.response", "prompt"): [{"id": "pmpt_123"}],
    ("realtime.response", "reasoning"): [{"effort": "low"}],
}

NAMESPACE_TOOL = {
    "type": "namespace",
    "name": "crm",
    "description": "CRM.",
    "tools": [FUNCTION_TOOL],
}
#: Values the issue-36 clients send for honoured fields: each is served (a 200).
HONOURED: list[tuple[str, str, dict[str, Any]]] = [
    ("chat", "store", {"store": True, "metadata": {"topic": "demo"}}),
    ("chat", "reasoning_effort", {"model": "fake-reasoner", "reasoning_effort": "max"}),
    ("responses", "background", {"background": True}),
    ("responses", "truncation", {"truncation": "auto"}),
    (
        "responses",
        "stream_options",
        {"stream": True, "stream_options": {"include_obfuscation": False}},
    ),
    (
        "responses",
        "background_options",
        {"background": True, "background_options": {"completion_window": "2h"}},
    ),
    ("responses.reasoning", "effort", {"model": "fake-reasoner", "reasoning": {"effort": "max"}}),
    (
        "responses.reasoning",
        "summary",
        {"model": "fake-reasoner", "reasoning": {"summary": "auto"}},
    ),
    ("responses.reasoning", "generate_summary", {"reasoning": {"generate_summary": "concise"}}),
    ("responses.tools", "function", {"tools": [FUNCTION_TOOL]}),
    ("responses.tools", "namespace", {"tools": [NAMESPACE_TOOL]}),
    (
        "responses.include",
        "reasoning.encrypted_content",
        {"store": False, "include": ["reasoning.encrypted_content"]},
    ),
    (
        "responses.include",
        "message.output_text.logprobs",
        {"include": ["message.output_text.logprobs"]},
    ),
    (
        "responses.include",
        "message.input_image.image_url",
        {"include": ["message.input_image.image_url"]},
    ),
    (
        "responses.function_tool",
        "allowed_callers",
        {"tools": [{**FUNCTION_TOOL, "allowed_callers": ["direct"]}]},
    ),
    ("speech", "instructions", {"instructions": "Speak softly."}),
]

#: Each HTTP table: the URL, a valid body, and how a field's sample is put in it.
BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "fake-chat", "messages": USER_HI}),
    "completions": ("/v1/completions", {"model": "fake-chat", "prompt": "Hi"}),
    "responses": ("/v1/responses", {"model": "fake-chat", "input": "Hi"}),
    "embeddings": ("/v1/embeddings", {"model": "fake-embed", "input": "Hi"}),
    "speech": ("/v1/audio/speech", {"model": "fake-tts", "input": "Hi.", "voice": "alloy"}),
    "transcriptions": ("/v1/audio/transcriptions", {"model": "fake-stt"}),
    "translations": ("/v1/audio/translations", {"model": "fake-stt"}),
}


def _endpoint(table: str) -> str:
    return table.split(".")[0].removesuffix("+")


def _with(table: str, field: str, value: Any) -> tuple[dict[str, Any], str]:
    """The fields a request sets to carry ``value`` as ``field`` of ``table``, and the
    ``param`` an error about it names (or starts with)."""
    if table == "responses.reasoning":
        return {"reasoning": {field: value}}, f"reasoning.{field}"
    if table == "responses.tools":
        return {"tools": [value]}, "tools[0]"
    if table == "responses.function_tool":
        return {"tools": [{**FUNCTION_TOOL, field: value}]}, f"tools[0].{field}"
    if table == "responses.include":
        return {"include": [value]}, "include[0]"
    return {field: value}, field


def names(param: str | None, expected: str) -> bool:
    """Whether ``param`` names ``expected`` (itself, or something inside it)."""
    given = (param or "").replace(".[", "[")
    return given == expected or given.startswith((f"{expected}.", f"{expected}["))


def _wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16_000)
        tone = np.sin(np.arange(16_000) / 10) * 8000
        audio.writeframes(tone.astype("<i2").tobytes())
    return out.getvalue()


async def _post(http: httpx.AsyncClient, table: str, fields: dict[str, Any]) -> httpx.Response:
    url, base = BASES[_endpoint(table)]
    body = {**base, **fields}
    if _endpoint(table) not in ("transcriptions", "translations"):
        return await http.post(url, json=body)
    form: dict[str, Any] = {}
    for name, value in body.items():
        if isinstance(value, list):
            form[f"{name}[]"] = value
        else:
            form[name] = value if isinstance(value, str) else json.dumps(value)
    return await http.post(url, data=form, files={"file": ("a.wav", _wav())})


def sample_values(table: str, row: Row) -> list[Any]:
    """The sample values of a refused or metadata field: its :data:`SAMPLES`, and for a
    metadata field whose SDK type is a ``Literal``, each of the SDK's values."""
    field = row.field
    values = list(SAMPLES.get((table, field), []))
    spec = SDK_TABLES.get(table)
    if row.kind == "metadata" and spec is not None and spec.sdk_type is not None:
        hints = typing.get_type_hints(spec.sdk_type)
        values += [v for v in _literals(hints.get(field)) if v not in values]
    if table == "responses.tools":
        values = values or [{"type": field, **TOOL_FIELDS.get(field, {})}]
    if table == "responses.include":
        values = values or [field]
    return values


def _cases(kind: str, http_only: bool) -> list[Any]:
    cases = []
    for table, row in all_rows():
        if row.kind != kind or table.startswith("realtime") == http_only:
            continue
        values = sample_values(table, row) or [None]
        for index, value in enumerate(values):
            cases.append(pytest.param(table, row, value, id=f"{table}-{row.field}-{index}"))
    return cases


@pytest.mark.parametrize(("table", "row", "value"), _cases("refused", http_only=True))
async def test_a_refused_field_is_a_400_with_its_code_naming_it(
    http: httpx.AsyncClient, table: str, row: Row, value: Any
) -> None:
    assert value is not None, f"SAMPLES has no value for {table} '{row.field}'"
    fields, param = _with(table, row.field, value)
    error = assert_openai_error(await _post(http, table, fields), 400, code=row.code)
    assert names(error["param"], param), f"param {error['param']!r} does not name {param!r}"


@pytest.mark.parametrize(("table", "row", "value"), _cases("metadata", http_only=True))
async def test_a_metadata_field_is_accepted(
    http: httpx.AsyncClient, table: str, row: Row, value: Any
) -> None:
    assert value is not None, f"SAMPLES has no value for {table} '{row.field}'"
    fields, _ = _with(table, row.field, value)
    response = await _post(http, table, fields)
    assert response.status_code == 200, response.text
    if row.field == "service_tier":  # the answer says the tier that served it
        assert response.json()["service_tier"] == "default"


@pytest.mark.parametrize(
    ("table", "field", "fields"),
    [pytest.param(t, f, b, id=f"{t}-{f}") for t, f, b in HONOURED],
)
async def test_what_clients_send_for_an_honoured_field_is_served(
    http: httpx.AsyncClient, table: str, field: str, fields: dict[str, Any]
) -> None:
    row = _rows(SDK_TABLES[table].heading).get(field, [])
    assert row and row[0].kind == "honoured", f"{table} '{field}' is not honoured in the doc"
    response = await _post(http, table, fields)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("table", ["responses.tools", "responses.include"])
def test_every_honoured_value_has_a_sample(table: str) -> None:
    """A table of values has no request model to declare them: each honoured value is
    served by :func:`test_what_clients_send_for_an_honoured_field_is_served`."""
    honoured = {
        f for f, rows in _rows(SDK_TABLES[table].heading).items() if rows[0].kind == "honoured"
    }
    assert honoured <= {f for t, f, _ in HONOURED if t == table}


@pytest.mark.parametrize("table", sorted(BASES))
async def test_a_made_up_field_is_unrecognized(http: httpx.AsyncClient, table: str) -> None:
    response = await _post(http, table, {MADE_UP: "1"})
    error = assert_openai_error(response, 400, param=MADE_UP)
    assert error["message"] == f"Unrecognized request argument supplied: {MADE_UP}"
    assert error["code"] is not None
