"""What a session holds: conversation items (:class:`Item`), the bounds on what a client
can make a session hold (:class:`Bounds`), and the models a session uses, as a key must
allow them (:data:`Use`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config import Settings
from gateway.serving.json_shape import JsonLimits
from gateway.state.keys import ApiKey


@dataclass(frozen=True)
class Bounds:
    """What a client can make one session hold (README "Limits"). An event past a bound is
    refused with an ``error`` event naming it, and the session stays as it was; past
    ``items`` and ``text_bytes`` the oldest items are dropped instead."""

    buffer_bytes: int
    """The input audio buffer, as the pcm16 the client sent (``realtime_max_buffer_mb``)."""
    audio_seconds: float
    """The audio of one turn: the buffer, or an ``input_audio`` part (``max_audio_seconds``)."""
    items: int
    """Conversation items kept; past it the oldest are dropped (``realtime_max_items``)."""
    text_bytes: int
    """Text kept (``max_stored_kb``): instructions, a transcription prompt, one item; and
    all items together (past it the oldest are dropped)."""
    message_bytes: int
    """One client event (``realtime_max_message_mb``; uvicorn refuses larger ones first)."""
    tools_bytes: int = 512 * 1024
    """A session's or a response's tools, as JSON (``max_tools_kb``, as a chat request)."""
    json_limits: JsonLimits = field(default_factory=JsonLimits.defaults)
    """What a client event's JSON may hold (``max_json_depth``, ``max_json_containers``,
    ``max_json_values``, as a request body), measured before it is parsed."""

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        mb = 1024 * 1024
        return cls(
            buffer_bytes=int(settings.realtime_max_buffer_mb * mb),
            audio_seconds=settings.max_audio_seconds,
            items=settings.realtime_max_items,
            text_bytes=settings.max_stored_kb * 1024,
            message_bytes=int(settings.realtime_max_message_mb * mb),
            tools_bytes=settings.max_tools_kb * 1024,
            json_limits=JsonLimits.from_settings(settings),
        )


@dataclass
class Item:
    """A conversation item: a message with its parts (the audio itself is not kept), a
    function call the model made, or the output a client sent back for one."""

    id: str
    role: str
    content: list[dict[str, Any]]
    status: str = "completed"
    type: str = "message"
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    spoken: list[tuple[int, str]] = field(default_factory=list)
    """Assistant audio: where each spoken sentence starts (ms) and its text (truncation)."""

    @classmethod
    def call(cls, item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
        return cls(item_id, "assistant", [], status, "function_call", call_id, name, arguments)

    @classmethod
    def call_output(cls, item_id: str, call_id: str, output: str) -> Item:
        return cls(item_id, "tool", [], "completed", "function_call_output", call_id, output=output)

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "object": "realtime.item",
            "status": self.status,
        }
        if self.type == "function_call":
            return shown | {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == "function_call_output":
            return shown | {"call_id": self.call_id, "output": self.output}
        return shown | {"role": self.role, "content": self.content}

    def text(self) -> str:
        """What the chat model sees of it."""
        if self.type == "function_call":
            return self.arguments
        if self.type == "function_call_output":
            return self.output
        parts = []
        for part in self.content:
            text = part.get("text") if part["type"] in ("input_text", "output_text") else None
            if text is None:
                text = part.get("transcript")
            if text:
                parts.append(text)
        return " ".join(parts)

    @property
    def size(self) -> int:
        """Bytes of text it holds (what :attr:`Bounds.text_bytes` counts)."""
        return len(self.text().encode("utf-8")) + len(self.name) + len(self.call_id)

    def audio_part(self) -> int:
        """The index of its ``input_audio`` part (the one a transcript goes into)."""
        return next(i for i, part in enumerate(self.content) if part["type"] == "input_audio")


ANSWERS = "answers in this session"
TRANSCRIBES = "transcribes this session's audio"
SPEAKS = "speaks this session's answers"
#: (model, the parameter that chose it, what it does)
Use = tuple[str, str, str]


def require(key: ApiKey, uses: list[Use]) -> None:
    """403 unless ``key`` may use every model of ``uses``: the models a session uses
    without naming them are checked like the one it names."""
    for model, param, use in uses:
        key.require_model(model, param, use)
