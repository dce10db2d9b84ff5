"""The transcripts of spoken chat answers, by their audio id, under the key that asked for
them: a later request may send ``{"role": "assistant", "audio": {"id"}}`` to stand for the
answer's text. Kept for ``GATEWAY_AUDIO_TTL_S``; one key cannot read another's. Each counts
towards its key's stored bytes (:mod:`gateway.state.stored_bytes`), never refused: it is
the text of an answer the key already paid for and heard."""

from __future__ import annotations

import contextlib

from redis.asyncio import Redis

from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import StoredBytes


def transcript_key(owner: str, audio_id: str) -> str:
    return f"{PREFIX}audio:{{{owner}}}:{audio_id}"


class TranscriptStore:
    def __init__(self, redis: Redis, ttl_s: int, stored_bytes: StoredBytes | None = None) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        """How long an answer's audio id can be referred to (its ``expires_at``)."""
        self.stored_bytes = stored_bytes or StoredBytes(redis)

    @needs_store
    async def save(self, owner: str, audio_id: str, transcript: str) -> None:
        entry = f"audio:{audio_id}"
        await self.stored_bytes.put(owner, entry, len(transcript.encode()), self.ttl_s, None)
        try:
            await self.redis.set(transcript_key(owner, audio_id), transcript, ex=self.ttl_s)
        except BaseException:
            with contextlib.suppress(Exception):  # counted until its TTL at worst
                await self.stored_bytes.drop(owner, entry)
            raise

    @needs_store
    async def get(self, owner: str, audio_id: str) -> str | None:
        """``owner``'s transcript of ``audio_id``; None when unknown or expired."""
        transcript = await self.redis.get(transcript_key(owner, audio_id))
        return None if transcript is None else str(transcript)
