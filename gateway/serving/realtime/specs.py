"""The shapes of what a client configures and sends: a session's settings (realtime and
transcription), function tools, conversation items and a response's settings, as pydantic
models. An unknown field is refused by name; so is a field this gateway does not serve,
when it asks for something (``unsupported_parameter``). The events that carry them are in
:mod:`~gateway.serving.realtime.protocol`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from gateway.serving.protocol import FUNCTION_NAME

#: The longest id a client may give an item (and a function call's ``call_id``).
MAX_ITEM_ID_CHARS = 64
#: ``metadata`` as OpenAI bounds it: pairs, and characters of a key and of a value.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512
#: The most a ``tracing`` object holds (it is echoed with the session).
MAX_TRACING_CHARS = 1024
#: The most tools a session or a response may define (OpenAI's Chat Completions bound).
MAX_TOOLS = 128
#: The most entries of the other lists a client sends (a message's parts, ``include``...):
#: a list past it is refused before its entries are read, so that a million bad entries
#: cost no more than one.
MAX_LIST = 64
#: The most items a response's ``input`` lists (``GATEWAY_REALTIME_MAX_ITEMS`` bounds it
#: further).
MAX_INPUT_ITEMS = 4096


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_parameter", message)


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)


def tagged(default: str | None) -> Discriminator:
    """A union keyed on ``type``, ``default`` when a client leaves it out."""

    def tag(value: Any) -> str | None:
        if isinstance(value, dict):
            found = value.get("type", default)
            return found if isinstance(found, str) else None
        return getattr(value, "type", None)

    return Discriminator(tag)


class Strict(BaseModel):
    """A part of an event: an unknown field is refused by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- audio ------------------------------------------------------------------------------

AudioType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]


class AudioFormat(Strict):
    """``audio/pcm`` (24 kHz pcm16) or G.711 (``audio/pcmu``, ``audio/pcma``: 8 kHz)."""

    type: AudioType = "audio/pcm"
    rate: int | None = None

    @field_validator("rate")
    @classmethod
    def _rate(cls, rate: int | None) -> int | None:
        if rate is not None and rate != 24_000:
            raise _invalid("Only 24000 Hz pcm16 is taken (G.711 formats are 8 kHz).")
        return rate


class NoiseReduction(Strict):
    type: Literal["near_field", "far_field"] | None = None
    strength: float | None = Field(None, ge=0.0, le=1.0)


class Transcription(Strict):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    delay: str | None = None
    keywords: list[str] | None = Field(None, max_length=MAX_LIST)
    languages: list[str] | None = Field(None, max_length=MAX_LIST)

    @field_validator("delay", "keywords", "languages")
    @classmethod
    def _refused(cls, value: Any) -> Any:
        if value is not None:
            raise _refuse(
                "It is not supported by this gateway's transcription models; use 'language' "
                "and 'prompt'."
            )
        return value


class ServerVad(Strict):
    type: Literal["server_vad"] = "server_vad"
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0, le=10_000)
    silence_duration_ms: int | None = Field(None, ge=0, le=10_000)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None

    @field_validator("idle_timeout_ms")
    @classmethod
    def _refused(cls, value: Any) -> Any:
        if value is not None:
            raise _refuse("idle_timeout_ms is not supported; send null.")
        return value


class SemanticVad(Strict):
    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool | None = None
    interrupt_response: bool | None = None


TurnDetection = Annotated[
    Annotated[ServerVad, Tag("server_vad")] | Annotated[SemanticVad, Tag("semantic_vad")],
    tagged("server_vad"),
]


class AudioInput(Strict):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    turn_detection: TurnDetection | None = None


class VoiceId(Strict):
    id: str


class AudioOutput(Strict):
    format: AudioFormat | None = None
    voice: str | VoiceId | None = None
    speed: float | None = Field(None, ge=0.25, le=4.0)


class SessionAudio(Strict):
    input: AudioInput | None = None
    output: AudioOutput | None = None


# --- tools ------------------------------------------------------------------------------


