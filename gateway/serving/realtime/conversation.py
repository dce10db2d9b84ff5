"""A session's conversation: its items in order; the items a client sends (an item to
add, a response's ``input``) made from their parsed form, their audio decoded; what reads
and changes the items (delete, retrieve, truncate); and their bounds, past which the
oldest items are dropped as OpenAI truncates a full conversation."""

from __future__ import annotations

import asyncio

from gateway.serving.realtime.buffer import Audio, ClientAudio, check_seconds, pcm_to_stt
from gateway.serving.realtime.context import Emit
from gateway.serving.realtime.items import Bounds, Item
from gateway.serving.realtime.protocol import ClientEventError, new_id, unsupported
from gateway.serving.realtime.specs import (
    AudioPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    ItemReference,
    MessageItem,
)

_ROLE_PARTS = {
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}
#: An item a client sends, parsed (a message, a function call, a function call's output).
ItemSpec = MessageItem | FunctionCallItem | FunctionCallOutputItem


class Conversation:
    """The items of one session's conversation, in order, and what changes them."""

    def __init__(self, bounds: Bounds, emit: Emit) -> None:
        self.bounds = bounds
        self.emit = emit
        self.items: list[Item] = []

    async def item(
        self, spec: ItemSpec, param: str, input_format: str
    ) -> tuple[Item, Audio | None]:
        """A client's item (to add, or one of a response's ``input``) and the audio of its
        ``input_audio`` part, in ``input_format``, decoded (in a worker thread)."""
        item_id = spec.id or new_id("item")
        if isinstance(spec, FunctionCallItem):
            item = Item.call(item_id, spec.call_id, spec.name, spec.arguments, "completed")
            return self._bounded(item, param), None
        if isinstance(spec, FunctionCallOutputItem):
            return self._bounded(Item.call_output(item_id, spec.call_id, spec.output), param), None
        parts: list[dict[str, str | None]] = []
        audio: Audio | None = None
        allowed = _ROLE_PARTS[spec.role]
        for index, part in enumerate(spec.content):
            where = f"{param}.content[{index}]"
            if part.type not in allowed:
                raise ClientEventError(
                    f"A {spec.role} message takes parts of type {' or '.join(allowed)}.",
                    param=f"{where}.type",
                )
            if not isinstance(part, AudioPart):
                parts.append({"type": part.type, "text": part.text or ""})
            elif part.audio is not None:
                if part.type == "output_audio":
                    raise unsupported(
                        f"{where}.audio",
                        "An assistant message's audio cannot be added (as in OpenAI's API); "
                        "send its transcript.",
                    )
                if audio is not None:
                    raise ClientEventError(
                        "A message takes one input_audio part.", param=f"{param}.content"
                    )
                audio = await asyncio.to_thread(
                    self._decode, part.audio, f"{where}.audio", input_format
                )
                parts.append({"type": part.type, "transcript": None})
            else:
                parts.append({"type": part.type, "transcript": part.transcript or ""})
        return self._bounded(Item(item_id, spec.role, parts), param), audio

    def _bounded(self, item: Item, param: str) -> Item:
        limit = self.bounds.text_bytes
        if item.size > limit:
            raise ClientEventError(
                f"The item holds {item.size:,} bytes of text; at most {limit:,} are allowed "
                "(GATEWAY_MAX_STORED_KB).",
                param=f"{param}.content" if item.type == "message" else param,
                code="string_above_max_length",
            )
        return item

    def _decode(self, data: str, param: str, input_format: str) -> Audio:
        """An ``input_audio`` part's audio, as 16 kHz samples (CPU work: run in a thread)."""
        client = ClientAudio(input_format)
        size, most = client.pcm16_bytes(len(data)), self.bounds.buffer_bytes
        check_seconds(size, self.bounds, param)
        if size > most:  # as much as the input audio buffer holds, checked undecoded
            raise ClientEventError(
                f"{param} would be {size:,} bytes of 24 kHz pcm16; at most {most:,} are "
                "taken (GATEWAY_REALTIME_MAX_BUFFER_MB).",
                param=param,
                code="audio_too_long",
            )
        pcm = client.pcm16(data, param)
        return pcm_to_stt(pcm)

    def index(self, item_id: str, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == item_id:
                return index
        raise ClientEventError(
            f"Item with item_id '{item_id}' not found.", param=param, code="item_not_found"
        )

    def get(self, item_id: str, param: str) -> Item:
        return self.items[self.index(item_id, param)]

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    async def append(self, item: Item) -> None:
        """Adds an item the session made (a turn's, an answer's) at the end, and says so."""
        await self.insert(item, len(self.items))

    async def insert(self, item: Item, position: int) -> None:
        """Adds ``item`` at ``position`` and says so (``conversation.item.added``)."""
        previous = self.items[position - 1].id if position else None
        self.items.insert(position, item)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=previous)

    async def keep_bounded(self) -> None:
        """Drops the oldest items past :attr:`Bounds.items` items or
        :attr:`Bounds.text_bytes` of text, as OpenAI truncates a full conversation."""
        bounds = self.bounds
        while len(self.items) > bounds.items or (
            len(self.items) > 1 and sum(item.size for item in self.items) > bounds.text_bytes
        ):
            item = self.items.pop(0)
            await self.emit("conversation.item.deleted", item_id=item.id)

    async def delete(self, item_id: str) -> None:
        item = self.items.pop(self.index(item_id, "item_id"))
        await self.emit("conversation.item.deleted", item_id=item.id)

    async def retrieve(self, item_id: str) -> None:
        await self.emit("conversation.item.retrieved", item=self.get(item_id, "item_id").to_json())

    async def truncate(self, item_id: str, content_index: int, end_ms: int) -> None:
        item = self.get(item_id, "item_id")
        if item.role != "assistant" or not item.spoken:
            raise ClientEventError(
                "Only an assistant message with audio can be truncated.", param="item_id"
            )
        if content_index != 0:
            raise ClientEventError(
                "content_index must be 0: an answer has one audio part.", param="content_index"
            )
        heard = [sentence for start, sentence in item.spoken if start < end_ms]
        item.spoken = item.spoken[: len(heard)]
        item.content = [{"type": "output_audio", "transcript": " ".join(heard)}]
        await self.emit(
            "conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end_ms
        )

    async def inputs(
        self, specs: list[ItemSpec | ItemReference], input_format: str
    ) -> list[tuple[Item, Audio | None]]:
        """A response's ``input``: items, and references to items of the conversation."""
        limit = self.bounds.items
        if len(specs) > limit:
            raise ClientEventError(
                f"input has {len(specs)} items; at most {limit} are allowed "
                "(GATEWAY_REALTIME_MAX_ITEMS).",
                param="response.input",
            )
        inputs: list[tuple[Item, Audio | None]] = []
        for index, spec in enumerate(specs):
            param = f"response.input[{index}]"
            if isinstance(spec, ItemReference):
                inputs.append((self.get(spec.id, f"{param}.id"), None))
            else:
                inputs.append(await self.item(spec, param, input_format))
        return inputs
