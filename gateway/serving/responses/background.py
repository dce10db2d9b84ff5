"""Background responses (``background: true``): :class:`BackgroundResponses` answers the
``POST`` at once with the response ``queued``, runs it on this replica as a task of its
own (not tied to the HTTP request: a client that leaves does not stop it) and stores it as
it goes, so any replica can retrieve it, follow its events, cancel or delete it (the
readers, :mod:`gateway.serving.responses.background_readers`, which it extends).

- **Stored as it goes**: the record (:mod:`gateway.state.responses`) is written ``queued``
  before the ``POST`` is answered, ``in_progress`` when generation starts, again as each
  output item is done (the output so far), and once more at the end. Every SSE event, with
  its ``sequence_number``, goes to the response's event log
  (:mod:`gateway.state.response_events`), streamed or not: ``retrieve(stream=True,
  starting_after=N)`` replays the events after ``N`` and follows the log until it ends.
  ``stream: true`` on the ``POST`` is that follower from the first event.
- **Its end, decided once**: an event is logged only while no other party (a cancel, a
  delete, a reader that found its lease ended) claimed the response's end, checked in the
  same script run: a run whose event is refused stops at once. Each write of the record
  is followed by a look at the end, and one written after a delete is deleted again, so a
  delete is never undone. The run claims its own end (``completed``...) before storing it;
  its lease watcher stops it for another party's end only. A failure after that claim (a
  conversation that overflows with the answer) is stored ``failed`` with its error.
- **Cancel**: the end is claimed ``cancelled`` in Redis; the running replica sees it at
  its next event or renewal (every :data:`TICK_S` at most) and cancels its task, which
  closes the Triton stream, stores the response ``cancelled`` with the output it had, and
  ends the log. The cancel answers once it is stored. A response whose end its run
  claimed first is returned as the run stores it.
- **A replica that dies**: it stops renewing the lease; a reader (retrieve, a follower,
  cancel) that finds the response ``queued``/``in_progress`` without a lease stores it
  ``failed`` (``error.code`` ``background_worker_lost``), with ``error`` and
  ``response.failed`` in its log. **A replica that stops** (:meth:`BackgroundResponses.close`,
  before Redis is closed) cancels its runs and stores each ``failed`` (``server_shutdown``),
  its usage settled.
- **Usage and limits**: the run has an admission of its own (:func:`_detached`), whose
  tokens are reserved before the ``POST`` is answered and settled when the run ends.
- **Bounds**: min(``max_background_per_key``, the key's ``max_concurrency``) running per
  key (429 ``too_many_background_responses``); the event log is at most
  :data:`LOG_FACTOR` x ``max_stored_kb`` and counts in the key's stored bytes.
  ``docs/responses.md`` has it all.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import InvalidRequestError, RateLimitError
from gateway.serving import generation
from gateway.serving.protocol import Usage
from gateway.serving.responses.background_readers import LOST, BackgroundReaders, log_entry
from gateway.serving.responses.conversion import response_object, stored_record
from gateway.serving.responses.items import MessageItem, OutputItem
from gateway.serving.responses.protocol import PreparedResponse
from gateway.serving.responses.service import ResponsesService
from gateway.serving.responses.stream import StreamWriter
from gateway.serving.sse import failure
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey
from gateway.state.limits import Meter
from gateway.state.response_events import DELETED, BackgroundRuns
from gateway.state.stored_bytes import Hold

logger = logging.getLogger("gateway")

#: Settles a background run's admission once it has ended (tokens, usage, metrics; never
#: raises).
Settle = Callable[[Admission], Awaitable[None]]
#: How often the running replica renews its lease and looks for a cancel, at most.
TICK_S = 0.5
#: The event log of a response is at most this many times ``max_stored_kb``: text deltas
#: repeat the output once more, and each event carries its ids.
LOG_FACTOR = 4
#: The error code of a response whose replica stopped (shut down) while it ran.
SHUTDOWN = "server_shutdown"
#: How long a stopping replica waits for its runs to store their end.
SHUTDOWN_WAIT_S = 5.0
#: Why a run's task is cancelled: another party claimed its end, or the replica stops.
StopReason = Literal["claimed", "shutdown"]


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
    """Another party claimed the response's end (cancelled, deleted, or failed by a
    reader): the run stops."""


@dataclass
class _Job:
    """A background response running on this replica."""

    prepared: PreparedResponse
    admission: Admission
    log_hold: Hold | None
    writer: StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when an event is logged (followers on this replica wait on it)."""
    logged: int = 0
    """Events logged (the next one's sequence number)."""
    log_bytes: int = 0
    stop: StopReason | None = None
    """Why its task was cancelled, once it was."""
    started: bool = False
    """Its task began (a task cancelled before would skip its ``finally``)."""
    ending: bool = False
    """It claimed its end, or stopped generating: its task is no longer cancelled."""

    @property
    def owner(self) -> str:
        return self.prepared.owner

    @property
    def id(self) -> str:
        return self.prepared.id


