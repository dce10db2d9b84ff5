"""Background responses (``background: true``): :class:`BackgroundResponses` answers the
``POST`` at once with the response ``queued``, runs it on this replica as a task of its
own (not tied to the HTTP request: a client that leaves does not stop it) and stores it as
it goes, so any replica can retrieve it, follow its events, or cancel it.

- **Stored as it goes**: the record (:mod:`gateway.state.responses`) is written ``queued``
  before the ``POST`` is answered, ``in_progress`` when generation starts, again as each
  output item is done (the output so far), and once more at the end. Every SSE event, with
  its ``sequence_number``, goes to the response's event log
  (:mod:`gateway.state.response_events`), streamed or not: ``retrieve(stream=True,
  starting_after=N)`` replays the events after ``N`` and follows the log until it ends
  (polling it every :data:`POLL_S`, at once on the replica that runs it).
  ``stream: true`` on the ``POST`` is that follower from the first event.
- **Cancel**: the end is claimed ``cancelled`` in Redis; the running replica sees it at
  its next renewal (every :data:`TICK_S` at most) and cancels its task, which closes the
  Triton stream, stores the response ``cancelled`` with the output it had, and ends the
  log. The cancel answers once it is stored. A finished response is returned unchanged.
- **A replica that dies**: it stops renewing the lease; a reader (retrieve, a follower,
  cancel) that finds the response ``queued``/``in_progress`` without a lease stores it
  ``failed`` (``error.code`` ``background_worker_lost``), with ``error`` and
  ``response.failed`` in its log.
- **Usage and limits**: the run has an admission of its own (:func:`_detached`), whose
  tokens are reserved before the ``POST`` is answered and settled when the run ends.
- **Bounds**: ``max_background_per_key`` running per key (429
  ``too_many_background_responses``); the event log is at most :data:`LOG_FACTOR` x
  ``max_stored_kb`` and counts in the key's stored bytes. ``docs/responses.md`` has it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidRequestError, RateLimitError
from gateway.serving import generation
from gateway.serving.protocol import Usage
from gateway.serving.responses.conversion import _message_item, _record, _response_object
from gateway.serving.responses.protocol import PreparedResponse
from gateway.serving.responses.service import ResponsesService
from gateway.serving.responses.stream import _StreamWriter
from gateway.serving.sse import failure
from gateway.state.admission import Admission
from gateway.state.limits import Meter
from gateway.state.response_events import READ_COUNT, BackgroundRuns
from gateway.state.responses import StoredResponse
from gateway.state.stored_bytes import Hold

logger = logging.getLogger("gateway")

#: Settles a background run's admission once it has ended (tokens, usage, metrics; never
#: raises).
Settle = Callable[[Admission], Awaitable[None]]
#: The statuses a response ends with.
ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
#: How often a follower of a response another replica runs reads its log.
POLL_S = 0.1
#: How often the running replica renews its lease and looks for a cancel, at most.
TICK_S = 0.5
#: The event log of a response is at most this many times ``max_stored_kb``: text deltas
#: repeat the output once more, and each event carries its ids.
LOG_FACTOR = 4
#: The error code of a response whose replica stopped renewing its lease.
LOST = "background_worker_lost"


def _detached(admission: Admission) -> Admission:
    """An admission for the run, apart from the ``POST``'s (which the middleware settles
    when the ``POST`` is answered): the same key and model, a meter of its own reserving
    under the same limits (the budgeter reads only the key and the model of the admission
    it was made for), no concurrency slot."""
    meter = admission.meter
    fresh = Meter(reserver=meter.reserver, budgeter=meter.budgeter)
    return Admission(key=admission.key, headers={}, meter=fresh, model=admission.model)


def _kind(sse: str) -> str:
    """An SSE event's type, from its ``event:`` line."""
    return sse[len("event: ") : sse.index("\n")]


class _Stopped(Exception):
    """The response's end was claimed elsewhere (cancelled, or failed by a reader)."""


