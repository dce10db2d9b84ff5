"""Chat sessions: a conversation kept in Redis so that a client sends only its new message.

A chat request with ``X-Session-ID: <id>`` continues the session: the stored messages come
before the request's, then the new messages and the assistant's reply are stored as one
turn (only when the reply finished: a failed or abandoned request leaves the session as it
was). Sessions live in each key's own namespace: another key's session of the same id does
not exist for it (404), and using that id starts a session of its own.
It expires ``session_ttl_s`` after its last use, lives in Redis, and so continues through
any gateway process and after a restart.

The oldest turns are dropped to fit the model's context length. Token counts are estimated
without the model's tokenizer, erring long (a token per 3 bytes of text; the reply's count
is the model's own), and room is kept for the reply (``max_tokens``, or a quarter of the
context, at most 1,024 tokens).

A session is at most ``max_stored_kb`` KB of JSON: the oldest turns are dropped to keep it
so, and a turn that does not fit even alone is a 400 naming ``messages``: from :func:`plan`
before generating when its messages alone are too large (given the store's bound), else
from :meth:`SessionStore.save_turn`, which then writes nothing.

A system (or developer) message in a request becomes the session's system message; a request
without one keeps the stored one.

Sessions count towards their key's (and its project's) stored bytes
(:mod:`gateway.state.stored_bytes`): :meth:`SessionStore.open` refuses, before anything is
generated, a key with no room left (403 ``storage_quota_exceeded``, or 503 ``store_full``
when Redis has none for stored records); the saved turn counts what the session takes now,
and a deleted session gives it back.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import WatchError

from gateway.config import Settings
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import StoredBytes

#: The default of ``settings.max_stored_kb``, for a store given no bound.
DEFAULT_MAX_STORED_KB: int = Settings.model_fields["max_stored_kb"].default

_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_PER_MESSAGE = 4  # the chat template's tokens around a message
DEFAULT_CONTEXT = 4096  # for models whose config states no context length


class Message(BaseModel):
    """A stored message, in the OpenAI request's terms (tool calls and results included)."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Turn(BaseModel):
    """A request's messages and the reply, with their estimated size in tokens."""

    messages: list[Message]
    tokens: int


class Session(BaseModel):
    id: str
    owner: str
    created_at: int
    updated_at: int
    system: str | None = None
    turns: list[Turn] = []

    @classmethod
    def new(cls, session_id: str, owner: str) -> Session:
        now = int(time.time())
        return cls(id=session_id, owner=owner, created_at=now, updated_at=now)

    def public(self) -> dict[str, object]:
        """The session as ``GET /v1/sessions/{id}`` shows it."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages += [m.public() for turn in self.turns for m in turn.messages]
        return {
            "id": self.id,
            "object": "chat.session",
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "messages": messages,
        }


def estimate_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8")) // 3) + _PER_MESSAGE


def message_tokens(message: dict[str, Any]) -> int:
    """A message's estimated size: its content, and its tool calls as JSON."""
    calls = message.get("tool_calls")
    return estimate_tokens(message.get("content") or "") + (
        estimate_tokens(json.dumps(calls)) if calls else 0
    )


@dataclass(frozen=True)
class SessionPlan:
    """How one request continues a session: what goes into the prompt, and what to store
    once the reply is complete."""

    session_id: str
    owner: str
    system: str | None
    dropped: int
    """How many of the oldest stored turns no longer fit (they are deleted on save)."""
    history: list[dict[str, Any]]
    new: list[dict[str, Any]]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every message of the prompt, in order."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, *self.new]


def check_id(session_id: str) -> str:
    if not _ID.fullmatch(session_id):
        raise InvalidRequestError(
            "X-Session-ID must be 1 to 128 characters: letters, digits, '.', '_', ':' or '-'.",
            param="X-Session-ID",
            code="invalid_session_id",
        )
    return session_id


def _json_size(record: BaseModel) -> int:
    return len(record.model_dump_json().encode())


def _oldest_to_drop(shell: Session, turns: list[Turn], max_stored_kb: int) -> int:
    """How many of the oldest ``turns`` must go for ``shell`` holding the others to be at
    most ``max_stored_kb`` KB of JSON; a 400 when the newest one does not fit alone."""
    sizes = [_json_size(turn) for turn in turns]
    size = _json_size(shell) + sum(sizes) + len(sizes) - 1  # the commas between turns
    dropped = 0
    while size > max_stored_kb * 1024:
        if dropped == len(sizes) - 1:
            raise InvalidRequestError(
                f"The session's newest turn alone, with the system message, is {size:,} bytes "
                f"of JSON; a session stores at most {max_stored_kb} KB "
                "(GATEWAY_MAX_STORED_KB). Send shorter messages, or no X-Session-ID.",
                param="messages",
                code="stored_record_too_large",
            )
        size -= sizes[dropped] + 1
        dropped += 1
    return dropped


