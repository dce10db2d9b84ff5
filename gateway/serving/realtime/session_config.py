"""A session's settings: :class:`SessionConfig` (and the session object a client is
shown), the models they make a session use, and :class:`Configurator`, which applies a
``session.update``'s session (parsed by :mod:`~gateway.serving.realtime.protocol`) to
them, checked against what the deployment has: models, voices, languages, bounds."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequestError
from gateway.serving.audio import PCM_RATE
from gateway.serving.catalog import model_takes
from gateway.serving.realtime.items import ANSWERS, SPEAKS, TRANSCRIBES, Bounds, Use
from gateway.serving.realtime.protocol import ClientEventError, unsupported
from gateway.serving.realtime.specs import (
    AudioInput,
    AudioOutput,
    FunctionChoice,
    RealtimeSessionSpec,
    ServerVad,
    Tracing,
    Transcription,
    TranscriptionAudioInput,
    TranscriptionSessionSpec,
    VoiceId,
)
from gateway.serving.speech import resolve_voice
from gateway.serving.vad import VadSettings

if TYPE_CHECKING:
    from gateway.serving.catalog import ModelCatalog

#: Picks the model of a task a session asked for, by the parameter that asked, an OpenAI
#: name keeping the session's current one (see
#: :meth:`~gateway.serving.realtime.session.RealtimeServices.model_for`).
ModelFor = Callable[[str, str | None, str, str | None], Awaitable[str]]

INPUT = "session.audio.input"
OUTPUT = "session.audio.output"

#: ``semantic_vad``'s ``eagerness`` as the silence that ends a turn (ms): no model here
#: judges whether the user has finished, so the approximation is the wait (``low`` lets the
#: user pause longer, ``high`` answers sooner; ``auto`` is ``medium``, as OpenAI's).
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 600, "auto": 600, "high": 300}


def format_json(kind: str) -> dict[str, Any]:
    """An audio format as the session shows it (G.711 has no rate field)."""
    return {"type": kind, "rate": PCM_RATE} if kind == "audio/pcm" else {"type": kind}


@dataclass
class SessionConfig:
    """The session's settings, as ``session.update`` changes them."""

    model: str
    voice: str
    transcription_model: str
    kind: str = "realtime"
    """``realtime`` (a conversation) or ``transcription`` (audio in, transcripts out)."""
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
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Function tools, as the chat API takes them (``{"type": "function", "function"}``)."""
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    eagerness: str | None = None
    """Set for ``semantic_vad``: its eagerness (the turn detection is server VAD with the
    silence it maps to, :data:`SEMANTIC_SILENCE_MS`)."""
    tracing: str | dict[str, Any] | None = None
    """OpenAI's trace settings (``auto``, or a workflow name, group id and metadata): echoed,
    and set on the session's span (``gateway.realtime.tracing.*``) when tracing is on; the
    gateway's own traces cover the session (docs/tracing.md)."""

    @property
    def answers(self) -> bool:
        return self.kind == "realtime"

    @property
    def usage_model(self) -> str:
        """The model the session's usage is counted under: its chat model, or a
        transcription session's transcription model."""
        return self.model if self.answers else self.transcription_model

    def _detection(self) -> dict[str, Any] | None:
        if self.vad is None:
            return None
        answers = (
            {"create_response": self.create_response, "interrupt_response": self.interrupt_response}
            if self.answers
            else {}
        )
        if self.eagerness is not None:
            return {"type": "semantic_vad", "eagerness": self.eagerness, **answers}
        return {
            "type": "server_vad",
            "threshold": self.vad.threshold,
            "prefix_padding_ms": self.vad.prefix_padding_ms,
            "silence_duration_ms": self.vad.silence_duration_ms,
            **answers,
            "idle_timeout_ms": None,
        }

    def to_json(self, session_id: str) -> dict[str, Any]:
        transcription = None
        if self.transcribe_events:
            transcription = {
                "model": self.transcription_model,
                "language": self.language,
                "prompt": self.prompt,
            }
        audio_in = {
            "format": format_json(self.input_format),
            "transcription": transcription,
            "noise_reduction": None,
            "turn_detection": self._detection(),
        }
        if not self.answers:
            return {
                "type": "transcription",
                "object": "realtime.transcription_session",
                "id": session_id,
                "audio": {"input": audio_in},
                "include": [],
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions,
            "tools": [_shown_tool(tool) for tool in self.tools],
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens or "inf",
            # A conversation that outgrows the model's context is not cut to fit: the
            # response fails with context_length_exceeded (OpenAI's "disabled").
            "truncation": "disabled",
            "tracing": self.tracing,
            "audio": {
                "input": audio_in,
                "output": {
                    "format": format_json(self.output_format),
                    "voice": self.voice,
                    "speed": self.speed,
                },
            },
        }

    def uses(self, speech_model: str) -> list[Use]:
        """The models the session uses: the transcription model (any audio a client sends
        is transcribed) and, in a conversation, its chat model and, for spoken answers, the
        speech model."""
        transcribes = (
            self.transcription_model,
            "session.audio.input.transcription.model",
            TRANSCRIBES,
        )
        if not self.answers:
            return [transcribes]
        uses = [(self.model, "session.model", ANSWERS), transcribes]
        if self.output_modalities == ["audio"]:
            uses.append((speech_model, "session.output_modalities", SPEAKS))
        return uses