@dataclass
class _Job:
    """A background response running on this replica."""

    prepared: PreparedResponse
    admission: Admission
    log_hold: Hold | None
    writer: _StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when an event is logged (followers on this replica wait on it)."""
    logged: int = 0
    """Events logged (the next one's sequence number)."""
    log_bytes: int = 0
    stopping: bool = False
    """Its end was claimed elsewhere: a cancel of its task is that, not a shutdown."""

    @property
    def owner(self) -> str:
        return self.prepared.owner

    @property
    def id(self) -> str:
        return self.prepared.id


class _Finishing(ResponsesService):
    """The service a background response's stream writer finishes it through: the end is
    claimed before the response is stored (a cancel may have claimed it first)."""

    def __init__(self, background: BackgroundResponses, job: _Job) -> None:
        # Only what the stream writer uses (chat, and _finish, overridden), not the
        # service's whole construction.
        self.chat = background.responses.chat
        self.store = background.responses.store
        self.background = background
        self.job = job

    async def _finish(
        self, prepared: PreparedResponse, status: str, output: list[dict[str, Any]], usage: Usage
    ) -> dict[str, Any]:
        if not await self.background.runs.claim(prepared.owner, prepared.id, status):
            raise _Stopped
        # conversation=: the output joins the conversation, as for any response.
        await self.background.responses.references.append_turn(prepared, output)
        return await self.background._save(prepared, status, output, usage)


class BackgroundResponses:
    """Starts, follows and cancels background responses (see the module's docstring)."""

    def __init__(
        self,
        responses: ResponsesService,
        runs: BackgroundRuns,
        settle: Settle,
        max_per_key: int,
        lease_s: float,
    ) -> None:
        self.responses = responses
        self.store = responses.store
        self.runs = runs
        self.settle = settle
        self.max_per_key = max_per_key
        self.lease_s = lease_s
        self.tick_s = min(TICK_S, lease_s / 3)
        self.max_log_bytes = LOG_FACTOR * self.store.max_stored_kb * 1024
        self._jobs: dict[str, _Job] = {}
        """The responses this replica runs (their tasks referenced until they end)."""

    # The POST.

    async def start(self, prepared: PreparedResponse, admission: Admission) -> dict[str, Any]:
        """Starts ``prepared`` in the background and returns it ``queued`` (stored). 400
        ``background_requires_store`` with ``store: false``; 429
        ``too_many_background_responses`` past the key's bound; the 429s of ``tpm`` and the
        budgets as any request."""
        if prepared.request.store is False:
            raise InvalidRequestError(
                "background: true needs store: true: a background response is stored as it "
                "runs, so that it can be retrieved, followed and cancelled.",
                param="store",
                code="background_requires_store",
            )
        owner, response_id = prepared.owner, prepared.id
        if not await self.runs.start(owner, response_id, self.max_per_key):
            await self.responses._give_back(prepared)
            refused = RateLimitError(
                f"This API key already runs {self.max_per_key} background responses "
                f"(GATEWAY_MAX_BACKGROUND_PER_KEY); wait for one to end or cancel one.",
                "background",
                1.0,
                {},
            )
            refused.code = "too_many_background_responses"
            refused.param = "background"
            raise refused
        job = _Job(prepared, _detached(admission), None)
        try:
            queued = _response_object(prepared, "queued", [])
            queued["background"] = True
            size = 3 * len(json.dumps(queued))  # created and in_progress carry it, and the end
            job.log_hold = await self.store.stored_bytes.hold(
                owner, _log_entry(response_id), size, "background", "send background: false"
            )
            run = await self.responses.chat.reserve_run(prepared.chat, job.admission.meter)
            await self.store.save(_record(prepared, queued), prepared.hold)
            prepared.hold = None  # the record's now
        except BaseException:
            await asyncio.shield(self._abandon(job))
            raise
        job.writer = _StreamWriter(prepared, _Finishing(self, job))
        self._jobs[response_id] = job
        job.task = asyncio.create_task(self._run(job, run), name=f"background {response_id}")
        return queued

    async def _abandon(self, job: _Job) -> None:
        """Undoes a start that failed before its task began."""
        with contextlib.suppress(Exception):
            await self.responses._give_back(job.prepared)
            await self.store.stored_bytes.release(job.log_hold)
            await self.runs.stop(job.owner, job.id)
        await self.settle(job.admission)

    # The run.

    async def _run(self, job: _Job, run: generation.GenerationRun) -> None:
        assert job.writer is not None
        watcher = asyncio.create_task(self._keep(job))
        try:
            try:
                pieces = await run.stream()
                async with aclosing(job.writer.events(pieces, run)) as events:
                    async for sse in events:
                        await self._log(job, sse)
            except _Stopped:
                await self._stopped(job, run)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not job.stopping or task is None:
                    raise  # the process is stopping: its lease ends, a reader fails it
                task.uncancel()
                await self._stopped(job, run)
            except Exception as exc:
                await self._failed(job, run, exc)
        except Exception:  # Redis gone: the lease ends and a reader fails it
            logger.exception("background response %s could not be stored", job.id)
        finally:
            watcher.cancel()
            await asyncio.shield(self._end(job))

    async def _keep(self, job: _Job) -> None:
        """Renews the job's lease; cancels its task once its end is claimed elsewhere."""
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                going = await self.runs.renew(job.owner, job.id)
            except Exception as exc:  # the lease may end; a reader then fails the response
                logger.warning("could not renew background response %s: %s", job.id, exc)
                continue
            if not going:
                self._stop(job)
                return

    def _stop(self, job: _Job) -> None:
        if job.stopping:
            return  # cancelled once: a second cancel could land in its ending
        job.stopping = True
        if job.task is not None:
            job.task.cancel()

    async def _log(self, job: _Job, sse: str) -> None:
        """Logs an event; stores the response as it stands when its output changes."""
        job.log_bytes += len(sse.encode())
        if job.log_bytes > self.max_log_bytes:
            raise InvalidRequestError(
                f"This background response's events passed {self.max_log_bytes:,} bytes "
                f"({LOG_FACTOR} x GATEWAY_MAX_STORED_KB); ask for a shorter answer "
                "(max_output_tokens).",
                param="background",
                code="event_log_too_large",
            )
        await self.runs.append(job.owner, job.id, job.logged, sse)
        job.logged += 1
        job.changed.set()
        job.changed = asyncio.Event()
        kind = _kind(sse)
        if kind in ("response.in_progress", "response.output_item.done"):
            assert job.writer is not None
            await self._save(job.prepared, "in_progress", job.writer.output)

    async def _save(
        self,
        prepared: PreparedResponse,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        response = _response_object(prepared, status, output, usage, error)
        response["background"] = True
        await self.store.save(_record(prepared, response))
        return response

    async def _stopped(self, job: _Job, run: generation.GenerationRun) -> None:
        """The end was claimed elsewhere: a cancel is stored here, with the output so far
        (a reader that found the lease ended stored its failure itself)."""
        assert job.writer is not None
        ended = await self.runs.ended(job.owner, job.id)
        if ended == "cancelled":
            await self._save(job.prepared, "cancelled", _so_far(job.writer), run.usage())

    async def _failed(self, job: _Job, run: generation.GenerationRun, exc: Exception) -> None:
        """The generation failed: stored ``failed`` with its error, logged as ``error``
        and ``response.failed`` (unless its end was claimed first)."""
        if not await self.runs.claim(job.owner, job.id, "failed"):
            await self._stopped(job, run)
            return
        error = failure(exc, "background response")["error"]
        code, message = error["code"] or error["type"], error["message"]
        assert job.writer is not None
        writer = job.writer
        try:
            failed = await self._save(
                job.prepared,
                "failed",
                writer.output,
                run.usage(),
                {"code": code, "message": message},
            )
        except InvalidRequestError:  # the output made the record too large: stored without
            failed = await self._save(
                job.prepared, "failed", [], run.usage(), {"code": code, "message": message}
            )
        for sse in (
            writer.event("error", code=code, message=message, param=None),
            writer.event("response.failed", response=failed),
        ):
            await self.runs.append(job.owner, job.id, job.logged, sse)
            job.logged += 1

    async def _end(self, job: _Job) -> None:
        """Whatever way the run ended: its place freed, its log ended and counted, its
        admission settled. Never raises."""
        self._jobs.pop(job.id, None)
        try:
            await self.runs.stop(job.owner, job.id)
            ended = await self.runs.ended(job.owner, job.id)
            if ended == "deleted":
                await self.store.stored_bytes.release(job.log_hold)
            else:
                if ended is not None:  # else stopped unended (shutdown): a reader fails it
                    await self.runs.close(job.owner, job.id, job.logged)
                await self.store.stored_bytes.put(
                    job.owner, _log_entry(job.id), job.log_bytes, self.store.ttl_s, job.log_hold
                )
            await self.responses._give_back(job.prepared)
        except Exception as exc:
            logger.warning("background response %s did not end cleanly: %s", job.id, exc)
        finally:
            job.changed.set()
            await self.settle(job.admission)

    # Readers, on any replica.

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
        if await self.runs.claim(owner, response_id, "failed"):
            stored = stored.model_copy(update={"response": failed})
            await self.store.save(stored)
            last = await self._last(owner, response_id)
            ending: list[tuple[str, dict[str, Any]]] = [
                ("error", {**error, "param": None}),
                ("response.failed", {"response": failed}),
            ]
            for number, (kind, fields) in enumerate(ending, start=last + 1):
                await self.runs.append(owner, response_id, number, _sse(kind, number, fields))
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
            job = self._jobs.get(response_id)
            changed = job.changed if job is not None else None
            entries = await self.runs.read(owner, response_id, after)
            for number, sse in entries:
                if sse is None:
                    return
                yield sse
                after = number
            if len(entries) == READ_COUNT:
                continue
            if job is None and time.monotonic() - checked > self.tick_s:
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
        stored so; a response that has ended is returned unchanged. 400
        ``response_not_cancellable`` for one that was not run in the background."""
        stored = await self.store.get(owner, response_id)
        if not stored.response.get("background"):
            raise InvalidRequestError(
                "Only a background response (background: true) can be cancelled.",
                param="response_id",
                code="response_not_cancellable",
            )
        if stored.response["status"] in ENDED:
            return stored.response
        decided = await self.runs.claim(owner, response_id, "cancelled")
        job = self._jobs.get(response_id)
        if job is not None:
            self._stop(job)
        while True:
            stored = await self.store.get(owner, response_id)
            if stored.response["status"] in ENDED:
                return stored.response
            if not await self.runs.alive(owner, response_id):
                if not decided:
                    return (await self._current(stored)).response
                # Its replica died before it stored the cancel: stored here.
                cancelled = {**stored.response, "status": "cancelled"}
                await self.store.save(stored.model_copy(update={"response": cancelled}))
                await self.runs.close(owner, response_id, await self._last(owner, response_id) + 1)
                return cancelled
            await asyncio.sleep(POLL_S / 2)

    async def forget(self, stored: StoredResponse) -> None:
        """After ``stored`` was deleted: a running one is stopped (without storing it again),
        its event log deleted and no longer counted."""
        if not stored.response.get("background"):
            return
        owner, response_id = stored.owner, str(stored.response["id"])
        await self.runs.claim(owner, response_id, "deleted")
        job = self._jobs.get(response_id)
        if job is not None:
            self._stop(job)
        await self.runs.forget(owner, response_id)
        await self.store.stored_bytes.drop(owner, _log_entry(response_id))


def _so_far(writer: _StreamWriter) -> list[dict[str, Any]]:
    """The output written so far: the items done, and the text of a message cut short."""
    item = writer.open
    if item is None or item["type"] != "message":
        return writer.output
    return [*writer.output, _message_item(item["id"], item["text"], "incomplete", writer.logprobs)]


def _log_entry(response_id: str) -> str:
    """The event log's entry in the key's stored bytes."""
    return f"response_events:{response_id}"


def _sse(kind: str, number: int, fields: dict[str, Any]) -> str:
    """An event of the log written outside the stream writer (a lost replica's end)."""
    payload = {"type": kind, "sequence_number": number, **fields}
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