def plan(
    session: Session,
    messages: list[dict[str, Any]],
    context_length: int | None,
    max_tokens: int | None,
    max_stored_kb: int | None = None,
) -> SessionPlan:
    """Puts the stored turns before ``messages`` (OpenAI messages as dicts, content as
    text), keeping the newest turns that fit the context and, with ``max_stored_kb`` (the
    store's), that leave room for the new messages in the stored session."""
    systems = [m["content"] for m in messages if m["role"] == "system"]
    new = [m for m in messages if m["role"] != "system"]
    system = "\n".join(systems) if systems else session.system
    context = context_length or DEFAULT_CONTEXT
    reserve = max_tokens or min(1024, context // 4)
    budget = context - reserve - sum(message_tokens(m) for m in new)
    budget -= estimate_tokens(system) if system else 0
    kept = 0
    for turn in reversed(session.turns):
        if turn.tokens > budget:
            break
        budget -= turn.tokens
        kept += 1
    turns = session.turns[len(session.turns) - kept :]
    if max_stored_kb is not None:
        shell = session.model_copy(update={"system": system, "turns": []})
        new_turn = Turn(messages=[Message(**m) for m in new], tokens=0)
        turns = turns[_oldest_to_drop(shell, [*turns, new_turn], max_stored_kb) :]
    return SessionPlan(
        session_id=session.id,
        owner=session.owner,
        system=system,
        dropped=len(session.turns) - len(turns),
        history=[m.public() for turn in turns for m in turn.messages],
        new=new,
    )


def _key(owner: str, session_id: str) -> str:
    return f"{PREFIX}session:{owner}:{session_id}"


def _entry(session_id: str) -> str:
    """The session's entry in its key's stored bytes."""
    return f"session:{session_id}"


def _not_found(session_id: str) -> NotFoundError:
    return NotFoundError(f"No session with id '{session_id}'.", code="session_not_found")


class SessionStore:
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

    @needs_store
    async def _read(self, session_id: str, owner: str) -> Session | None:
        raw = await self.redis.get(_key(owner, session_id))
        return Session.model_validate_json(raw) if raw is not None else None

    async def open(self, session_id: str, owner: str) -> Session:
        """The session to continue; a new, empty one if there is none yet. Refused (403
        ``storage_quota_exceeded``, 503 ``store_full``) when ``owner`` may store no more."""
        check_id(session_id)
        await self.stored_bytes.hold(
            owner, _entry(session_id), 0, "X-Session-ID", "send no X-Session-ID"
        )
        session = await self._read(session_id, owner)
        return session if session is not None else Session.new(session_id, owner)

    async def get(self, session_id: str, owner: str) -> Session:
        session = await self._read(session_id, owner)
        if session is None:
            raise _not_found(session_id)
        return session

    @needs_store
    async def delete(self, session_id: str, owner: str) -> None:
        if not await self.redis.delete(_key(owner, session_id)):
            raise _not_found(session_id)
        await self.stored_bytes.drop(owner, _entry(session_id))

    @needs_store
    async def save_turn(self, plan: SessionPlan, reply: dict[str, Any], reply_tokens: int) -> None:
        """Stores the plan's new messages and the reply (an assistant message) as the newest
        turn, dropping the turns that no longer fit (the context, then ``max_stored_kb``),
        and counts the session's new size in its key's stored bytes (never refused: the room
        was checked by :meth:`open`). Optimistic (``WATCH``): a turn saved meanwhile by
        another request of the same session is kept (and the size counted is the last
        write's: each try counts its own before it writes)."""
        turn = Turn(
            messages=[*(Message(**m) for m in plan.new), Message(**reply)],
            tokens=sum(message_tokens(m) for m in plan.new) + reply_tokens + _PER_MESSAGE,
        )
        key = _key(plan.owner, plan.session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    session = (
                        Session.model_validate_json(raw)
                        if raw is not None
                        else Session.new(plan.session_id, plan.owner)
                    )
                    session.system = plan.system
                    session.updated_at = int(time.time())
                    turns = [*session.turns[plan.dropped :], turn]
                    shell = session.model_copy(update={"turns": []})
                    session.turns = turns[_oldest_to_drop(shell, turns, self.max_stored_kb) :]
                    raw = session.model_dump_json()
                    await self.stored_bytes.put(
                        plan.owner, _entry(plan.session_id), len(raw.encode()), self.ttl_s, None
                    )
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, raw, ex=self.ttl_s)
                    await pipe.execute()
                    return
                except WatchError:
                    continue
