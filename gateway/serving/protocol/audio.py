"""``/v1/audio/speech``, ``/transcriptions`` and ``/translations``: the requests."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    Field,
    model_validator,
)

from gateway.serving.json_shape import json_depth
from gateway.serving.protocol.common import Strict, bracketed

#: The voice names of the OpenAI speech API; each maps onto a voice of the speech model.
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
    "nova", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip


class SpeechRequest(Strict):
    model: str = Field(min_length=1)
    input: str = Field(min_length=1, max_length=4096)
    voice: str = Field(min_length=1)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = Field(None, max_length=4096)
    """How to speak (tone, pace, style): passed to a model whose config maps an input for it
    (``openai_input_instructions``); a voice without that control reads the same words in
    its one style, and lists ``instructions`` in ``/v1/models`` ``ignored_parameters``
    (OpenAI's Agents SDK sends them with every request)."""


class ChunkingStrategy(Strict):
    """How a transcription's audio is cut before the model hears it: ``auto`` (sent as that
    string), or ``server_vad`` with voice-activity settings (unset: OpenAI's defaults)."""

    type: Literal["auto", "server_vad"]
    prefix_padding_ms: int | None = Field(None, ge=0, le=10_000)
    silence_duration_ms: int | None = Field(None, ge=0, le=10_000)
    threshold: float | None = Field(None, ge=0.0, le=1.0)


#: Official transcription parameters the gateway does not implement, and why (by their
#: form field names).
TRANSCRIPTION_REFUSED = {
    "include[]": "no transcription model here reports token log probabilities",
    "keywords[]": "no transcription model here takes keywords",
    "languages[]": "name the one language in 'language'",
    "known_speaker_names[]": "no transcription model here tells speakers apart",
    "known_speaker_references[]": "no transcription model here tells speakers apart",
}


class TranscriptionRequest(Strict):
    """The form fields of ``/v1/audio/transcriptions`` but the file. Multipart forms carry
    a list as repeated ``name[]`` fields and an object as ``name[key]`` fields (the openai
    SDKs) or as JSON text (curl's ``-F``)."""

    model: str = Field(min_length=1)
    language: str | None = None
    prompt: str | None = None
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    timestamp_granularities: list[Literal["word", "segment"]] | None = Field(
        None, alias="timestamp_granularities[]"
    )
    stream: bool = False
    chunking_strategy: ChunkingStrategy | None = None
    # Declared so that setting one gets its reason (see TRANSCRIPTION_REFUSED).
    include: list[str] | None = Field(None, alias="include[]")
    keywords: list[str] | None = Field(None, alias="keywords[]")
    languages: list[str] | None = Field(None, alias="languages[]")
    known_speaker_names: list[str] | None = Field(None, alias="known_speaker_names[]")
    known_speaker_references: list[str] | None = Field(None, alias="known_speaker_references[]")

    @model_validator(mode="before")
    @classmethod
    def _chunking_object(cls, data: Any) -> Any:
        """``chunking_strategy`` as an object, from ``chunking_strategy[key]`` fields, JSON
        text, or the bare type (``auto``)."""
        if not isinstance(data, dict):
            return data
        fields, nested = bracketed(data, "chunking_strategy")
        raw = fields.get("chunking_strategy")
        if nested:
            fields["chunking_strategy"] = nested
        elif isinstance(raw, str):
            text = raw.strip()
            if text.startswith("{") and json_depth(text) > 1:
                # A flat object: anything deeper is no chunking strategy (and JSON nested
                # thousands deep would make the parser recurse until it fails).
                raise ValueError("chunking_strategy is an object of a type and numbers")
            fields["chunking_strategy"] = (
                json.loads(text) if text.startswith("{") else {"type": text}
            )
        return fields

    def unsupported(self) -> tuple[str, str] | None:
        for param, why in TRANSCRIPTION_REFUSED.items():
            if getattr(self, param.removesuffix("[]")):
                return param, f"{param} is not supported by this gateway: {why}."
        return None


class TranslationRequest(Strict):
    """The form fields of ``/v1/audio/translations`` but the file: OpenAI's, and no other
    (a field it does not declare, ``language`` or ``stream`` included, is refused by name)."""

    model: str = Field(min_length=1)
    prompt: str | None = Field(None, description="Text in English to guide the model's style")
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
