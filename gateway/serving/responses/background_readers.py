"""Background responses as any replica reads them (``background: true``; the replica that
runs one is :mod:`gateway.serving.responses.background`, whose
:class:`~gateway.serving.responses.background.BackgroundResponses` extends
:class:`BackgroundReaders` with the run): retrieve one as it stands, follow its events,
cancel it, delete it.

- A response still ``queued``/``in_progress`` whose lease ended (its replica died) is
  stored ``failed`` (``error.code`` :data:`LOST`) by the first reader to find it, with
  ``error`` and ``response.failed`` in its log.
- A follower reads the log every :data:`POLL_S` (at once on the replica that runs it).
- A cancel claims the end ``cancelled`` and waits until it is stored: by the run when it
  won, as it stands when the run's own end came first. A response whose replica died is
  stored ``cancelled`` here.
- A delete marks the response deleted before it deletes the record, so that a run that
  goes on cannot store it again (it sees the mark after each write and undoes it), and
  deletes its event log in the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.state.response_events import DELETED, READ_COUNT, BackgroundRuns
from gateway.state.responses import ResponseStore, StoredResponse

#: The statuses a response ends with.
ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
#: How often a follower of a response another replica runs reads its log.
POLL_S = 0.1
#: The error code of a response whose replica stopped renewing its lease.
LOST = "background_worker_lost"


class BackgroundReaders:
    """Retrieves, follows, cancels and deletes background responses, whichever replica
    runs them (see the module's docstring). The replica's own runs are seen through
    :meth:`_changed` and :meth:`_stop_here`, which the class that runs them overrides."""

    def __init__(self, store: ResponseStore, runs: BackgroundRuns, tick_s: float) -> None:
        self.store = store
        self.runs = runs
        self.tick_s = tick_s
        """How often a follower checks whether a response another replica runs still runs."""

    def _changed(self, response_id: str) -> asyncio.Event | None:
        """Set when the run of ``response_id`` on this replica logs an event; None when
        this replica does not run it."""
        return None

    def _stop_here(self, response_id: str) -> None:
        """Stops the run of ``response_id`` if this replica runs it (its end was claimed by
        another party)."""

    async def _save_unless_deleted(self, stored: StoredResponse) -> bool:
        """Stores ``stored``; deletes it again if it was deleted meanwhile (a delete marks
        the response before deleting its record, so a write followed by this look cannot
        bring it back): whether it stays."""
        await self.store.save(stored)
        if await self.runs.ended(stored.owner, str(stored.response["id"])) != DELETED:
            return True
        with contextlib.suppress(NotFoundError):
            await self.store.delete(stored.owner, str(stored.response["id"]))
        return False

    async def current(self, owner: str, response_id: str) -> dict[str, Any]:
        """The response as it stands (any stored response; a 404 for another key's)."""
        return (await self._current(await self.store.get(owner, response_id))).response

    async def _current(self, stored: StoredResponse) -> StoredResponse:
        """``stored``, or, for a background response still running without a lease (its
        replica died), that response ``failed``: stored so by the first reader to find it."""
        response = stored.response
        owner, response_id = stored.owner, str(response["id"])
        if not response.get("background") or response["status"] in ENDED:
            return stored
        if await self.runs.alive(owner, response_id):
            return stored
        error = {
            "code": LOST,
            "message": "The gateway replica that ran this background response stopped before "
            "it ended.",
        }
        failed = {**response, "status": "failed", "error": error}
        if await self.runs.claim(owner, response_id, "failed", "reader"):
            stored = stored.model_copy(update={"response": failed})
            await self._save_unless_deleted(stored)
            last = await self._last(owner, response_id)
            ending: list[tuple[str, dict[str, Any]]] = [
                ("error", {**error, "param": None}),
                ("response.failed", {"response": failed}),
            ]
            for number, (kind, fields) in enumerate(ending, start=last + 1):
                sse = _sse(kind, number, fields)
                await self.runs.append(owner, response_id, number, sse, "reader")
            await self.runs.close(owner, response_id, last + 3)
            return stored
        # Its end was claimed by another reader, or a cancel: that one stores it.
        ended = await self.runs.ended(owner, response_id)
        if ended == "cancelled":
            return stored.model_copy(update={"response": {**response, "status": "cancelled"}})
        return stored.model_copy(update={"response": failed})

    async def _last(self, owner: str, response_id: str) -> int:
        """The sequence number of the response's last logged event (-1: none)."""
        after = -1
        while True:
            entries = await self.runs.read(owner, response_id, after)
            if not entries:
                return after
            after = entries[-1][0]

    async def follow(self, owner: str, response_id: str, after: int | None) -> AsyncIterator[str]:
        """The SSE body of ``retrieve(stream=True, starting_after=after)``: the response's
        events after ``after`` (all without), then the rest as they come, until its end.
        A 404 for another key's response, 400 ``not_background`` for one that was not run in
        the background (it has no event log)."""
        stored = await self.store.get(owner, response_id)
        if not stored.response.get("background"):
            raise InvalidRequestError(
                "Only a background response (background: true) can be streamed again; "
                "retrieve it without stream.",
                param="stream",
                code="not_background",
            )
        return self._follow(stored, -1 if after is None else after)

    async def _follow(self, stored: StoredResponse, after: int) -> AsyncGenerator[str, None]:
        owner, response_id = stored.owner, str(stored.response["id"])
        checked = time.monotonic()
        while True:
            changed = self._changed(response_id)
            entries = await self.runs.read(owner, response_id, after)
            for number, sse in entries:
                if sse is None:
                    return
                yield sse
                after = number
            if len(entries) == READ_COUNT:
                continue
            if changed is None and time.monotonic() - checked > self.tick_s:
                checked = time.monotonic()
                current = await self._current(await self.store.get(owner, response_id))
                if current.response["status"] in ENDED and not await self.runs.alive(
                    owner, response_id
                ):
                    for _, sse in await self.runs.read(owner, response_id, after):
                        if sse is None:
                            return
                        yield sse
                    return
            if changed is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), POLL_S)
            else:
                await asyncio.sleep(POLL_S)

    async def cancel(self, owner: str, response_id: str) -> dict[str, Any]:
        """Cancels a background response (any replica's) and returns it ``cancelled``, once
        stored so; a response that has ended, or whose end its run claimed first, is
        returned as it ended. 400 ``response_not_cancellable`` for one that was not run in
        the background."""
        stored = await self.store.get(owner, response_id)
        if not stored.response.get("background"):
            raise InvalidRequestError(
                "Only a background response (background: true) can be cancelled.",
                param="response_id",
                code="response_not_cancellable",
            )
        if stored.response["status"] in ENDED:
            return stored.response
        decided = await self.runs.claim(owner, response_id, "cancelled", "cancel")
        if decided:  # else its end is another's: its run (or a reader) stores it
            self._stop_here(response_id)
        while True:
            stored = await self.store.get(owner, response_id)
            if stored.response["status"] in ENDED:
                return stored.response
            if not await self.runs.alive(owner, response_id):
                if not decided:
                    return (await self._current(stored)).response
                # Its replica died before it stored the cancel: stored here.
                cancelled = {**stored.response, "status": "cancelled"}
                await self._save_unless_deleted(stored.model_copy(update={"response": cancelled}))
                await self.runs.close(owner, response_id, await self._last(owner, response_id) + 1)
                return cancelled
            await asyncio.sleep(POLL_S / 2)

    async def delete(self, owner: str, response_id: str) -> None:
        """Deletes a stored response of ``owner`` (a 404 for another key's or an unknown
        one). A background one is marked deleted first, its event log deleted with the mark
        and no longer counted, and its run stopped (on any replica: at its next event or
        renewal); a run that stores it meanwhile deletes it again."""
        stored = await self.store.get(owner, response_id)
        background = bool(stored.response.get("background"))
        if background:
            await self.runs.delete(owner, response_id)
            self._stop_here(response_id)
        await self.store.delete(owner, response_id)
        if background:
            await self.store.stored_bytes.drop(owner, log_entry(response_id))


def log_entry(response_id: str) -> str:
    """A background response's event log's entry in its key's stored bytes."""
    return f"response_events:{response_id}"


def _sse(kind: str, number: int, fields: dict[str, Any]) -> str:
    """An event of the log written outside the stream writer (a lost replica's end)."""
    payload = {"type": kind, "sequence_number": number, **fields}
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
