"""A chat choice read: what one generated whole became (:class:`Answer`), its
``finish_reason``, its calls as OpenAI's ``tool_calls`` (or legacy ``function_call``), and
the state of one streamed choice (:class:`ChoiceState`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.backend import TokenLogprob
from gateway.serving.protocol import ChatCompletionChoice, FunctionCall, ToolCall
from gateway.serving.reasoning_parsers import ReasoningParser, ReasoningTokens
from gateway.serving.tool_parsers import ParsedCall, ToolCallDelta
from gateway.serving.tools import ToolPlan


def finish_reason(backend_reason: str, calls: int, plan: ToolPlan | None) -> str:
    """The choice's ``finish_reason``: a call the request named (``tool_choice`` or
    ``function_call`` naming a function) ends with ``stop``, as OpenAI answers; calls the
    model chose (``auto``, ``required``) with ``tool_calls`` (``function_call`` for legacy
    functions)."""
    if not calls or backend_reason != "stop" or (plan is not None and plan.mode == "named"):
        return backend_reason
    return "function_call" if plan is not None and plan.legacy else "tool_calls"


def tool_calls_of(calls: list[ParsedCall]) -> list[ToolCall]:
    return [
        ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ]


def legacy_choice(choice: ChatCompletionChoice) -> ChatCompletionChoice:
    """A choice in the shape of legacy function calling: its one call as ``function_call``."""
    message = choice.message
    if message.tool_calls:
        message.function_call, message.tool_calls = message.tool_calls[0].function, None
    return choice


def call_delta(pieces: list[ToolCallDelta], legacy: bool) -> dict[str, Any]:
    """The ``delta`` that sends ``pieces`` of calls: ``tool_calls``, or for legacy
    ``functions`` the one call's ``function_call``."""
    if legacy:
        function: dict[str, str] = {"arguments": ""}
        for piece in pieces:
            if piece.id is not None:
                function["name"] = piece.name or ""
            function["arguments"] += piece.arguments
        return {"function_call": function}
    calls = []
    for piece in pieces:
        if piece.id is not None:
            calls.append(
                {
                    "index": piece.index,
                    "id": piece.id,
                    "type": "function",
                    "function": {"name": piece.name, "arguments": piece.arguments},
                }
            )
        else:
            calls.append({"index": piece.index, "function": {"arguments": piece.arguments}})
    return {"tool_calls": calls}


@dataclass
class Answer:
    """One choice generated whole, read (:meth:`ChatService.answer`)."""

    content: str | None
    finish_reason: str
    reasoning: str | None = None
    calls: list[ParsedCall] = field(default_factory=list)


#: What a session does not store of an answer: the next turn's template gets its content
#: and calls (templates of reasoning models leave earlier reasoning out).
UNSTORED = {"refusal", "reasoning_content", "reasoning"}


def in_text(at: int | None, reasoner: ReasoningParser | None) -> int | None:
    """A position in a reasoning model's answer as one in its whole text."""
    if at is None or reasoner is None:
        return at
    return at + (reasoner.content_at or 0)


@dataclass
class ChoiceState:
    """One streamed choice: its parsers and what it has told so far."""

    parser: Any
    reasoner: ReasoningParser | None = None
    reasoning_tokens: ReasoningTokens = field(default_factory=ReasoningTokens)
    finish: str | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    calls: list[ParsedCall] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    """The text sent as content (with tools: what the parser left as text)."""
    text: list[str] = field(default_factory=list)
    """With tools: all the text generated (where strict arguments start again), the
    reasoning included."""
    ended: bool = False
    """Its last chunk was sent (the parser may end it before the model does)."""