class _Finishing:
    """How a background response's stream writer finishes it: the end is claimed before the
    response is stored (a cancel may have claimed it first)."""

    def __init__(self, background: BackgroundResponses, job: _Job) -> None:
        self.background = background
        self.job = job

    async def __call__(
        self, prepared: PreparedResponse, status: str, output: list[OutputItem], usage: Usage
    ) -> dict[str, Any]:
        self.job.ending = True  # no cancel now: it ends as it claims, or as it fails
        if not await self.background.runs.claim(prepared.owner, prepared.id, status, "run"):
            raise _Stopped
        # conversation=: the output joins the conversation, as for any response.
        await self.background.responses.references.append_turn(prepared, output)
        return await self.background._store(self.job, status, output, usage)


class BackgroundResponses(BackgroundReaders):
    """Starts and runs background responses on this replica, and reads, follows, cancels
    and deletes any replica's (see the module's docstring)."""

    def __init__(
        self,
        responses: ResponsesService,
        runs: BackgroundRuns,
        settle: Settle,
        max_per_key: int,
        lease_s: float,
    ) -> None:
        super().__init__(responses.store, runs, min(TICK_S, lease_s / 3))
        self.responses = responses
        self.settle = settle
        self.max_per_key = max_per_key
        self.lease_s = lease_s
        self.max_log_bytes = LOG_FACTOR * self.store.max_stored_kb * 1024
        self._jobs: dict[str, _Job] = {}
        """The responses this replica runs (their tasks referenced until they end)."""

    def running(self) -> int:
        """How many background responses this replica runs now."""
        return len(self._jobs)

    def _changed(self, response_id: str) -> asyncio.Event | None:
        job = self._jobs.get(response_id)
        return None if job is None else job.changed

    def _stop_here(self, response_id: str) -> None:
        job = self._jobs.get(response_id)
        if job is not None:
            self._stop(job, "claimed")

    # The POST.

    def bound(self, key: ApiKey) -> tuple[int, str]:
        """How many background responses ``key`` may run at once, and the setting that says
        so: ``GATEWAY_MAX_BACKGROUND_PER_KEY``, or the key's ``max_concurrency`` when lower
        (an admin's cap on the key holds for the runs too, which hold no slot of their own)."""
        if key.max_concurrency is not None and key.max_concurrency < self.max_per_key:
            return key.max_concurrency, "the key's max_concurrency"
        return self.max_per_key, "GATEWAY_MAX_BACKGROUND_PER_KEY"

    async def start(self, prepared: PreparedResponse, admission: Admission) -> dict[str, Any]:
        """Starts ``prepared`` in the background and returns it ``queued`` (stored). 400
        ``background_requires_store`` with ``store: false``; 429
        ``too_many_background_responses`` past the key's :meth:`bound`; the 429s of
        ``tpm`` and the budgets as any request."""
        if prepared.request.store is False:
            raise InvalidRequestError(
                "background: true needs store: true: a background response is stored as it "
                "runs, so that it can be retrieved, followed and cancelled.",
                param="store",
                code="background_requires_store",
            )
        owner, response_id = prepared.owner, prepared.id
        limit, setting = self.bound(admission.key)
        if not await self.runs.start(owner, response_id, limit):
            await self.responses._give_back(prepared)
            refused = RateLimitError(
                f"This API key already runs {limit} background responses ({setting}); wait "
                "for one to end or cancel one.",
                "background",
                1.0,
                {},
            )
            refused.code = "too_many_background_responses"
            refused.param = "background"
            raise refused
        job = _Job(prepared, _detached(admission), None)
        try:
            queued = response_object(prepared, "queued", [])
            queued["background"] = True
            size = 3 * len(json.dumps(queued))  # created and in_progress carry it, and the end
            job.log_hold = await self.store.stored_bytes.hold(
                owner, log_entry(response_id), size, "background", "send background: false"
            )
            run = await self.responses.chat.reserve_run(prepared.chat, job.admission.meter)
            await self.store.save(stored_record(prepared, queued, []), prepared.hold)
            prepared.hold = None  # the record's now
        except BaseException:
            await asyncio.shield(self._abandon(job))
            raise
        job.writer = StreamWriter(
            prepared, self.responses.chat.strict_arguments, _Finishing(self, job)
        )
        self._jobs[response_id] = job
        job.task = asyncio.create_task(self._run(job, run), name=f"background {response_id}")
        return queued

    async def _abandon(self, job: _Job) -> None:
        """Undoes a start that failed before its task began."""
        try:
            await self.responses._give_back(job.prepared)
            await self.store.stored_bytes.release(job.log_hold)
            await self.runs.stop(job.owner, job.id)
        except Exception as exc:  # its place ends with its lease, its hold by itself
            logger.warning("background response %s was not undone: %s", job.id, exc)
        await self.settle(job.admission)

    # The run.

    async def _run(self, job: _Job, run: generation.GenerationRun) -> None:
        job.started = True
        watcher = asyncio.create_task(self._keep(job))
        try:
            await self._generate(job, run)
        except _Stopped:
            pass  # deleted while it stored its end: nothing more to store
        except Exception:  # Redis gone: the lease ends and a reader fails it
            logger.exception("background response %s could not be stored", job.id)
        finally:
            job.ending = True
            watcher.cancel()
            await asyncio.shield(self._end(job))

    async def _generate(self, job: _Job, run: generation.GenerationRun) -> None:
        """Generates the response, logging and storing it as it goes, until it ends: as it
        ends itself, as another party claimed, or failed (stored so)."""
        assert job.writer is not None
        try:
            if job.stop is not None:  # stopped before it began
                raise asyncio.CancelledError
            pieces = await run.stream()
            async with aclosing(job.writer.events(pieces, run)) as events:
                async for sse in events:
                    await self._log(job, sse)
        except _Stopped:
            job.ending = True
            await self._stopped(job, run)
        except asyncio.CancelledError:
            job.ending = True
            task = asyncio.current_task()
            if job.stop is None or task is None:
                raise  # not ours to handle: its lease ends, a reader fails it
            task.uncancel()
            if job.stop == "shutdown":
                message = "The gateway replica that ran this background response stopped."
                await self._failed(job, run, SHUTDOWN, message)
            else:
                await self._stopped(job, run)
        except Exception as exc:
            job.ending = True
            error = failure(exc, "background response")["error"]
            await self._failed(job, run, error["code"] or error["type"], error["message"])

    async def _keep(self, job: _Job) -> None:
        """Renews the job's lease; cancels its task once another party claimed its end."""
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                going = await self.runs.renew(job.owner, job.id)
            except Exception as exc:  # the lease may end; a reader then fails the response
                logger.warning("could not renew background response %s: %s", job.id, exc)
                continue
            if not going:
                self._stop(job, "claimed")
                return

    def _stop(self, job: _Job, why: StopReason) -> None:
        """Cancels the job's task, unless it is ending (storing its end) or was cancelled
        once: a second cancel could land in its ending."""
        if job.stop is not None or job.ending:
            return
        job.stop = why
        if job.task is not None and job.started:
            job.task.cancel()

    async def _log(self, job: _Job, sse: str) -> None:
        """Logs an event, unless another party claimed the end (the run stops); stores the
        response as it stands when its output changes."""
        job.log_bytes += len(sse.encode())
        if job.log_bytes > self.max_log_bytes:
            raise InvalidRequestError(
                f"This background response's events passed {self.max_log_bytes:,} bytes "
                f"({LOG_FACTOR} x GATEWAY_MAX_STORED_KB); ask for a shorter answer "
                "(max_output_tokens).",
                param="background",
                code="event_log_too_large",
            )
        if not await self.runs.append(job.owner, job.id, job.logged, sse, "run"):
            raise _Stopped
        job.logged += 1
        job.changed.set()
        job.changed = asyncio.Event()
        kind = _kind(sse)
        if kind in ("response.in_progress", "response.output_item.done"):
            assert job.writer is not None
            await self._store(job, "in_progress", job.writer.output)

    async def _store(
        self,
        job: _Job,
        status: str,
        output: list[OutputItem],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Stores the response ``status`` and returns it; :class:`_Stopped` when it was
        deleted meanwhile (the record deleted again)."""
        response = response_object(job.prepared, status, output, usage, error)
        response["background"] = True
        if not await self._save_unless_deleted(stored_record(job.prepared, response, output)):
            raise _Stopped
        return response

    async def _stopped(self, job: _Job, run: generation.GenerationRun) -> None:
        """Another party claimed the end: a cancel is stored here with the output so far,
        and so is a reader's failure (it found the lease ended while this replica still ran
        it, and this run may have stored it since); a delete stores nothing."""
        assert job.writer is not None
        ended = await self.runs.ended(job.owner, job.id)
        if ended == "cancelled":
            await self._store(job, "cancelled", _so_far(job.writer), run.usage())
        elif ended == "failed":
            error = {
                "code": LOST,
                "message": "The gateway replica that ran this background response did not "
                "renew its lease in time.",
            }
            await self._store(job, "failed", _so_far(job.writer), run.usage(), error)

    async def _failed(
        self, job: _Job, run: generation.GenerationRun, code: str, message: str
    ) -> None:
        """The run failed (even after it claimed its end): stored ``failed`` with its
        error, logged as ``error`` and ``response.failed``, unless another party claimed
        the end first."""
        if not await self.runs.claim(job.owner, job.id, "failed", "run"):
            await self._stopped(job, run)
            return
        assert job.writer is not None
        writer = job.writer
        error = {"code": code, "message": message}
        try:
            failed = await self._store(job, "failed", writer.output, run.usage(), error)
        except InvalidRequestError:  # the output made the record too large: stored without
            failed = await self._store(job, "failed", [], run.usage(), error)
        for sse in (
            writer.event("error", code=code, message=message, param=None),
            writer.event("response.failed", response=failed),
        ):
            if not await self.runs.append(job.owner, job.id, job.logged, sse, "run"):
                return
            job.logged += 1

    async def _end(self, job: _Job) -> None:
        """Whatever way the run ended: its place freed, its log ended and counted (neither
        kept nor counted once deleted), its admission settled. Never raises."""
        self._jobs.pop(job.id, None)
        owner, entry = job.owner, log_entry(job.id)
        stored_bytes = self.store.stored_bytes
        try:
            await self.runs.stop(owner, job.id)
            ended = await self.runs.ended(owner, job.id)
            if ended != DELETED:
                if ended is not None:  # else stopped unended (Redis failed): a reader fails it
                    await self.runs.close(owner, job.id, job.logged)
                await stored_bytes.put(owner, entry, job.log_bytes, self.store.ttl_s, job.log_hold)
                job.log_hold = None
                ended = await self.runs.ended(owner, job.id)  # deleted while it ended?
            if ended == DELETED:
                await stored_bytes.release(job.log_hold)
                await stored_bytes.drop(owner, entry)
            await self.responses._give_back(job.prepared)
        except Exception as exc:
            logger.warning("background response %s did not end cleanly: %s", job.id, exc)
        finally:
            job.changed.set()
            await self.settle(job.admission)

    async def close(self) -> None:
        """Stops the responses this replica runs, as it stops (before Redis is closed):
        each is stored ``failed`` (``server_shutdown``), its log ended, its usage settled;
        waits :data:`SHUTDOWN_WAIT_S` at most (one still running is then failed by a
        reader once its lease ends)."""
        jobs = list(self._jobs.values())
        for job in jobs:
            self._stop(job, "shutdown")
        tasks = [job.task for job in jobs if job.task is not None]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_S)
        if late:
            logger.warning("%d background responses did not stop in time", len(late))


def _so_far(writer: StreamWriter) -> list[OutputItem]:
    """The output written so far: the items done, and the text of a message cut short."""
    item = writer.open
    if not isinstance(item, MessageItem):
        return writer.output
    cut = MessageItem.done(item.id, writer.open_text, "incomplete", writer.logprobs)
    return [*writer.output, cut]
