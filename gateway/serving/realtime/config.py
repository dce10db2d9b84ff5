"""A session's settings: :class:`SessionConfig` (and the session object a client is
shown), the models they make a session use, checked against the key, and
:class:`Configurator`, which builds the settings a ``session.update`` asks for, every
field checked against the API, the bounds and the models."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequestError
from gateway.serving.catalog import model_takes
from gateway.serving.realtime.events import (
    _ANSWERS,
    _INPUT,
    _OUTPUT,
    _SESSION_FIELDS,
    _SPEAKS,
    _TRANSCRIBES,
    PCM_FORMAT,
    ClientEventError,
    _check_format,
    _fields,
    _max_tokens,
    _modalities,
    _object,
    _refuse_tools,
    _string,
    _unsupported,
    _Use,
)
from gateway.serving.speech import resolve_voice
from gateway.serving.vad import VadSettings
from gateway.state.keys import ApiKey

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeServices


@dataclass
class SessionConfig:
    """The session's settings, as ``session.update`` changes them."""

    model: str
    voice: str
    transcription_model: str
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    vad: VadSettings | None = field(default_factory=VadSettings)
    create_response: bool = True
    interrupt_response: bool = True
    transcribe_events: bool = True
    """Send ``conversation.item.input_audio_transcription.*`` (``transcription`` set)."""
    language: str | None = None
    prompt: str | None = None
    speed: float = 1.0
    max_output_tokens: int | None = None
    temperature: float | None = None
    tool_choice: str = "auto"
    eagerness: str | None = None
    """Set for ``semantic_vad``: its eagerness (the turn detection is server VAD with the
    silence it maps to, :data:`SEMANTIC_SILENCE_MS`)."""
    tracing: str | dict[str, Any] | None = None
    """OpenAI's trace settings (``auto``, or a workflow name, group id and metadata): accepted
    metadata, echoed; the gateway's own traces cover the session (docs/tracing.md)."""

    def to_json(self, session_id: str) -> dict[str, Any]:
        detection: dict[str, Any] | None = None
        if self.vad is not None and self.eagerness is not None:
            detection = {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        elif self.vad is not None:
            detection = {
                "type": "server_vad",
                "threshold": self.vad.threshold,
                "prefix_padding_ms": self.vad.prefix_padding_ms,
                "silence_duration_ms": self.vad.silence_duration_ms,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
                "idle_timeout_ms": None,
            }
        transcription = None
        if self.transcribe_events:
            transcription = {
                "model": self.transcription_model,
                "language": self.language,
                "prompt": self.prompt,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions,
            "tools": [],
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens or "inf",
            # A conversation that outgrows the model's context is not cut to fit: the
            # response fails with context_length_exceeded (OpenAI's "disabled").
            "truncation": "disabled",
            "tracing": self.tracing,
            "audio": {
                "input": {
                    "format": PCM_FORMAT,
                    "transcription": transcription,
                    "noise_reduction": None,
                    "turn_detection": detection,
                },
                "output": {"format": PCM_FORMAT, "voice": self.voice, "speed": self.speed},
            },
        }


def _uses(config: SessionConfig, speech_model: str) -> list[_Use]:
    """The models ``config`` makes a session use: its chat model, the transcription model
    (any audio a client sends is transcribed for the chat model) and, for spoken answers,
    the speech model."""
    uses = [
        (config.model, "session.model", _ANSWERS),
        (config.transcription_model, "session.audio.input.transcription.model", _TRANSCRIBES),
    ]
    if config.output_modalities == ["audio"]:
        uses.append((speech_model, "session.output_modalities", _SPEAKS))
    return uses


def _require(key: ApiKey, uses: list[_Use]) -> None:
    """403 unless ``key`` may use every model of ``uses``: the models a session uses
    without naming them are checked like the one it names."""
    for model, param, use in uses:
        key.require_model(model, param, use)


class Configurator:
    """Builds a session's settings from a ``session.update``'s session, and checks the
    fields a ``response.create`` shares with them (a voice, instructions): every field
    against the API, the session's bounds and its models."""

    def __init__(self, services: RealtimeServices, speech_model: str) -> None:
        self.services = services
        self.speech_model = speech_model

    async def _configured(self, current: SessionConfig, spec: dict[str, Any]) -> SessionConfig:
        """``current`` with ``spec`` (a ``session.update``'s session) applied: a new
        object, so a refused field leaves the session's settings as they were."""
        _fields(spec, "session", _SESSION_FIELDS)
        kind = spec.get("type", "realtime")
        if kind != "realtime":
            raise ClientEventError(
                f"Session type '{kind}' is not supported; use 'realtime'.", param="session.type"
            )
        _refuse_tools(spec, "session")
        if spec.get("include"):
            raise _unsupported(
                "session.include",
                "Log probabilities of input transcriptions are not reported by this gateway.",
            )
        if spec.get("truncation", "disabled") != "disabled":
            raise _unsupported(
                "session.truncation",
                "Only truncation 'disabled' is supported: a conversation that outgrows the "
                "model's context is not cut, the response fails with "
                "context_length_exceeded (delete items to make room).",
            )
        config = replace(current)
        if "tracing" in spec:
            config.tracing = _tracing(spec["tracing"])
        if spec.get("model") is not None:
            requested = _string(spec["model"], "session.model")
            config.model = await self.services.model_for("chat", requested, "session.model")
        if "instructions" in spec:
            config.instructions = self._kept(spec["instructions"], "session.instructions")
        if "output_modalities" in spec:
            config.output_modalities = _modalities(
                spec["output_modalities"], "session.output_modalities"
            )
        if "max_output_tokens" in spec:
            config.max_output_tokens = _max_tokens(
                spec["max_output_tokens"], "session.max_output_tokens"
            )
        if spec.get("tool_choice") is not None:
            config.tool_choice = spec["tool_choice"]
        audio = _object(spec.get("audio") or {}, "session.audio")
        _fields(audio, "session.audio", {"input", "output"})
        await self._configure_input(config, _object(audio.get("input") or {}, _INPUT))
        await self._configure_output(config, _object(audio.get("output") or {}, _OUTPUT))
        return config

    async def _configure_input(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        _fields(spec, _INPUT, {"format", "transcription", "noise_reduction", "turn_detection"})
        _check_format(spec.get("format"), f"{_INPUT}.format")
        if spec.get("noise_reduction") is not None:
            raise _unsupported(
                f"{_INPUT}.noise_reduction",
                "Noise reduction is not available in this gateway; send null.",
            )
        if "transcription" in spec:
            transcription = spec["transcription"]
            config.transcribe_events = transcription is not None
            if transcription is not None:
                where = f"{_INPUT}.transcription"
                await self._configure_transcription(config, _object(transcription, where))
        if "turn_detection" in spec:
            detection = spec["turn_detection"]
            if detection is None:
                config.vad, config.eagerness = None, None
            else:
                _configure_vad(config, _object(detection, f"{_INPUT}.turn_detection"))

    async def _configure_transcription(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        where = f"{_INPUT}.transcription"
        _fields(spec, where, {"model", "language", "prompt", "delay", "keywords", "languages"})
        for name in ("delay", "keywords", "languages"):
            if spec.get(name) is not None:
                raise _unsupported(
                    f"{where}.{name}",
                    f"'{name}' is not supported by this gateway's transcription models; "
                    "use 'language' and 'prompt'.",
                )
        if spec.get("model") is not None:
            requested = _string(spec["model"], f"{where}.model")
            config.transcription_model = await self.services.model_for(
                "transcription", requested, f"{where}.model"
            )
        info = await self.services.catalog.get(config.transcription_model, "transcription")
        language = self._kept(spec.get("language"), f"{where}.language")
        prompt = self._kept(spec.get("prompt"), f"{where}.prompt")
        if language and info.languages and language not in info.languages:
            raise ClientEventError(
                f"The model '{info.name}' does not transcribe language '{language}'; it "
                f"supports: {', '.join(info.languages)}.",
                param=f"{where}.language",
                code="unsupported_language",
            )
        # As /v1/audio/transcriptions: refused unless the operator lists it as ignored.
        if language and not model_takes(info, "language", f"{where}.language"):
            language = ""
        if prompt and not model_takes(info, "prompt", f"{where}.prompt"):
            prompt = ""
        config.language, config.prompt = language or None, prompt or None

    async def _configure_output(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        _fields(spec, _OUTPUT, {"format", "voice", "speed"})
        _check_format(spec.get("format"), f"{_OUTPUT}.format")
        if "voice" in spec:
            config.voice = await self._voice(spec["voice"], f"{_OUTPUT}.voice")
        if "speed" in spec:
            speed = spec["speed"]
            param = f"{_OUTPUT}.speed"
            if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
                raise ClientEventError("speed must be a number from 0.25 to 4.0.", param=param)
            info = await self.services.catalog.get(self.speech_model, "speech")
            config.speed = float(speed) if model_takes(info, "speed", param) else 1.0

    async def _voice(self, value: object, param: str) -> str:
        """A voice of the session's speech model (an OpenAI voice name means its default)."""
        info = await self.services.catalog.get(self.speech_model, "speech")
        if isinstance(value, dict):
            _fields(value, param, {"id"})
            value = value.get("id")
        if not isinstance(value, str):
            raise ClientEventError("voice must be a voice name or {'id': name}.", param=param)
        try:
            return resolve_voice(value, info.voices)
        except InvalidRequestError as exc:
            raise ClientEventError(exc.message, param=param) from exc

    def _kept(self, value: object, param: str) -> str:
        """Text the session keeps (instructions, a prompt): a string (null: empty) of at
        most :attr:`Bounds.text_bytes`."""
        if value is None:
            return ""
        text = _string(value, param, empty=True)
        limit = self.services.bounds.text_bytes
        if len(text.encode("utf-8")) > limit:
            raise ClientEventError(
                f"{param} is longer than {limit:,} bytes, the most a session keeps "
                "(GATEWAY_MAX_STORED_KB).",
                param=param,
                code="string_above_max_length",
            )
        return text


#: ``semantic_vad``'s ``eagerness`` as the silence that ends a turn (ms): no model here
#: judges whether the user has finished, so the approximation is the wait (``low`` lets the
#: user pause longer, ``high`` answers sooner; ``auto`` is ``medium``, as OpenAI's).
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 600, "auto": 600, "high": 300}


def _configure_semantic_vad(config: SessionConfig, spec: dict[str, Any], where: str) -> None:
    _fields(spec, where, {"type", "eagerness", "create_response", "interrupt_response"})
    eagerness = spec.get("eagerness", "auto")
    if eagerness not in SEMANTIC_SILENCE_MS:
        raise ClientEventError(
            "eagerness must be low, medium, high or auto.", param=f"{where}.eagerness"
        )
    for name in ("create_response", "interrupt_response"):
        if spec.get(name) not in (None, True, False):
            raise ClientEventError(f"{name} must be a boolean.", param=f"{where}.{name}")
    config.create_response = spec.get("create_response", config.create_response)
    config.interrupt_response = spec.get("interrupt_response", config.interrupt_response)
    defaults = VadSettings()
    silence = SEMANTIC_SILENCE_MS[eagerness]
    config.vad = VadSettings(defaults.threshold, defaults.prefix_padding_ms, silence)
    config.eagerness = eagerness


def _configure_vad(config: SessionConfig, spec: dict[str, Any]) -> None:
    where = f"{_INPUT}.turn_detection"
    kind = spec.get("type", "server_vad")
    if kind == "semantic_vad":
        _configure_semantic_vad(config, spec, where)
        return
    if kind != "server_vad":
        raise _unsupported(
            f"{where}.type",
            f"Turn detection '{kind}' is not supported; use 'server_vad', 'semantic_vad' or null.",
        )
    config.eagerness = None
    _fields(
        spec,
        where,
        {
            "type",
            "threshold",
            "prefix_padding_ms",
            "silence_duration_ms",
            "create_response",
            "interrupt_response",
            "idle_timeout_ms",
        },
    )
    if spec.get("idle_timeout_ms") is not None:
        raise _unsupported(
            f"{where}.idle_timeout_ms", "idle_timeout_ms is not supported; send null."
        )
    base = config.vad or VadSettings()
    threshold = spec.get("threshold", base.threshold)
    padding = spec.get("prefix_padding_ms", base.prefix_padding_ms)
    silence = spec.get("silence_duration_ms", base.silence_duration_ms)
    if not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
        raise ClientEventError("threshold must be from 0.0 to 1.0.", param=f"{where}.threshold")
    for name, value in (("prefix_padding_ms", padding), ("silence_duration_ms", silence)):
        if not isinstance(value, int) or not 0 <= value <= 10_000:
            raise ClientEventError(
                f"{name} must be an integer from 0 to 10000.", param=f"{where}.{name}"
            )
    for name in ("create_response", "interrupt_response"):
        if spec.get(name) not in (None, True, False):
            raise ClientEventError(f"{name} must be a boolean.", param=f"{where}.{name}")
    config.create_response = spec.get("create_response", config.create_response)
    config.interrupt_response = spec.get("interrupt_response", config.interrupt_response)
    config.vad = VadSettings(float(threshold), padding, silence)


#: The most a ``tracing`` object holds (it is echoed with the session).
_MAX_TRACING_CHARS = 1024


def _tracing(value: object) -> str | dict[str, Any] | None:
    """``session.tracing`` as given: null, ``auto``, or an object of ``workflow_name``,
    ``group_id`` and ``metadata`` (bounded: it is echoed)."""
    param = "session.tracing"
    if value is None or value == "auto":
        return value
    spec = _object(value, param)
    _fields(spec, param, {"workflow_name", "group_id", "metadata"})
    if len(repr(spec)) > _MAX_TRACING_CHARS:
        raise ClientEventError(
            f"tracing holds at most {_MAX_TRACING_CHARS} characters.", param=param
        )
    return spec
