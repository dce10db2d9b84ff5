"""The Anthropic Messages API's request (``POST /v1/messages`` and its ``count_tokens``), as
the ``anthropic`` SDK sends it: every field of its ``MessageCreateParams`` is declared, and
each is honoured, refused by name (:meth:`MessagesRequest.unsupported`) or accepted as
metadata (each field's class: docs/messages.md, checked by
tests/unit/test_messages_fields.py); a field the SDK does not define is an unrecognized
argument (``extra="forbid"``), as on the OpenAI routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequestError
from gateway.serving.protocol import MAX_STOP_CHARS


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Loose(BaseModel):
    """A part whose newer fields the gateway passes over (a block's ``citations``)."""

    model_config = ConfigDict(extra="allow")


class CacheControl(Strict):
    """A prompt-caching breakpoint: a hint (the engine's prefix cache needs none)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Loose):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ImageSource(Strict):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(Loose):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = None


class ToolUseBlock(Loose):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Loose):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Loose):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class OtherBlock(Loose):
    """A block type the gateway does not serve (documents, server tools' results...):
    refused by name when the request is converted."""

    type: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
    Field(discriminator="type"),
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block | OtherBlock], Field(min_length=1)]


class Tool(Strict):
    """A client tool (``type`` absent or ``custom``)."""

    name: str = Field(min_length=1, max_length=128)
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None
    # Accepted, changing nothing here: who may call it (Anthropic's code execution), and
    # how Anthropic loads and streams it.
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    input_examples: list[dict[str, Any]] | None = None
    eager_input_streaming: bool | None = None


class ServerTool(BaseModel):
    """One of Anthropic's server tools (``bash_*``, ``web_search_*``, ...): refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str
    name: str | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1)
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(Strict):
    user_id: str | None = Field(None, max_length=256)


class Diagnostics(Strict):
    previous_message_id: str | None = Field(None, max_length=256)


class BillingPolicy(Strict):
    type: Literal["billing_policy"]
    bill_to: Literal["self", "user_profile"] | None = None


#: A beta's name (``betas``, which the SDK sends as the ``anthropic-beta`` header).
BetaName = Annotated[str, Field(max_length=128)]


class CountTokensRequest(Strict):
    """``POST /v1/messages/count_tokens``: what the prompt would be, without generating."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool | ServerTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None
    speed: Literal["fast", "standard"] | None = None
    user_profile_id: str | None = Field(None, max_length=256)
    workspace_id: str | None = Field(None, max_length=256)
    # Beta fields (the SDK's ``client.beta.messages``; Claude Code sends context_management).
    betas: Annotated[list[BetaName], Field(max_length=64)] | None = None
    billing_policy: BillingPolicy | None = None
    compaction: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None

    def unsupported(self) -> None:
        """400 ``unsupported_parameter`` naming a field the gateway cannot honour: ignoring
        it would change what the client relies on."""
        if self.mcp_servers:
            _refuse(
                "mcp_servers",
                "Anthropic connects to remote MCP servers for the model; this gateway does "
                "not: give their tools as client tools (tools) and run the calls yourself.",
            )


def _refuse(field: str, why: str) -> None:
    raise InvalidRequestError(f"{field}: {why}", param=field, code="unsupported_parameter")


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    #: At most 4, as the chat path's ``stop``; each at most ``MAX_STOP_CHARS``.
    stop_sequences: (
        Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=4)]
        | None
    ) = None
    stream: bool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = Field(None, max_length=64)
    diagnostics: Diagnostics | None = None
    container: dict[str, Any] | str | None = None
    # Beta fields beyond count_tokens'.
    fallback_credit_token: dict[str, Any] | str | None = None
    fallbacks: list[dict[str, Any]] | Literal["default"] | None = None
    thread: dict[str, Any] | None = None
    # Beyond the 2.14 SDK's types, as Anthropic's API reference and older SDKs send them.
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)

    def unsupported(self) -> None:
        super().unsupported()
        if self.container is not None:
            _refuse(
                "container",
                "Anthropic's code execution containers; nothing here runs code: leave it out.",
            )
        if self.compaction is not None:
            _refuse(
                "compaction",
                "a compaction request answers with a summary of the conversation (a "
                "compaction block), which this gateway does not make: leave it out.",
            )
        if self.thread is not None:
            _refuse(
                "thread",
                "this gateway holds no conversation for the Messages API: send the whole "
                "conversation in messages (or use /v1/responses with previous_response_id).",
            )
        if self.billing_policy is not None and self.billing_policy.bill_to == "user_profile":
            raise InvalidRequestError(
                "billing_policy.bill_to: requests are charged to the calling key here; "
                "only 'self' is served.",
                param="billing_policy.bill_to",
                code="unsupported_value",
            )
        if isinstance(self.fallbacks, list) and self.fallbacks:
            raise InvalidRequestError(
                "fallbacks: no model here declines a request for policy reasons, so none "
                "falls back; send 'default' or leave it out (as Anthropic refuses a list of "
                "fallbacks for a model without them).",
                param="fallbacks",
                code="unsupported_value",
            )
