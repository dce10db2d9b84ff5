"""OpenAI API schemas (the subset the gateway serves), as pydantic models.

Requests validate the OpenAI ranges, so bad input gets a 400 naming the parameter before
anything reaches Triton. Every parameter of the OpenAI API is declared, and each is
honoured, refused when set (a 400 ``unsupported_parameter`` naming it and saying why, see
:meth:`SamplingRequest.unsupported`), or accepted as a hint nothing depends on (``user``,
``safety_identifier``, ``service_tier``; ``prompt_cache_key`` routes a request over several
Tritons, see ``docs/scheduling.md``). Fields the API does not
define are refused too (``extra="forbid"``: a 400 naming the field, never a silent drop), at
the top and inside messages, content parts, tool calls, tools, formats and options. What the
openai SDKs put on an answer a client sends back as history (:data:`Echoed`: ``annotations``,
``parsed``, ``parsed_arguments``, a streamed call's ``index``) is accepted and not read;
an assistant's ``refusal`` stands for its empty content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from gateway.backend.scheduling import MAX_PRIORITY, MIN_PRIORITY
from gateway.serving.json_shape import json_depth


class Strict(BaseModel):
    """A request object: a field it does not declare is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")


#: What the openai SDKs put on a message, part or call a client sends back as it got it:
#: accepted, never read (``exclude``: not passed on), and never anything else unknown.
Echoed = Annotated[Any, Field(exclude=True)]


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


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None
    """OpenAI pads stream events with random text unless this is false; nothing here pads
    them, so ``false`` is honoured and ``true`` refused."""


#: OpenAI's rule for function names.
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


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


