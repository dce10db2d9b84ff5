"""A session's conversation: its items in order; the messages a client sends (an item to
add, a response's ``input``) checked and their audio decoded; the events that read and
change the items (delete, retrieve, truncate); and their bounds, past which the oldest
items are dropped as OpenAI truncates a full conversation. Adding an item that starts a
transcription is the session's (:meth:`RealtimeSession._item_create`), as it queues
work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol

from gateway.serving.realtime.buffer import Audio, _b64, _check_seconds, _pcm_to_stt
from gateway.serving.realtime.events import (
    _PART_FIELDS,
    _ROLE_PARTS,
    MAX_ITEM_ID_CHARS,
    Bounds,
    ClientEventError,
    Item,
    _fields,
    _id,
    _object,
    _string,
    _unsupported,
)


class Emit(Protocol):
    """Sends a server event of type ``kind`` with ``fields`` (the session's ``emit``)."""

    def __call__(self, kind: str, **fields: Any) -> Awaitable[None]: ...


class Conversation:
    """The items of one session's conversation, in order, and what changes them."""

    def __init__(self, bounds: Bounds, emit: Emit) -> None:
        self.bounds = bounds
        self.emit = emit
        self.items: list[Item] = []

    async def _parse_item(self, spec: dict[str, Any], param: str) -> tuple[Item, Audio | None]:
        """A message a client sent (an item to add, or one of a response's ``input``) and
        the audio of its ``input_audio`` part, decoded (in a worker thread)."""
        kind = spec.get("type", "message")
        if kind != "message":
            raise _unsupported(
                f"{param}.type", f"Items of type '{kind}' are not supported; send messages."
            )
        _fields(spec, param, {"type", "id", "object", "role", "status", "content"})
        item_id = spec.get("id") or _id("item")
        if not isinstance(item_id, str) or len(item_id) > MAX_ITEM_ID_CHARS:
            raise ClientEventError(
                f"id must be a string of at most {MAX_ITEM_ID_CHARS} characters.",
                param=f"{param}.id",
            )
        role = spec.get("role")
        if role not in _ROLE_PARTS:
            raise ClientEventError(
                "role must be 'user', 'assistant' or 'system'.", param=f"{param}.role"
            )
        content = spec.get("content")
        if not isinstance(content, list) or not content:
            raise ClientEventError("content must be a non-empty list.", param=f"{param}.content")
        parts: list[dict[str, Any]] = []
        audio: Audio | None = None
        allowed = _ROLE_PARTS[role]
        for index, part in enumerate(content):
            where = f"{param}.content[{index}]"
            part = _object(part, where)
            kind = part.get("type")
            if kind not in allowed:
                raise ClientEventError(
                    f"A {role} message takes parts of type {' or '.join(allowed)}.",
                    param=f"{where}.type",
                )
            _fields(part, where, _PART_FIELDS[kind])
            if kind in ("input_text", "output_text"):
                text = _string(part.get("text"), f"{where}.text", empty=True)
                parts.append({"type": kind, "text": text})
                continue
            if part.get("audio") is not None:
                if kind == "output_audio":
                    raise _unsupported(
                        f"{where}.audio",
                        "An assistant message's audio cannot be added (as in OpenAI's API); "
                        "send its transcript.",
                    )
                if audio is not None:
                    raise ClientEventError(
                        "A message takes one input_audio part.", param=f"{param}.content"
                    )
                audio = await asyncio.to_thread(self._decode, part["audio"], f"{where}.audio")
                parts.append({"type": kind, "transcript": None})
                continue
            transcript = _string(part.get("transcript"), f"{where}.transcript", empty=True)
            parts.append({"type": kind, "transcript": transcript})
        item = Item(item_id, role, parts)
        limit = self.bounds.text_bytes
        if item.size > limit:
            raise ClientEventError(
                f"The item holds {item.size:,} bytes of text; at most {limit:,} are allowed "
                "(GATEWAY_MAX_STORED_KB).",
                param=f"{param}.content",
                code="string_above_max_length",
            )
        return item, audio

    def _decode(self, data: object, param: str) -> Audio:
        """An ``input_audio`` part's audio, as 16 kHz samples (CPU work: run in a thread)."""
        pcm = _b64(data, param)
        _check_seconds(len(pcm), self.bounds, param)
        return _pcm_to_stt(pcm)

    def _index(self, item_id: object, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == item_id:
                return index
        raise ClientEventError(
            f"Item with item_id '{item_id}' not found.", param=param, code="item_not_found"
        )

    async def _keep_bounded(self) -> None:
        """Drops the oldest items past :attr:`Bounds.items` items or
        :attr:`Bounds.text_bytes` of text, as OpenAI truncates a full conversation."""
        bounds = self.bounds
        while len(self.items) > bounds.items or (
            len(self.items) > 1 and sum(item.size for item in self.items) > bounds.text_bytes
        ):
            item = self.items.pop(0)
            await self.emit("conversation.item.deleted", item_id=item.id)

    async def _item_delete(self, event: dict[str, Any]) -> None:
        index = self._index(event.get("item_id"), "item_id")
        item = self.items.pop(index)
        await self.emit("conversation.item.deleted", item_id=item.id)

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item = self.items[self._index(event.get("item_id"), "item_id")]
        await self.emit("conversation.item.retrieved", item=item.to_json())

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        item = self.items[self._index(event.get("item_id"), "item_id")]
        end_ms = event.get("audio_end_ms")
        if item.role != "assistant" or not item.spoken:
            raise ClientEventError(
                "Only an assistant message with audio can be truncated.", param="item_id"
            )
        if event.get("content_index", 0) != 0:
            raise ClientEventError(
                "content_index must be 0: an answer has one audio part.", param="content_index"
            )
        if not isinstance(end_ms, int) or end_ms < 0:
            raise ClientEventError(
                "audio_end_ms must be a non-negative integer.", param="audio_end_ms"
            )
        heard = [sentence for start, sentence in item.spoken if start < end_ms]
        item.spoken = item.spoken[: len(heard)]
        item.content = [{"type": "output_audio", "transcript": " ".join(heard)}]
        await self.emit(
            "conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end_ms
        )

    async def _inputs(self, value: object) -> list[tuple[Item, Audio | None]]:
        """A response's ``input``: messages, and references to items of the conversation."""
        if not isinstance(value, list):
            raise ClientEventError("input must be a list of items.", param="response.input")
        limit = self.bounds.items
        if len(value) > limit:
            raise ClientEventError(
                f"input has {len(value)} items; at most {limit} are allowed "
                "(GATEWAY_REALTIME_MAX_ITEMS).",
                param="response.input",
            )
        inputs: list[tuple[Item, Audio | None]] = []
        for index, entry in enumerate(value):
            param = f"response.input[{index}]"
            spec = _object(entry, param)
            if spec.get("type") == "item_reference":
                _fields(spec, param, {"type", "id"})
                inputs.append((self.items[self._index(spec.get("id"), f"{param}.id")], None))
            else:
                inputs.append(await self._parse_item(spec, param))
        return inputs
