"""Stored responses of ``/v1/responses``: what ``previous_response_id``, ``GET``,
``input_items`` and ``DELETE`` read, kept in Redis so any replica continues any conversation.

A response made with ``store`` (the default) is kept under the key that made it, for
``responses_ttl_s`` seconds. Its record holds the public response object, the conversation
it answered as input items (with ids: what ``input_items`` lists) and the whole
conversation up to and including this response's output, as chat messages: listing or
continuing it is one Redis read, however long the chain, and deleting an earlier response
of the chain changes neither. Another key's response does not exist for a caller, exactly
as an unknown id (404); ids carry 192 random bits.

A record is at most ``max_stored_kb`` KB of JSON: a larger one is refused with a 400 naming
``store`` and is not written at all. Records count towards the key's (and its project's)
stored bytes (:mod:`gateway.state.stored_bytes`): :meth:`ResponseStore.hold` takes the room a
record needs before anything is generated (403 ``storage_quota_exceeded`` past a quota),
:meth:`ResponseStore.save` counts what it really takes, :meth:`ResponseStore.delete` gives
it back.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.config import Settings
from gateway.errors import NotFoundError
from gateway.state.item_index import ItemIndex, entry_bytes
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import Hold, StoredBytes, bounded_json

#: The default of ``settings.max_stored_kb``, for a store given no bound.
DEFAULT_MAX_STORED_KB: int = Settings.model_fields["max_stored_kb"].default


def new_id(prefix: str) -> str:
    """An unguessable OpenAI-style id: ``resp_``, ``msg_``, ``fc_`` and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


class StoredResponse(BaseModel):
    owner: str
    response: dict[str, Any]
    """The response object as the API returns it."""
    input_items: list[dict[str, Any]]
    """The conversation the response answered, as items with ids, oldest first: the
    previous response's input items and output, then the request's own input items."""
    messages: list[dict[str, Any]]
    """The conversation up to and including this response's output (chat messages;
    ``instructions`` are not carried over, as with OpenAI)."""
    root: str | None = None
    """The first response of its ``previous_response_id`` chain: the key that keeps the
    chain's requests on one Triton server (None in records stored before it was kept:
    their own id stands for it)."""


def not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")


class ResponseStore:
    def __init__(
        self,
        redis: Redis,
        ttl_s: int,
        max_stored_kb: int = DEFAULT_MAX_STORED_KB,
        stored_bytes: StoredBytes | None = None,
    ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.max_stored_kb = max_stored_kb
        self.stored_bytes = stored_bytes or StoredBytes(redis)

    @staticmethod
    def _key(owner: str, response_id: str) -> str:
        return f"{PREFIX}response:{owner}:{response_id}"

    @staticmethod
    def _entry(response_id: str) -> str:
        return f"response:{response_id}"

    def encode(self, stored: StoredResponse) -> str:
        """The record as it is stored, or a 400 naming ``store`` when it is larger than
        ``max_stored_kb``."""
        return bounded_json(
            stored,
            self.max_stored_kb,
            "store",
            "Stored with its input, the conversation before it and its output, this response is",
            "Send a shorter input, or store: false.",
        )

    async def hold(self, stored: StoredResponse) -> Hold:
        """Holds the room ``stored`` (the record as known before generating) takes in its
        key's and project's stored bytes; 503 ``store_full`` when Redis has no room left
        for stored records, 403 ``storage_quota_exceeded`` past a quota."""
        entry = self._entry(str(stored.response["id"]))
        # With the index entries of its items (gateway/state/item_index.py), counted
        # when it is saved: a quota is checked against both.
        ids = [str(item["id"]) for item in stored.input_items if item.get("id")]
        size = len(self.encode(stored).encode()) + entry_bytes(stored.owner, entry, ids)
        return await self.stored_bytes.hold(stored.owner, entry, size, "store", "send store: false")

    async def release(self, hold: Hold | None) -> None:
        """Gives back the room held for a response that will not be stored."""
        await self.stored_bytes.release(hold)

    @needs_store
    async def save(self, stored: StoredResponse, hold: Hold | None = None) -> None:
        """Stores the record whole, or nothing (a 400 when it is too large), counting it in
        place of ``hold``. Not refused for a quota: the room was checked by :meth:`hold`."""
        response_id = str(stored.response["id"])
        raw = self.encode(stored)
        entry = self._entry(response_id)
        await self.stored_bytes.put(stored.owner, entry, len(raw.encode()), self.ttl_s, hold)
        try:
            await self.redis.set(self._key(stored.owner, response_id), raw, ex=self.ttl_s)
        except BaseException:
            with contextlib.suppress(Exception):  # counted until its TTL at worst
                await self.stored_bytes.drop(stored.owner, entry)
            raise
        # Its items, for item_reference (gateway/state/item_index.py).
        items = [*stored.input_items, *stored.response["output"]]
        await ItemIndex(self.redis, self.stored_bytes).add_response(
            stored.owner, entry, items, self.ttl_s
        )

    @needs_store
    async def get(self, owner: str, response_id: str) -> StoredResponse:
        """The caller's stored response, or a 404."""
        raw = await self.redis.get(self._key(owner, response_id))
        if raw is None:
            raise not_found(response_id)
        return StoredResponse.model_validate_json(raw)

    @needs_store
    async def delete(self, owner: str, response_id: str) -> None:
        """Deletes the caller's stored response (a 404 when there is none) and gives back
        the bytes it took."""
        if not await self.redis.delete(self._key(owner, response_id)):
            raise not_found(response_id)
        await self.stored_bytes.drop(owner, self._entry(response_id))