class FunctionTool(Strict):
    type: Literal["function"] = "function"
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class HostedTool(BaseModel):
    """A tool OpenAI runs (``mcp``): refused by name, whatever it holds."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str

    @field_validator("type")
    @classmethod
    def _refused(cls, kind: str) -> str:
        raise PydanticCustomError(
            "unsupported_tool",
            f"Tools of type '{kind}' are run by OpenAI and do not exist here; define a "
            "function tool and run it in the client.",
        )


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("mcp")],
    tagged("function"),
]


class FunctionChoice(Strict):
    type: Literal["function"]
    name: str


# --- the session ------------------------------------------------------------------------


class Tracing(Strict):
    workflow_name: str | None = None
    group_id: str | None = None
    metadata: dict[str, Any] | None = None


def _modalities(value: Any) -> Any:
    if value is not None and value not in (["audio"], ["text"]):
        raise _invalid("output_modalities must be ['audio'] or ['text'].")
    return value


MaxTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]


class _Answering(Strict):
    """What a session and a response share."""

    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = Field(None, max_length=2)
    max_output_tokens: MaxTokens | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None

    _modalities = field_validator("output_modalities")(_modalities)

    @field_validator("prompt")
    @classmethod
    def _no_prompt(cls, value: Any) -> Any:
        if value is not None:
            raise _refuse("Prompt templates are not supported by this gateway.")
        return value

    @field_validator("reasoning")
    @classmethod
    def _no_reasoning(cls, value: Any) -> Any:
        if value is not None:
            raise _refuse("Reasoning settings are not supported by this gateway.")
        return value


def _no_include(value: Any) -> Any:
    """``include`` (of a realtime or a transcription session): refused when it asks for
    anything."""
    if value:
        raise _refuse("Log probabilities of input transcriptions are not reported by this gateway.")
    return value


class RealtimeSessionSpec(_Answering):
    """A ``session.update``'s session (``type: "realtime"``)."""

    type: Literal["realtime"] = "realtime"
    model: str | None = None
    audio: SessionAudio | None = None
    include: list[str] | None = Field(None, max_length=MAX_LIST)
    tracing: Literal["auto"] | Tracing | None = None
    truncation: Any = None

    _no_include = field_validator("include")(_no_include)

    @field_validator("truncation")
    @classmethod
    def _disabled(cls, value: Any) -> Any:
        if value not in (None, "disabled"):
            raise _refuse(
                "Only truncation 'disabled' is supported: a conversation that outgrows the "
                "model's context is not cut, the response fails with context_length_exceeded "
                "(delete items to make room)."
            )
        return value

    @field_validator("tracing")
    @classmethod
    def _tracing(cls, value: Any) -> Any:
        if isinstance(value, Tracing) and len(repr(value.model_dump())) > MAX_TRACING_CHARS:
            raise _invalid(f"tracing holds at most {MAX_TRACING_CHARS} characters.")
        return value


class TranscriptionAudioInput(Strict):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    turn_detection: TurnDetection | None = None


class TranscriptionAudio(Strict):
    input: TranscriptionAudioInput | None = None


class TranscriptionSessionSpec(Strict):
    """A ``session.update``'s session of a transcription session: audio in, transcripts out,
    never a response."""

    type: Literal["transcription"]
    audio: TranscriptionAudio | None = None
    include: list[str] | None = Field(None, max_length=MAX_LIST)

    _no_include = field_validator("include")(_no_include)


SessionSpec = Annotated[
    Annotated[RealtimeSessionSpec, Tag("realtime")]
    | Annotated[TranscriptionSessionSpec, Tag("transcription")],
    tagged("realtime"),
]


# --- conversation items -----------------------------------------------------------------


class TextPart(Strict):
    type: Literal["input_text", "output_text"]
    text: str | None = None


class AudioPart(Strict):
    type: Literal["input_audio", "output_audio"]
    audio: str | None = None
    transcript: str | None = None


Part = Annotated[
    Annotated[TextPart, Tag("input_text")]
    | Annotated[TextPart, Tag("output_text")]
    | Annotated[AudioPart, Tag("input_audio")]
    | Annotated[AudioPart, Tag("output_audio")],
    tagged(None),
]

ItemId = Annotated[str, Field(min_length=1, max_length=MAX_ITEM_ID_CHARS)]


class _ItemBase(Strict):
    id: ItemId | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class MessageItem(_ItemBase):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[Part] = Field(min_length=1, max_length=MAX_LIST)


class FunctionCallItem(_ItemBase):
    type: Literal["function_call"]
    call_id: ItemId
    name: str = Field(min_length=1, max_length=64)
    arguments: str


class FunctionCallOutputItem(_ItemBase):
    type: Literal["function_call_output"]
    call_id: ItemId
    output: str


class ItemReference(Strict):
    type: Literal["item_reference"]
    id: ItemId


ClientItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    tagged("message"),
]
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ItemReference, Tag("item_reference")],
    tagged("message"),
]


# --- responses --------------------------------------------------------------------------


class ResponseAudioOutput(Strict):
    format: AudioFormat | None = None
    voice: str | VoiceId | None = None


class ResponseAudio(Strict):
    output: ResponseAudioOutput | None = None


def _metadata(value: Any) -> Any:
    if value is None:
        return None
    if len(value) > METADATA_PAIRS:
        raise _invalid(f"metadata has {len(value)} pairs; at most {METADATA_PAIRS} are allowed.")
    return value


MetadataValue = Annotated[str, Field(max_length=METADATA_VALUE_CHARS)]


class ResponseSpec(_Answering):
    """A ``response.create``'s response."""

    conversation: Literal["auto", "none"] | None = None
    input: list[InputItem] | None = Field(None, max_length=MAX_INPUT_ITEMS)
    audio: ResponseAudio | None = None
    metadata: dict[Annotated[str, Field(max_length=METADATA_KEY_CHARS)], MetadataValue] | None = (
        None
    )

    _metadata = field_validator("metadata", mode="before")(_metadata)
