"""The output items a response holds, as typed models: an assistant ``message`` (one
``output_text`` part), a reasoning model's ``reasoning`` (one ``reasoning_text`` part, no
summary) and a ``function_call``, in the shapes of openai-python's ``ResponseOutputMessage``,
``ResponseReasoningItem`` and ``ResponseFunctionToolCall``.

An item is built in its final form by :meth:`done` (or, for a streamed one, first in its
``in_progress`` form by :meth:`opened`, whose content is still empty) and becomes JSON by
:func:`dump`: an optional field that is unset (``encrypted_content``, ``namespace``) is left
out, as OpenAI leaves it out. The stored record, the response object and the events all
carry the dumped form."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from gateway.serving.responses.tools import ToolNames

Status = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []

    @classmethod
    def opened(cls, item_id: str) -> MessageItem:
        return cls(id=item_id, status="in_progress")

    @classmethod
    def done(
        cls,
        item_id: str,
        text: str,
        status: Status,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> MessageItem:
        part = OutputText(text=text, logprobs=logprobs or [])
        return cls(id=item_id, status=status, content=[part])


class ReasoningItem(BaseModel):
    """A reasoning model's reasoning, whole (no summary is made), with the reasoning sealed
    as ``encrypted_content`` when the request asked for it."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    status: Status
    summary: list[dict[str, Any]] = []
    content: list[ReasoningText] = []
    encrypted_content: str | None = None

    @classmethod
    def opened(cls, item_id: str) -> ReasoningItem:
        return cls(id=item_id, status="in_progress")

    @classmethod
    def done(cls, item_id: str, text: str, sealed: str | None = None) -> ReasoningItem:
        part = ReasoningText(text=text)
        return cls(id=item_id, status="completed", content=[part], encrypted_content=sealed)


class FunctionCallItem(BaseModel):
    """A ``function_call``; a namespace's function is reported by its ``name`` and
    ``namespace`` (see :class:`ToolNames`)."""

    id: str
    type: Literal["function_call"] = "function_call"
    status: Status
    call_id: str
    name: str
    namespace: str | None = None
    arguments: str = ""

    @classmethod
    def called(
        cls,
        item_id: str,
        call_id: str,
        chat_name: str,
        arguments: str,
        status: Status,
        names: ToolNames | None = None,
    ) -> FunctionCallItem:
        """The call of ``chat_name``, the function as the model named it."""
        fields = names.item_fields(chat_name) if names is not None else {"name": chat_name}
        return cls(id=item_id, call_id=call_id, arguments=arguments, status=status, **fields)


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


def dump(item: OutputItem) -> dict[str, Any]:
    """The item as JSON: unset optional fields left out."""
    return item.model_dump(exclude_none=True)


def dump_all(items: list[OutputItem]) -> list[dict[str, Any]]:
    return [dump(item) for item in items]