def _shown_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    return {
        "type": "function",
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }


class Configurator:
    """Applies a ``session.update``'s session to a session's settings, and checks what a
    ``response.create`` shares with them (a voice, instructions): each field against the
    deployment's models, voices and languages and the session's bounds."""

    def __init__(
        self, catalog: ModelCatalog, bounds: Bounds, speech_model: str, model_for: ModelFor
    ) -> None:
        self.catalog = catalog
        self.bounds = bounds
        self.speech_model = speech_model
        self.model_for = model_for

    async def configured(
        self, current: SessionConfig, spec: RealtimeSessionSpec | TranscriptionSessionSpec
    ) -> SessionConfig:
        """``current`` with ``spec`` applied: a new object, so a refused field leaves the
        session's settings as they were."""
        if spec.type != current.kind:
            raise ClientEventError(
                f"This is a {current.kind} session: its type cannot become '{spec.type}' "
                "(open a new session).",
                param="session.type",
            )
        config = replace(current)
        given = spec.model_fields_set
        if isinstance(spec, RealtimeSessionSpec):
            await self._answering(config, spec, given)
            audio_in: AudioInput | TranscriptionAudioInput | None = None
            if spec.audio is not None:
                audio_in = spec.audio.input
                if spec.audio.output is not None:
                    await self._output(config, spec.audio.output)
        else:
            audio_in = spec.audio.input if spec.audio is not None else None
        if audio_in is not None:
            await self._input(config, audio_in)
        return config

    async def _answering(
        self, config: SessionConfig, spec: RealtimeSessionSpec, given: set[str]
    ) -> None:
        if "tracing" in given:
            tracing = spec.tracing
            config.tracing = (
                tracing.model_dump(exclude_unset=True) if isinstance(tracing, Tracing) else tracing
            )
        if spec.model is not None:
            config.model = await self.model_for("chat", spec.model, "session.model", config.model)
        if "instructions" in given:
            config.instructions = self.kept(spec.instructions, "session.instructions")
        if spec.output_modalities is not None:
            config.output_modalities = list(spec.output_modalities)
        if "max_output_tokens" in given:
            config.max_output_tokens = tokens(spec.max_output_tokens)
        if spec.tools is not None:
            config.tools = [chat_tool(tool.model_dump()) for tool in spec.tools]
        if spec.tool_choice is not None:
            config.tool_choice = choice(spec.tool_choice)
        if spec.parallel_tool_calls is not None:
            config.parallel_tool_calls = spec.parallel_tool_calls
        check_tools(config.tools, config.tool_choice, "session", self.bounds)

    async def _input(
        self, config: SessionConfig, spec: AudioInput | TranscriptionAudioInput
    ) -> None:
        given = spec.model_fields_set
        if spec.format is not None:
            config.input_format = spec.format.type
        if spec.noise_reduction is not None and spec.noise_reduction.type is not None:
            raise unsupported(
                f"{INPUT}.noise_reduction",
                "Noise reduction is not available in this gateway; send null.",
            )
        if "transcription" in given:
            config.transcribe_events = spec.transcription is not None
            if spec.transcription is not None:
                await self._transcription(config, spec.transcription)
        if "turn_detection" in given:
            detection = spec.turn_detection
            if detection is None:
                config.vad, config.eagerness = None, None
            elif isinstance(detection, ServerVad):
                _server_vad(config, detection)
            else:
                config.vad = VadSettings(
                    silence_duration_ms=SEMANTIC_SILENCE_MS[detection.eagerness]
                )
                config.eagerness = detection.eagerness
                _answer_flags(config, detection.create_response, detection.interrupt_response)

    async def _transcription(self, config: SessionConfig, spec: Transcription) -> None:
        where = f"{INPUT}.transcription"
        if spec.model is not None:
            config.transcription_model = await self.model_for(
                "transcription", spec.model, f"{where}.model", config.transcription_model
            )
        info = await self.catalog.get(config.transcription_model, "transcription")
        language = self.kept(spec.language, f"{where}.language")
        prompt = self.kept(spec.prompt, f"{where}.prompt")
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

    async def _output(self, config: SessionConfig, spec: AudioOutput) -> None:
        if spec.format is not None:
            config.output_format = spec.format.type
        if spec.voice is not None:
            config.voice = await self.voice(spec.voice, f"{OUTPUT}.voice")
        if spec.speed is not None:
            info = await self.catalog.get(self.speech_model, "speech")
            config.speed = spec.speed if model_takes(info, "speed", f"{OUTPUT}.speed") else 1.0

    async def voice(self, value: str | VoiceId, param: str) -> str:
        """A voice of the session's speech model (an OpenAI voice name means its default)."""
        info = await self.catalog.get(self.speech_model, "speech")
        name = value.id if isinstance(value, VoiceId) else value
        try:
            return resolve_voice(name, info.voices)
        except InvalidRequestError as exc:
            raise ClientEventError(exc.message, param=param) from exc

    def kept(self, value: str | None, param: str) -> str:
        """Text the session keeps (instructions, a prompt): at most
        :attr:`Bounds.text_bytes` (null: empty)."""
        text = value or ""
        limit = self.bounds.text_bytes
        if len(text.encode("utf-8")) > limit:
            raise ClientEventError(
                f"{param} is longer than {limit:,} bytes, the most a session keeps "
                "(GATEWAY_MAX_STORED_KB).",
                param=param,
                code="string_above_max_length",
            )
        return text


