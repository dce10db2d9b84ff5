"""The shapes of Realtime events and what a client may put in them: conversation items,
the bounds on what a client can make a session hold, the field checks that honour or
refuse every field of a client event by name, and :class:`ClientEventError`, the error a
bad client event gets back as an ``error`` event."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.audio import PCM_RATE
from gateway.serving.json_shape import JsonLimits, JsonShape, json_shape

PCM_FORMAT = {"type": "audio/pcm", "rate": PCM_RATE}

#: The longest id a client may give an item.
MAX_ITEM_ID_CHARS = 64
#: ``metadata`` as OpenAI bounds it: pairs, and characters of a key and of a value.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512

#: A client event larger than this is parsed in a worker thread (an append of minutes of
#: audio takes tens of milliseconds to parse); smaller ones are not worth the hop.
_PARSE_IN_THREAD_BYTES = 64 * 1024


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientEventError(InvalidRequestError):
    """A client event the session cannot act on: sent back as an ``error`` event."""


@dataclass(frozen=True)
class Bounds:
    """What a client can make one session hold (README "Limits"). An event past a bound is
    refused with an ``error`` event naming it, and the session stays as it was; past
    ``items`` and ``text_bytes`` the oldest items are dropped instead."""

    buffer_bytes: int
    """The input audio buffer, as the pcm16 the client sent (``realtime_max_buffer_mb``)."""
    audio_seconds: float
    """The audio of one turn: the buffer, or an ``input_audio`` part (``max_audio_seconds``)."""
    items: int
    """Conversation items kept; past it the oldest are dropped (``realtime_max_items``)."""
    text_bytes: int
    """Text kept (``max_stored_kb``): instructions, a transcription prompt, one item; and
    all items together (past it the oldest are dropped)."""
    message_bytes: int
    """One client event (``realtime_max_message_mb``; uvicorn refuses larger ones first)."""
    json_limits: JsonLimits = field(default_factory=JsonLimits.defaults)
    """What a client event's JSON may hold (``max_json_depth``, ``max_json_containers``,
    ``max_json_values``, as a request body), measured before it is parsed."""

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        mb = 1024 * 1024
        return cls(
            buffer_bytes=int(settings.realtime_max_buffer_mb * mb),
            audio_seconds=settings.max_audio_seconds,
            items=settings.realtime_max_items,
            text_bytes=settings.max_stored_kb * 1024,
            message_bytes=int(settings.realtime_max_message_mb * mb),
            json_limits=JsonLimits.from_settings(settings),
        )


@dataclass
class Item:
    """A conversation item: a message with its parts (the audio itself is not kept)."""

    id: str
    role: str
    content: list[dict[str, Any]]
    status: str = "completed"
    spoken: list[tuple[int, str]] = field(default_factory=list)
    """Assistant audio: where each spoken sentence starts (ms) and its text (truncation)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "object": "realtime.item",
            "role": self.role,
            "status": self.status,
            "content": self.content,
        }

    def text(self) -> str:
        """What the chat model sees of it."""
        parts = []
        for part in self.content:
            text = part.get("text") if part["type"] in ("input_text", "output_text") else None
            if text is None:
                text = part.get("transcript")
            if text:
                parts.append(text)
        return " ".join(parts)

    @property
    def size(self) -> int:
        """Bytes of text it holds (what :attr:`Bounds.text_bytes` counts)."""
        return len(self.text().encode("utf-8"))

    def audio_part(self) -> int:
        """The index of its ``input_audio`` part (the one a transcript goes into)."""
        return next(i for i, part in enumerate(self.content) if part["type"] == "input_audio")


_ANSWERS = "answers in this session"
_TRANSCRIBES = "transcribes this session's audio"
_SPEAKS = "speaks this session's answers"
#: (model, the parameter that chose it, what it does)
_Use = tuple[str, str, str]

#: The fields of the parts of a message item a client sends, by part type.
_PART_FIELDS = {
    "input_text": {"type", "text"},
    "input_audio": {"type", "audio", "transcript"},
    "output_text": {"type", "text"},
    "output_audio": {"type", "audio", "transcript"},
}
_ROLE_PARTS = {
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}

_INPUT = "session.audio.input"
_OUTPUT = "session.audio.output"
#: The fields of a ``session.update``'s session and of a ``response.create``'s response.
_SESSION_FIELDS = frozenset(
    {
        "type",
        "model",
        "instructions",
        "output_modalities",
        "max_output_tokens",
        "audio",
        "include",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "prompt",
        "reasoning",
        "tracing",
        "truncation",
    }
)
_RESPONSE_FIELDS = frozenset(
    {
        "conversation",
        "input",
        "instructions",
        "output_modalities",
        "max_output_tokens",
        "audio",
        "metadata",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "prompt",
        "reasoning",
    }
)


def _too_much(shape: JsonShape, limits: JsonLimits) -> ClientEventError | None:
    refused = limits.refusal(shape, "The event's JSON")
    return None if refused is None else ClientEventError(refused[0], code=refused[1])


