"""``docs/conformance.md``'s tables as the conformance tests read them: each table's rows
(field, class, code), the pinned openai SDK's fields each table covers and the gateway's
request model that declares them, and sample values of the refused and metadata fields.
``tests/unit/test_conformance.py`` checks the HTTP endpoints with them,
``test_conformance_realtime.py`` the Realtime session."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import openai.types.audio.speech_create_params as speech_params
import openai.types.audio.transcription_create_params as transcription_params
import openai.types.audio.translation_create_params as translation_params
import openai.types.chat.completion_create_params as chat_params
import openai.types.completion_create_params as completion_params
import openai.types.embedding_create_params as embedding_params
import openai.types.responses.response_create_params as response_params
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


def rows_of(heading: str) -> dict[str, list[Row]]:
    return TABLES.get(heading, {})


def all_rows() -> Iterator[tuple[str, Row]]:
    """(table name, row) of every SDK table and every extension table."""
    for name, table in SDK_TABLES.items():
        for rows in rows_of(table.heading).values():
            yield name, rows[0]
    for name, heading in BEYOND.items():
        for rows in rows_of(heading).values():
            yield f"{name}+", rows[0]


# --- sample values ------------------------------------------------------------------------


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


def names(param: str | None, expected: str) -> bool:
    """Whether ``param`` names ``expected`` (itself, or something inside it)."""
    given = (param or "").replace(".[", "[")
    return given == expected or given.startswith((f"{expected}.", f"{expected}["))


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