class JsonSchemaFormat(Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    """``text``, ``json_object`` or ``json_schema`` (with ``json_schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


#: A hint string (``user``, ``prompt_cache_key``): accepted (the latter routes, see
#: ``docs/scheduling.md``), echoed and stored with a response, so bounded.
Hint = Annotated[str, Field(max_length=256)]
#: vLLM's ``priority``: lower goes first, 0 by default; honoured by the gateway's own queue
#: (:mod:`gateway.backend.scheduling`), never before the key's own priority.
Priority = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
#: OpenAI's ``safety_identifier`` (at most 64 characters).
SafetyIdentifier = Annotated[str, Field(max_length=64)]
#: OpenAI's processing tiers (chat's): accepted as a hint. There is one tier here, so an
#: answer always says it was served by ``default``.
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]
#: The Responses API's tiers (``ultrafast`` besides), accepted the same way.
ResponsesServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]

#: OpenAI's ``reasoning_effort`` values, lowest first (``max``: the model's highest, see
#: :func:`gateway.serving.reasoning.template_switches`).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
#: ``chat_template_kwargs``: at most 16 variables.
TemplateKwargs = Annotated[dict[str, Any], Field(max_length=16)]

#: The longest stop string: engines match each against every new token (and the gateway
#: holds back text that may still become one), so its length is bounded.
MAX_STOP_CHARS = 256


class SamplingRequest(Strict):
    """What chat and legacy completions share: the model, sampling and how many choices."""

    model: str = Field(min_length=1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=128)
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: (
        Annotated[str, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=4)]
        | None
    ) = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    user: Hint | None = None
    """A hint (OpenAI's abuse monitoring): accepted, nothing here depends on it."""
    # vLLM's sampling parameters (clients send them in the openai SDK's extra_body):
    # honoured by a model whose profile takes them, else refused naming them.
    top_k: int | None = Field(None, ge=-1)
    """0 or -1: no top-k cut."""
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    priority: Priority | None = None
    """vLLM's scheduling priority (lower first; see :data:`Priority`)."""

    @field_validator("n", mode="before")
    @classmethod
    def _n_default(cls, value: object) -> object:
        return 1 if value is None else value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if any(s == "" for s in strings):
            raise ValueError("stop sequences must not be empty strings")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> tuple[str, str] | None:
        """The first requested feature the gateway cannot honour, as (param, message)."""
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this gateway."
        return stream_options_problem(self.stream, self.stream_options)


class _StreamOptions(Protocol):
    include_obfuscation: bool | None


def stream_options_problem(
    stream: bool | None, options: _StreamOptions | None
) -> tuple[str, str] | None:
    """Why a request's ``stream_options`` (chat's or Responses') cannot be taken, if it
    cannot: they need ``stream``, and nothing here pads events (``include_obfuscation``)."""
    if options is not None and not stream:
        return "stream_options", "stream_options is only allowed when stream is true."
    if options is not None and options.include_obfuscation:
        return (
            "stream_options.include_obfuscation",
            "Stream obfuscation is not supported by this gateway; set it to false.",
        )
    return None


class AudioOutput(Strict):
    """``audio`` of a chat request with ``modalities: ["text", "audio"]``."""

    voice: str = Field(min_length=1)
    format: Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"] = "wav"


class CacheOptions(Strict):
    """OpenAI's ``prompt_cache_options``: hints about its prompt cache, accepted and not
    read (vLLM's and TensorRT-LLM's prefix caches keep what they keep)."""

    comparison_response_id: str | None = Field(None, max_length=256)
    mode: Literal["implicit", "explicit"] | None = None
    prewarm: bool | None = None
    ttl: Literal["30m", "12h"] | None = None


#: Official chat parameters the gateway does not implement, and why: refused when set.
CHAT_REFUSED = {
    "web_search_options": "no model here searches the web",
    "moderation": "no moderation model runs here",
    "verbosity": "no model here adjusts its length to it",
    "prediction": "predicted outputs are not implemented",
}


@dataclass(frozen=True)
class ParamNames:
    """What a request calls the parameters the chat path checks (see
    :meth:`gateway.serving.chat.ChatService.prepare`), so that an error names the one the
    client sent: a chat request's own names (:meth:`ChatCompletionRequest.param_names`), or
    those of the request it was converted from (a Responses request's)."""

    max_tokens: str = "max_tokens"
    logprobs: str = "logprobs"
    top_logprobs: str = "top_logprobs"
    tools: str = "tools"
    tool: str = "tools.[{}].function"
    """One tool's function (its ``name``, ``parameters``, ``strict``); ``{}``: its index."""
    tool_choice: str = "tool_choice"
    response_format: str = "response_format"
    json_schema: str = "response_format.json_schema"
    """The ``json_schema`` format (its ``schema`` below it)."""
    messages: str = "messages"
    reasoning_effort: str = "reasoning_effort"
    image_parts: tuple[str, ...] = ()
    """The request's image parts, in order (a converted request's names for them; empty:
    ``messages.[i].content.[j]``)."""


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


class CompletionRequest(SamplingRequest):
    """The legacy ``/v1/completions``: a raw prompt, no chat template."""

    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=20)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    max_tokens: int | None = Field(16, ge=1)
    """OpenAI's default is 16 tokens."""

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_default(cls, value: object) -> object:
        return 16 if value is None else value

    @field_validator("echo", mode="before")
    @classmethod
    def _echo_default(cls, value: object) -> object:
        return False if value is None else value

    def prompts(self) -> list[str]:
        """The prompts as text (token arrays are refused by :meth:`unsupported`)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        return [str(p) for p in self.prompt]

    def unsupported(self) -> tuple[str, str] | None:
        if self.suffix:
            return "suffix", "suffix is not supported by this gateway."
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of is not supported by this gateway (only best_of = n)."
        if self.echo and self.logprobs is not None:
            return "echo", "echo with logprobs is not supported (no prompt log probabilities)."
        if isinstance(self.prompt, list) and not self.prompt:
            return "prompt", "prompt must not be empty."
        if isinstance(self.prompt, list) and not all(isinstance(p, str) for p in self.prompt):
            return "prompt", "Token arrays as prompt are not supported; send text."
        return super().unsupported()


class TopLogprobItem(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobItem(TopLogprobItem):
    top_logprobs: list[TopLogprobItem] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobItem] | None = None
    refusal: None = None


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


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int
    """Of the completion tokens, those of the reasoning (a reasoning model's)."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None
    """Sent for a reasoning model (OpenAI sends it always; clients read it as optional)."""
    estimated: bool | None = None
    """True when a count was made by the gateway, because the model reports none (with the
    model's tokenizer, or at four bytes a token without one): an extension field, left out
    when the counts are the model's own."""

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("estimated", "completion_tokens_details"):
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


class CompletionLogprobs(BaseModel):
    """The legacy shape: parallel lists, one entry per token."""

    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCapabilities(BaseModel):
    """What a model can do beyond plain text (an extension of the OpenAI model object)."""

    tool_calling: bool = False
    """Tools with ``tool_choice`` ``auto`` (a tool-call parser reads its text)."""
    forced_tool_calls: bool = False
    """``tool_choice`` ``required`` or a named function (constrained decoding)."""
    structured_outputs: list[str] = []
    """The ``response_format`` types it enforces: ``json_object``, ``json_schema``."""
    logprobs: bool = False
    max_logprobs: int = 0
    reasoning: str | None = None
    """Its reasoning parser (``deepseek_r1``, ``qwen3``): its reasoning comes apart from its
    answer, as ``reasoning_content``; None for a model that does not reason."""
    images: bool = False
    """It sees images (``image_url`` parts, Responses ``input_image``); other models
    refuse them."""
    max_images: int | None = None
    """The most images one request may carry to it (None: ``GATEWAY_MAX_IMAGES`` alone)."""


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "triton"
    task: str | None = None
    """The OpenAI capability this model serves (``chat``, ...): an extension field."""
    context_length: int | None = None
    capabilities: ModelCapabilities | None = None
    """Chat models: tool calling, structured outputs, log probabilities."""
    dimensions: int | None = None
    """Embedding models: the length of their vectors."""
    voices: list[str] | None = None
    """Speech models: their own voice names (OpenAI's names map onto the first)."""
    profile: str | None = None
    """How the gateway talks to it: ``vllm``, ``trtllm`` or ``custom`` (extension)."""
    backend_release: str | None = None
    """The release of its backend, as read from its config (vLLM, TensorRT-LLM)."""
    parameters: list[str] | None = None
    """The OpenAI request parameters it honours; others are refused with a 400, except
    those in ``ignored_parameters`` (accepted, not honoured)."""
    ignored_parameters: list[str] | None = None
    chat_template: bool | None = None
    """Chat models: whether it has a chat template (without one, only /v1/completions)."""
    root: str | None = None
    """The Triton model that serves it (vLLM's field, where vLLM shows the weights' path)."""
    parent: str | None = None
    """A LoRA adapter: the id of its base model (vLLM's field); null for a base model."""
    languages: list[str] | None = None
    """Transcription models: the language codes they take (empty: any)."""
    translates: bool | None = None
    """Transcription models: whether ``/v1/audio/translations`` takes them."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


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
        fields = dict(data)
        prefix = "chunking_strategy["
        nested = {
            key[len(prefix) : -1]: fields.pop(key)
            for key in data
            if isinstance(key, str) and key.startswith(prefix) and key.endswith("]")
        }
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