def _decoded(raw: str | bytes, limits: JsonLimits) -> object:
    shape = json_shape(raw, limits)
    refused = _too_much(shape, limits)
    if refused is not None:
        raise refused
    try:
        return json.loads(raw)
    except RecursionError:  # a bound set past what the parser can nest
        raise ClientEventError(
            "The event's JSON nests too deep to be read (GATEWAY_MAX_JSON_DEPTH).",
            code="json_too_deep",
        ) from None
    except json.JSONDecodeError as exc:
        raise ClientEventError(
            f"The event is not valid JSON (line {exc.lineno}, column {exc.colno}).",
            code="invalid_json",
        ) from exc
    except ValueError as exc:  # bytes that are no Unicode text
        raise ClientEventError("The event is not valid JSON text.", code="invalid_json") from exc


async def _parse(raw: str | bytes, limits: JsonLimits) -> object:
    """A client event's JSON, measured first (a large one in a worker thread)."""
    if len(raw) > _PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_decoded, raw, limits)
    return _decoded(raw, limits)


def _unsupported(param: str, message: str) -> ClientEventError:
    return ClientEventError(message, param=param, code="unsupported_parameter")


def _fields(spec: dict[str, Any], param: str, known: Collection[str]) -> None:
    """Refuses a field the API does not define in the object ``param`` names: an
    unknown field is never ignored (OpenAI refuses them the same way)."""
    for name in spec:
        if name not in known:
            where = f"{param}.{name}" if param else name
            raise ClientEventError(
                f"Unknown parameter: '{where}'.", param=where, code="unknown_parameter"
            )


def _refuse_tools(spec: dict[str, Any], param: str) -> None:
    """Refuses tool calling and OpenAI's hosted features (prompt templates, reasoning),
    which the gateway's Realtime answers do not have, unless they ask for nothing:
    ``tools: []``, ``tool_choice`` ``auto`` or ``none`` and ``parallel_tool_calls``
    change nothing when there are no tools."""
    if spec.get("tools"):
        raise _unsupported(
            f"{param}.tools", "Tools are not supported in Realtime sessions by this gateway."
        )
    if spec.get("tool_choice") not in (None, "auto", "none"):
        raise _unsupported(
            f"{param}.tool_choice",
            "tool_choice must be 'auto' or 'none': Realtime sessions have no tools here.",
        )
    if spec.get("parallel_tool_calls") not in (None, True, False):
        raise ClientEventError(
            "parallel_tool_calls must be a boolean.", param=f"{param}.parallel_tool_calls"
        )
    for name, what in (("prompt", "Prompt templates"), ("reasoning", "Reasoning settings")):
        if spec.get(name) is not None:
            raise _unsupported(f"{param}.{name}", f"{what} are not supported by this gateway.")


def _object(value: object, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientEventError(f"{param} must be an object.", param=param)
    return value


def _string(value: object, param: str, empty: bool = False) -> str:
    """A string field; ``empty``: an empty one (or null, read as empty) is taken too."""
    if value is None and empty:
        return ""
    if not isinstance(value, str) or not (value or empty):
        what = "a string" if empty else "a non-empty string"
        raise ClientEventError(f"{param} must be {what}.", param=param)
    return value


def _metadata(value: object, param: str) -> dict[str, str] | None:
    """``metadata`` as OpenAI bounds it (see :data:`METADATA_PAIRS`)."""
    if value is None:
        return None
    pairs = _object(value, param)
    if len(pairs) > METADATA_PAIRS:
        raise ClientEventError(
            f"metadata has {len(pairs)} pairs; at most {METADATA_PAIRS} are allowed.",
            param=param,
        )
    for key, text in pairs.items():
        if len(key) > METADATA_KEY_CHARS:
            raise ClientEventError(
                f"A metadata key has at most {METADATA_KEY_CHARS} characters.", param=param
            )
        if not isinstance(text, str) or len(text) > METADATA_VALUE_CHARS:
            raise ClientEventError(
                f"A metadata value is a string of at most {METADATA_VALUE_CHARS} characters.",
                param=f"{param}.{key}",
            )
    return dict(pairs)


def _modalities(value: object, param: str) -> list[str]:
    if value not in (["audio"], ["text"]):
        raise ClientEventError("output_modalities must be ['audio'] or ['text'].", param=param)
    assert isinstance(value, list)
    return list(value)


def _max_tokens(value: object, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if not isinstance(value, int) or not 1 <= value <= 4096:
        raise ClientEventError(
            "max_output_tokens must be an integer from 1 to 4096, or 'inf'.", param=param
        )
    return value


def _check_format(value: object, param: str) -> None:
    if value is None:
        return
    spec = _object(value, param)
    _fields(spec, param, {"type", "rate"})
    kind = spec.get("type", "audio/pcm")
    if kind != "audio/pcm":
        raise ClientEventError(
            f"Audio format '{kind}' is not supported; use 'audio/pcm' (24 kHz pcm16).",
            param=f"{param}.type",
            code="unsupported_parameter",
        )
    if spec.get("rate", PCM_RATE) != PCM_RATE:
        raise ClientEventError(
            f"Audio rate {spec.get('rate')} is not supported; pcm16 is 24000 Hz.",
            param=f"{param}.rate",
        )
