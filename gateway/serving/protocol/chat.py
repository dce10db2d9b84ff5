"""``/v1/chat/completions``: the request (messages, content parts, tools, formats,
audio) and the completion."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from gateway.serving.protocol.common import (
    FUNCTION_NAME,
    CacheOptions,
    ChoiceLogprobs,
    Echoed,
    Hint,
    ParamNames,
    ReasoningEffort,
    SafetyIdentifier,
    SamplingRequest,
    ServiceTier,
    Strict,
    TemplateKwargs,
    Usage,
)


class InputAudio(Strict):
    data: str = Field(min_length=1)
    """The audio file, base64-encoded."""
    format: str = "wav"
    """``wav`` or ``mp3`` in OpenAI's API; any file type of an upload is taken (the file
    says what it is: :data:`gateway.serving.audio.UPLOAD_FORMATS`)."""


class ContentPart(Strict):
    """Any content part: ``text``, or ``input_audio`` (transcribed into text before the chat
    model sees it, see :mod:`gateway.serving.audio_chat`); the other types OpenAI defines
    are declared so that they are refused by their type, with a clear message."""

    type: str
    text: str | None = None
    input_audio: InputAudio | None = None
    image_url: Any = None
    file: Any = None
    refusal: str | None = None


class AudioRef(Strict):
    """An earlier answer's audio, by its id (``message.audio.id``)."""

    id: str = Field(min_length=1)


class FunctionCall(Strict):
    name: str = Field(min_length=1)
    arguments: str
    """The arguments as a JSON string, as the model wrote them."""
    parsed_arguments: Echoed = None
    """The SDK's parse of ``arguments`` (its ``parse`` helpers)."""


class ToolCall(Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Echoed = None
    """A streamed call's place, kept by clients that assemble deltas themselves."""


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """Assistant messages: the calls the model made."""
    tool_call_id: str | None = None
    """Tool messages: the call this is the result of."""
    function_call: FunctionCall | None = None
    """Assistant messages of legacy function calling: the call the model made (its result
    comes in a ``function`` message with the function's ``name``)."""
    audio: AudioRef | None = None
    """Assistant messages: an earlier spoken answer, stood for by its transcript."""
    refusal: str | None = None
    """Assistant messages: a refusal the model gave, its text when ``content`` is empty."""
    annotations: Echoed = None
    """Citations OpenAI puts on an answer (none here); sent back with it."""
    parsed: Echoed = None
    """The SDK's parse of the content (its ``parse`` helpers)."""
    reasoning_content: str | None = None
    reasoning: str | None = None
    """Assistant messages: the reasoning that came with an earlier answer (an answer sent
    back whole carries both), given to the chat template as the message's
    ``reasoning_content``; templates that show no earlier reasoning leave it out."""


class FunctionDefinition(Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema of the arguments object; None: a function without parameters."""
    strict: bool | None = None
    """True: the arguments always match ``parameters`` (see :mod:`gateway.serving.tools`)."""


class ChatTool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class AudioOutput(Strict):
    """``audio`` of a chat request with ``modalities: ["text", "audio"]``."""

    voice: str = Field(min_length=1)
    format: Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"] = "wav"


#: Official chat parameters the gateway does not implement, and why: refused when set.
CHAT_REFUSED = {
    "web_search_options": "no model here searches the web",
    "moderation": "no moderation model runs here",
    "verbosity": "no model here adjusts its length to it",
    "prediction": "predicted outputs are not implemented",
}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ChatTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    store: bool | None = None
    """``true``: the completion is stored under the key, with its request's messages and
    ``metadata`` (:mod:`gateway.serving.stored_chat`); ``false`` or unset: nothing is."""
    functions: list[FunctionDefinition] | None = Field(None, min_length=1, max_length=128)
    """Legacy function calling: honoured as tools, and answered in its own shape."""
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    safety_identifier: SafetyIdentifier | None = None
    prompt_cache_key: Hint | None = None
    """Keeps requests on one Triton server, where their prompts' prefix is cached (with
    several servers; see ``docs/scheduling.md``)."""
    service_tier: ServiceTier | None = None
    """A hint, like ``user``: accepted, nothing here depends on it."""
    reasoning_effort: ReasoningEffort | None = None
    """Passed to a chat template that takes it (``reasoning_effort``, or an
    ``enable_thinking`` switch: off for ``none``); refused for one that does not (see
    :mod:`gateway.serving.reasoning`)."""
    chat_template_kwargs: TemplateKwargs | None = None
    """vLLM's extension: further variables of the model's chat template (Qwen3's
    ``enable_thinking``), each one the template reads; others refused by name."""
    # Declared so that setting one gets its reason (see CHAT_REFUSED), not "unrecognized".
    web_search_options: Any = None
    moderation: Any = None
    verbosity: Any = None
    prediction: Any = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=16),
        ]
        | None
    ) = None
    """Stored with the completion (``store``) to filter lists by; without ``store``,
    accepted and unused. OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512."""
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    """A caching hint: accepted metadata (the engine's prefix cache keeps what it keeps;
    ``docs/conformance.md``)."""
    prompt_cache_options: CacheOptions | None = None
    """Caching hints (OpenAI's explicit cache): accepted metadata, as above."""

    def wants_audio(self) -> bool:
        return "audio" in (self.modalities or [])

    def param_names(self) -> ParamNames:
        """This request's names of the parameters the chat path checks: the token limit it
        set, and legacy ``functions`` and ``function_call`` for tools."""
        max_tokens = "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
        names = ParamNames(max_tokens=max_tokens)
        if self.functions is None and self.function_call is None:
            return names
        return replace(names, tools="functions", tool="functions.[{}]", tool_choice="function_call")

    def unsupported(self) -> tuple[str, str] | None:
        for param, why in CHAT_REFUSED.items():
            if getattr(self, param) is not None:
                return param, f"{param} is not supported by this gateway: {why}."
        if self.audio is not None and not self.wants_audio():
            return "audio", "audio is only used when modalities includes 'audio'."
        if self.wants_audio() and self.audio is None:
            return "audio", "The audio parameter is required when modalities includes 'audio'."
        if self.wants_audio() and self.n > 1:
            return "n", "Audio output is generated for one choice: n must be 1."
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs set to true."
        return super().unsupported()


class AnswerAudio(BaseModel):
    """A spoken answer: its id (refer to it in a later request), the audio in base64, when
    the id expires, and what it says."""

    id: str
    data: str
    expires_at: int
    transcript: str


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None
    """The call, when the request used legacy ``functions`` (then ``tool_calls`` is None)."""
    refusal: None = None
    audio: AnswerAudio | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    """A reasoning model's reasoning, apart from its answer (vLLM's fields: ``reasoning``,
    and ``reasoning_content``, which many clients read); left out for other models."""

    @model_serializer(mode="wrap")
    def _without_reasoning(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("reasoning_content", "reasoning"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None
    service_tier: str = "default"
    """The tier that served it: the one tier here, whatever ``service_tier`` asked."""
