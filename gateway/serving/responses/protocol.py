"""The Responses request's shapes: :class:`ResponsesRequest` (every parameter of OpenAI's
``ResponseCreateParams``, with :meth:`ResponsesRequest.unsupported` naming those the gateway
refuses), the input items, tools and text format it holds, and :class:`PreparedResponse`,
a request once validated and rendered by the chat path."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.serving.chat import PreparedChat
from gateway.serving.protocol import (
    FUNCTION_NAME,
    CacheOptions,
    Echoed,
    Hint,
    Priority,
    ReasoningEffort,
    ResponsesServiceTier,
    SafetyIdentifier,
    Strict,
    stream_options_problem,
)
from gateway.state.conversations import ConversationTurn
from gateway.state.stored_bytes import Hold

if TYPE_CHECKING:
    from gateway.serving.responses.tools import ToolNames


def _tool_names() -> ToolNames:
    from gateway.serving.responses.tools import ToolNames

    return ToolNames()


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
    encrypted_content: str | None = None
    """A reasoning item's reasoning as the gateway sealed it (``include:
    ["reasoning.encrypted_content"]``): opened and given to the model
    (:mod:`gateway.serving.responses.sealing`)."""
    namespace: str | None = None
    """A ``function_call`` item's namespace (a call of a namespace tool's function)."""
    caller: Echoed = None
    """What made an earlier call (the model, ``direct``), sent back with it."""


class ReasoningConfig(Strict):
    """``reasoning``: its ``effort`` is the chat path's ``reasoning_effort`` (see
    :mod:`gateway.serving.reasoning`). A summary is asked for with ``summary`` (or the
    older ``generate_summary``): accepted, and the reasoning item's ``summary`` stays empty,
    because no model here writes one (its reasoning comes whole, as ``reasoning_text``; a
    summary is never invented). ``context`` ``auto`` and ``mode`` ``standard`` are what runs
    here; the others are refused by name."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = Field(None, max_length=64)


class FunctionTool(Strict):
    """A function tool; the fields of OpenAI's newer function tools that change nothing
    here are accepted (``defer_loading``: offered at once, there is no tool search here;
    ``output_schema``: a description of what the function returns, not shown)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None
    """Who may call it: ``direct`` (the model) is the only caller here."""
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None
    async_: bool | None = Field(None, alias="async")
    """An asynchronous function (the model goes on before its output): refused when true."""


class NamespaceTool(Strict):
    """``{"type": "namespace", "name", "description", "tools"}``: functions grouped under a
    name (Codex puts its MCP tools so). Each is offered to the model as
    ``<namespace>__<name>``, and its calls come back as OpenAI reports them: a
    ``function_call`` item with ``name`` and ``namespace``."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    tools: list[FunctionTool] = Field(max_length=128)


#: OpenAI's hosted tools (it runs them), by their ``type``: refused with ``unsupported_tool``
#: (no server here searches, runs code or calls MCP servers for the model), saying what to
#: turn off. ``custom`` (free-form input by a grammar) is refused the same way.
HOSTED_TOOLS = frozenset(
    {
        "web_search", "web_search_2025_08_26", "web_search_preview",
        "web_search_preview_2025_03_11", "file_search", "code_interpreter", "computer",
        "computer_use_preview", "image_generation", "mcp", "local_shell", "shell",
        "apply_patch", "tool_search", "programmatic_tool_calling", "custom",
    }
)  # fmt: skip


class HostedTool(BaseModel):
    """A hosted tool, with whatever fields its type has (its type is what is refused)."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(kind, str) and kind in HOSTED_TOOLS:
        return "tool:hosted"
    return "tool:namespace" if kind == "namespace" else "tool:function"


Tool = Annotated[
    Annotated[FunctionTool, Tag("tool:function")]
    | Annotated[NamespaceTool, Tag("tool:namespace")]
    | Annotated[HostedTool, Tag("tool:hosted")],
    Discriminator(_tool_kind),
]


class ToolChoiceFunction(Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)
    namespace: str | None = None
    """The function's namespace, for a function of a namespace tool."""


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """Refused when set (as chat's ``verbosity``): no model here adjusts its length to it."""


#: The ``include`` values the gateway fills: log probabilities, and a reasoning model's
#: reasoning sealed for a stateless client to send back (``gateway.serving.responses.sealing``).
LOGPROBS = "message.output_text.logprobs"
ENCRYPTED_REASONING = "reasoning.encrypted_content"
#: Input images' URLs are always kept in the items (nothing to add for it).
INPUT_IMAGES = "message.input_image.image_url"
INCLUDABLE = (LOGPROBS, ENCRYPTED_REASONING, INPUT_IMAGES)
#: OpenAI's bounds on ``metadata``: 16 pairs, keys of 64 characters, values of 512.
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]
#: A ``client_metadata`` value: never stored, so longer (Codex sends a turn's metadata as
#: JSON of some 750 characters); 32 of them at most.
ClientMetadataValue = Annotated[str, Field(max_length=8192)]


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None
    """Nothing here pads events: ``false`` is honoured, ``true`` refused."""


