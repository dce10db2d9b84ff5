"""``/v1/completions``: the request and the completion."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
    field_validator,
)

from gateway.serving.protocol.common import SamplingRequest, Usage


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
