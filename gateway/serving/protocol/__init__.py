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

The schemas live by endpoint family: :mod:`.common` (what several share), :mod:`.chat`,
:mod:`.completions`, :mod:`.embeddings`, :mod:`.models` and :mod:`.audio`; every name is
importable from here. The Responses API's schemas are in
:mod:`gateway.serving.responses.protocol`, the Realtime client events in
:mod:`gateway.serving.realtime.protocol` (each endpoint family's protocol module).
"""

from gateway.serving.protocol.audio import (
    OPENAI_VOICES,
    TRANSCRIPTION_REFUSED,
    ChunkingStrategy,
    SpeechRequest,
    TranscriptionRequest,
    TranslationRequest,
)
from gateway.serving.protocol.chat import (
    CHAT_REFUSED,
    AnswerAudio,
    AudioOutput,
    AudioRef,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    InputAudio,
    NamedFunction,
    NamedToolChoice,
    ToolCall,
)
from gateway.serving.protocol.common import (
    FUNCTION_NAME,
    MAX_STOP_CHARS,
    CacheOptions,
    ChoiceLogprobs,
    CompletionTokensDetails,
    Echoed,
    Hint,
    JsonSchemaFormat,
    ParamNames,
    Priority,
    ReasoningEffort,
    ResponseFormat,
    ResponsesServiceTier,
    SafetyIdentifier,
    SamplingRequest,
    ServiceTier,
    StreamOptions,
    Strict,
    TemplateKwargs,
    TokenLogprobItem,
    TopLogprobItem,
    Usage,
    stream_options_problem,
)
from gateway.serving.protocol.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from gateway.serving.protocol.embeddings import (
    MAX_INPUTS,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
)
from gateway.serving.protocol.models import (
    Model,
    ModelCapabilities,
    ModelList,
)

__all__ = [
    "CHAT_REFUSED",
    "FUNCTION_NAME",
    "MAX_INPUTS",
    "MAX_STOP_CHARS",
    "OPENAI_VOICES",
    "TRANSCRIPTION_REFUSED",
    "AnswerAudio",
    "AudioOutput",
    "AudioRef",
    "CacheOptions",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionMessage",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatTool",
    "ChoiceLogprobs",
    "ChunkingStrategy",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionTokensDetails",
    "ContentPart",
    "Echoed",
    "Embedding",
    "EmbeddingList",
    "EmbeddingRequest",
    "EmbeddingUsage",
    "FunctionCall",
    "FunctionDefinition",
    "Hint",
    "InputAudio",
    "JsonSchemaFormat",
    "Model",
    "ModelCapabilities",
    "ModelList",
    "NamedFunction",
    "NamedToolChoice",
    "ParamNames",
    "Priority",
    "ReasoningEffort",
    "ResponseFormat",
    "ResponsesServiceTier",
    "SafetyIdentifier",
    "SamplingRequest",
    "ServiceTier",
    "SpeechRequest",
    "StreamOptions",
    "Strict",
    "TemplateKwargs",
    "TokenLogprobItem",
    "ToolCall",
    "TopLogprobItem",
    "TranscriptionRequest",
    "TranslationRequest",
    "Usage",
    "stream_options_problem",
]