class ImageOptions(Strict):
    """``image``: how input images are kept in the context (a hint: accepted metadata)."""

    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class BackgroundOptions(Strict):
    """``background_options``: any ``completion_window`` is met (a background response
    runs at once); ``continuation_id`` is refused."""

    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = Field(None, max_length=256)


#: Official Responses parameters the gateway does not implement, and why: refused when set.
RESPONSES_REFUSED = {
    "context_management": "no context compaction runs here (truncation 'auto' drops the "
    "oldest items instead)",
    "moderation": "no moderation model runs here",
}


class ResponsesRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    """Honoured by keeping the first calls of the answer (OpenAI: further calls are
    ignored)."""
    text: TextConfig | None = None
    include: list[str] | None = Field(None, max_length=32)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: Literal["auto", "disabled"] | None = None
    """``auto``: the oldest items are dropped until the input fits the model's context
    (:mod:`gateway.serving.responses.truncation`)."""
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
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
    service_tier: ResponsesServiceTier | None = None
    priority: Priority | None = None
    """vLLM's scheduling priority (lower first; see ``docs/scheduling.md``)."""
    # Caching hints (accepted metadata: the engine's prefix cache keeps what it keeps).
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: CacheOptions | None = None
    client_metadata: dict[MetadataKey, ClientMetadataValue] | None = Field(
        None, max_length=32, exclude=True
    )
    """Telemetry ids of the client (Codex sends its session and turn ids): not in
    openai-python's types, accepted by OpenAI; put on the request's trace span, never
    stored or echoed."""
    access_programs: dict[str, str] | None = Field(None, max_length=8)
    """OpenAI's access programs (its own account checks): accepted metadata."""
    image: ImageOptions | None = None
    background_options: BackgroundOptions | None = None
    # Declared so that setting one gets its reason (see RESPONSES_REFUSED).
    context_management: Any = None
    moderation: Any = None

    def wants_logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    def wants_encrypted_reasoning(self) -> bool:
        return ENCRYPTED_REASONING in (self.include or [])

    def unsupported(self) -> tuple[str, str] | None:
        for param, why in RESPONSES_REFUSED.items():
            if getattr(self, param) is not None:
                return param, f"{param} is not supported by this gateway: {why}."
        if self.prompt is not None:
            return "prompt", "Prompt templates are not supported; send input and instructions."
        reasoning = self.reasoning
        if reasoning is not None and reasoning.context not in (None, "auto"):
            return "reasoning.context", (
                "Which earlier reasoning the model sees is its chat template's choice here; "
                "only 'auto' is taken."
            )
        if reasoning is not None and reasoning.mode not in (None, "standard"):
            return "reasoning.mode", "Only the 'standard' reasoning mode runs here."
        for index, value in enumerate(self.include or []):
            if value not in INCLUDABLE:
                return f"include[{index}]", (
                    f"include '{value}' is not supported: it names the output of a hosted "
                    f"tool this gateway does not run (it fills {', '.join(INCLUDABLE)})."
                )
        problem = stream_options_problem(self.stream, self.stream_options)
        if problem is not None:
            return problem
        if self.text is not None and self.text.verbosity is not None:
            return "text.verbosity", (
                "text.verbosity is not supported by this gateway: no model here adjusts its "
                "length to it."
            )
        options = self.background_options
        if options is not None and options.continuation_id is not None:
            return "background_options.continuation_id", (
                "Continuing a background response by id is not supported here."
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
    tool_names: ToolNames = field(default_factory=lambda: _tool_names())
    """The request's namespaced functions (how their calls are reported)."""
    seal: Callable[[str], str] | None = None
    """Seals the reasoning as ``encrypted_content``, when the request includes it."""
    truncated: int = 0
    """Messages ``truncation: "auto"`` left out (oldest first) so the input fits."""

    def sealed(self, reasoning: str) -> str | None:
        """``reasoning`` sealed as ``encrypted_content`` (None unless it was asked for)."""
        return self.seal(reasoning) if self.seal is not None else None

    hold: Hold | None = None
    """The room held in the key's stored bytes for its record (with ``store``), until it is
    saved or given back."""
    conversation: ConversationTurn | None = None
    """The conversation it continues (``conversation=``), which its input and output join
    when it is done."""
