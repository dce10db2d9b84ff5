"""The Responses request's shapes: :class:`ResponsesRequest` (every parameter of OpenAI's
``ResponseCreateParams``, with :meth:`ResponsesRequest.unsupported` naming those the gateway
refuses), the input items, tools and text format it holds, and :class:`PreparedResponse`,
a request once validated and rendered by the chat path."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.serving.chat import PreparedChat
from gateway.serving.protocol import (
    FUNCTION_NAME,
    Echoed,
    Hint,
    Priority,
    ReasoningEffort,
    SafetyIdentifier,
    ServiceTier,
    Strict,
)
from gateway.state.stored_bytes import Hold


class ContentPart(Strict):
    """A part of a message's content: ``input_text``, ``output_text`` (an earlier answer
    sent back) or ``refusal``; the other types OpenAI defines are declared so that they are
    refused by their type, with a clear message."""

    type: str
    text: str | None = None
    refusal: str | None = None
    annotations: Echoed = None
    """An earlier answer's citations (none here), sent back with it."""
    logprobs: Echoed = None
    """An earlier answer's log probabilities, sent back with it."""
    image_url: Any = None
    file_id: Any = None
    file_data: Any = None
    file_url: Any = None
    filename: Any = None
    detail: Any = None
    input_audio: Any = None


class InputItem(Strict):
    """A message, ``function_call``, ``function_call_output`` or ``reasoning`` item (checked
    when the request is turned into chat messages, so errors can name the item). The fields
    of OpenAI's other item types are declared so that those are refused by their type."""

    type: str | None = None
    id: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    status: Echoed = None
    """An earlier output item's status, sent back with it (stored items are completed)."""
    summary: list[ContentPart] | None = None
    """A reasoning item's summary (none is made here: sent back empty)."""
    encrypted_content: Any = None


class ReasoningConfig(Strict):
    """``reasoning``: its ``effort`` is the chat path's ``reasoning_effort`` (see
    :mod:`gateway.serving.reasoning`); no summary is made (the reasoning is given whole, as
    ``reasoning_text``), so ``summary`` is refused."""

    effort: ReasoningEffort | None = None
    summary: Any = None
    generate_summary: Any = None


class FunctionTool(Strict):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None


#: The one ``include`` value the gateway can fill.
LOGPROBS = "message.output_text.logprobs"
#: OpenAI's bounds on ``metadata``: 16 pairs, keys of 64 characters, values of 512.
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class ResponsesRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    """Honoured by keeping the first calls of the answer (OpenAI: further calls are
    ignored)."""
    text: TextConfig | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=16)
    prompt: dict[str, Any] | None = None
    reasoning: ReasoningConfig | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    # Hints for OpenAI's own systems: abuse detection (user, safety_identifier) and
    # processing tier (service_tier). Accepting them is harmless: nothing here has such a
    # system, and the answer echoes them (the tier as "default", the one that served it).
    # prompt_cache_key keeps requests on one Triton server, where their prefix is cached
    # (docs/scheduling.md).
    user: Hint | None = None
    safety_identifier: SafetyIdentifier | None = None
    prompt_cache_key: Hint | None = None
    service_tier: ServiceTier | None = None
    priority: Priority | None = None
    """vLLM's scheduling priority (lower first; see ``docs/scheduling.md``)."""

    def wants_logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    def unsupported(self) -> tuple[str, str] | None:
        if self.background:
            return "background", "Background responses are not supported by this gateway."
        if self.conversation is not None:
            return "conversation", "Conversations are not supported; use previous_response_id."
        if self.prompt is not None:
            return "prompt", "Prompt templates are not supported; send input and instructions."
        reasoning = self.reasoning
        if reasoning is not None and (reasoning.summary or reasoning.generate_summary):
            name = "summary" if reasoning.summary else "generate_summary"
            return f"reasoning.{name}", (
                "Reasoning summaries are not made here: a reasoning model's reasoning comes "
                "whole, as the reasoning item's reasoning_text."
            )
        if self.truncation == "auto":
            return "truncation", (
                "truncation 'auto' is not supported: a conversation longer than the model's "
                "context is a 400 (context_length_exceeded), never shortened."
            )
        for index, value in enumerate(self.include or []):
            if value != LOGPROBS:
                return f"include[{index}]", (
                    f"include '{value}' is not supported; only '{LOGPROBS}' is."
                )
        if self.top_logprobs is not None and not self.wants_logprobs():
            return "top_logprobs", f"top_logprobs needs include ['{LOGPROBS}']."
        if isinstance(self.input, list) and not self.input:
            return "input", "input must not be empty."
        return None


@dataclass
class PreparedResponse:
    id: str
    request: ResponsesRequest
    chat: PreparedChat
    owner: str
    input_items: list[dict[str, Any]]
    """The conversation this response answers, as items with ids (what ``input_items``
    lists): the previous response's input items and output, then the request's input."""
    messages: list[dict[str, Any]]
    """The conversation before the reply: stored chain + new input (no instructions)."""
    created_at: int = field(default_factory=lambda: int(time.time()))
    root: str = ""
    """The first response of its ``previous_response_id`` chain (its own id when it starts
    one): what routes the chain's requests to one Triton server."""
    hold: Hold | None = None
    """The room held in the key's stored bytes for its record (with ``store``), until it is
    saved or given back."""
