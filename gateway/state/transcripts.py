"""The transcripts of spoken chat answers, by their audio id, under the key that asked for
them: a later request may send ``{"role": "assistant", "audio": {"id"}}`` to stand for the
answer's text. Kept for ``GATEWAY_AUDIO_TTL_S``; one key cannot read another's."""

from __future__ import annotations

from redis.asyncio import Redis

from gateway.state.redis import PREFIX, needs_store


def transcript_key(owner: str, audio_id: str) -> str:
    return f"{PREFIX}audio:{{{owner}}}:{audio_id}"


class TranscriptStore:
    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        """How long an answer's audio id can be referred to (its ``expires_at``)."""

    @needs_store
    async def save(self, owner: str, audio_id: str, transcript: str) -> None:
        await self.redis.set(transcript_key(owner, audio_id), transcript, ex=self.ttl_s)

    @needs_store
    async def get(self, owner: str, audio_id: str) -> str | None:
        """``owner``'s transcript of ``audio_id``; None when unknown or expired."""
        transcript = await self.redis.get(transcript_key(owner, audio_id))
        return None if transcript is None else str(transcript)