def tokens(value: int | str | None) -> int | None:
    return None if value in (None, "inf") else int(value)


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Realtime function tool as the chat API takes it."""
    function = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    return {"type": "function", "function": function}


def choice(value: str | FunctionChoice) -> str | dict[str, Any]:
    if isinstance(value, FunctionChoice):
        return {"type": "function", "name": value.name}
    return value


def check_tools(
    tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], param: str, bounds: Bounds
) -> None:
    """Tools within :attr:`Bounds.tools_bytes` (checked when they are set, not at each
    response); a named or required choice needs tools (and a named one, that tool)."""
    size = len(json.dumps(tools))
    if size > bounds.tools_bytes:
        raise ClientEventError(
            f"The tools are {size // 1024:,} KB of JSON; at most {bounds.tools_bytes // 1024:,} "
            "KB are allowed (GATEWAY_MAX_TOOLS_KB).",
            param=f"{param}.tools",
            code="tools_too_large",
        )
    names = {tool["function"]["name"] for tool in tools}
    if tool_choice == "required" and not tools:
        raise ClientEventError("tool_choice 'required' needs tools.", param=f"{param}.tool_choice")
    if isinstance(tool_choice, dict) and tool_choice["name"] not in names:
        raise ClientEventError(
            f"tool_choice names '{tool_choice['name']}', which is not one of the tools.",
            param=f"{param}.tool_choice",
        )


def _answer_flags(config: SessionConfig, create: bool | None, interrupt: bool | None) -> None:
    if create is not None:
        config.create_response = create
    if interrupt is not None:
        config.interrupt_response = interrupt


def _server_vad(config: SessionConfig, spec: ServerVad) -> None:
    base = config.vad if config.vad is not None and config.eagerness is None else VadSettings()
    config.eagerness = None
    config.vad = VadSettings(
        spec.threshold if spec.threshold is not None else base.threshold,
        spec.prefix_padding_ms if spec.prefix_padding_ms is not None else base.prefix_padding_ms,
        spec.silence_duration_ms
        if spec.silence_duration_ms is not None
        else base.silence_duration_ms,
    )
    _answer_flags(config, spec.create_response, spec.interrupt_response)
