"""``truncation: "auto"``: a conversation too long for the model's context loses its oldest
items until it fits, as OpenAI drops items from the beginning of the conversation.

What goes first: the oldest turns of the conversation (the chain of
``previous_response_id`` or the conversation's items, then the request's own input), one at
a time, where an assistant's tool calls and their outputs go together (a call's output is
never left without its call). Never dropped: ``instructions``, ``system`` and ``developer``
messages, and the newest turn (the one being answered). When even that does not fit, the
answer is the 400 ``context_length_exceeded`` that ``disabled`` gives.

"Fits" is the chat path's own judgement before generating (the prompt's size against the
model's ``context_length`` with ``max_output_tokens``, see
:func:`gateway.serving.chat.check_prompt`); the fewest turns that make it fit are found by
bisection, so a long conversation is rendered about log2(turns) times, never once a turn.
The response reports how many messages were left out (``truncated_messages``, an
extension field; 0 when all fit).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.errors import InvalidRequestError

T = TypeVar("T")
#: Roles kept whatever the length (the instructions the model is given).
KEPT = ("system", "developer")


def turns(messages: list[dict[str, Any]]) -> list[list[int]]:
    """The indices of ``messages`` grouped into the turns dropped together, oldest first:
    each message alone, but an assistant's tool calls with the tool outputs after it;
    kept messages (:data:`KEPT`) in none."""
    groups: list[list[int]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role in KEPT:
            continue
        if role == "tool" and groups and messages[groups[-1][0]].get("tool_calls"):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _too_long(exc: InvalidRequestError) -> bool:
    return exc.code == "context_length_exceeded"


async def fit(
    messages: list[dict[str, Any]],
    prepare: Callable[[list[dict[str, Any]], bool], Awaitable[T]],
) -> tuple[T, list[dict[str, Any]], int]:
    """``prepare`` of the longest tail of ``messages`` that fits the context: what it made,
    the messages kept, and how many were dropped. ``prepare``'s other errors are raised.
    ``prepare(messages, trial)``: a trial only checks the messages (their images are not
    fetched); the tail that fits is prepared once more, whole."""
    try:
        return await prepare(messages, False), messages, 0
    except InvalidRequestError as exc:
        if not _too_long(exc):
            raise
        too_long = exc
    groups = turns(messages)
    best: tuple[list[dict[str, Any]], int] | None = None
    low, high = 1, len(groups) - 1  # drop at least one turn; keep the newest
    while low <= high:
        drop = (low + high) // 2
        gone = {index for group in groups[:drop] for index in group}
        kept = [m for index, m in enumerate(messages) if index not in gone]
        try:
            await prepare(kept, True)
        except InvalidRequestError as exc:
            if not _too_long(exc):
                raise
            low = drop + 1
            continue
        best = (kept, len(gone))
        high = drop - 1
    if best is None:
        raise too_long
    kept, dropped = best
    return await prepare(kept, False), kept, dropped
