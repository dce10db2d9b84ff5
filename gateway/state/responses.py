"""Stored responses of ``/v1/responses``: what ``previous_response_id``, ``GET``,
``input_items`` and ``DELETE`` read, kept in Redis so any replica continues any conversation.

A response made with ``store`` (the default) is kept under the key that made it, for
``responses_ttl_s`` seconds. Its record holds the public response object, the request's own
input items (with ids) and the whole conversation up to and including this response's
output, as chat messages: continuing it is one Redis read, however long the chain. Another
key's response does not exist for a caller, exactly as an unknown id (404); ids carry 192
random bits.
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.errors import NotFoundError
from gateway.state.store import PREFIX, needs_store


def new_id(prefix: str) -> str:
    """An unguessable OpenAI-style id: ``resp_``, ``msg_``, ``fc_`` and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


class StoredResponse(BaseModel):
    owner: str
    response: dict[str, Any]
    """The response object as the API returns it."""
    input_items: list[dict[str, Any]]
    """This request's input items, with ids, in order."""
    messages: list[dict[str, Any]]
    """The conversation up to and including this response's output (chat messages;
    ``instructions`` are not carried over, as with OpenAI)."""


def not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")


class ResponseStore:
    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s

    @staticmethod
    def _key(owner: str, response_id: str) -> str:
        return f"{PREFIX}response:{owner}:{response_id}"

    @needs_store
    async def save(self, stored: StoredResponse) -> None:
        key = self._key(stored.owner, str(stored.response["id"]))
        await self.redis.set(key, stored.model_dump_json(), ex=self.ttl_s)

    @needs_store
    async def get(self, owner: str, response_id: str) -> StoredResponse:
        """The caller's stored response, or a 404."""
        raw = await self.redis.get(self._key(owner, response_id))
        if raw is None:
            raise not_found(response_id)
        return StoredResponse.model_validate_json(raw)

    @needs_store
    async def delete(self, owner: str, response_id: str) -> None:
        if not await self.redis.delete(self._key(owner, response_id)):
            raise not_found(response_id)
