"""OpenAI API schemas (the subset the gateway serves), as pydantic models.

Requests validate the OpenAI ranges, so bad input gets a 400 naming the parameter before
anything reaches Triton. Fields the OpenAI API defines but the gateway cannot honour are
rejected with a clear message (see :meth:`ChatCompletionRequest.unsupported`); fields it
does not know are ignored, so apps written for OpenAI keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ContentPart(BaseModel):
    """Any content part; only ``text`` parts are supported (checked by the chat service)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=128)
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None

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
        if self.n is not None and self.n > 1:
            return "n", "Only n=1 is supported."
        if self.logprobs:
            return "logprobs", "logprobs are not supported by this gateway."
        if self.top_logprobs:
            return "top_logprobs", "top_logprobs are not supported by this gateway."
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this gateway."
        if self.tools:
            return "tools", "Tool calling is not supported by this gateway."
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice", "Tool calling is not supported by this gateway."
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format", "Only response_format type 'text' is supported."
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true."
        return None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "triton"
    task: str | None = None
    """The OpenAI capability this model serves (``chat``, ...): an extension field."""
    context_length: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


#: The voice names of the OpenAI speech API; each maps onto a voice of the speech model.
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
    "nova", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str = Field(min_length=1, max_length=4096)
    voice: str = Field(min_length=1)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None
    """Accepted for compatibility; Piper voices have no steerable style."""
