"""The batch worker of one replica: every replica runs one, and together they drain every
batch (:mod:`gateway.state.batches` holds the work; :mod:`.service` makes the batches).

**Each tick** (:data:`TICK_S`, sooner when a line ends) the worker looks at every active
batch: it renews the leases of the lines it runs, claims more while the batch's model has
free slots here (``GATEWAY_BATCH_CONCURRENCY`` lines per model on each replica), stops its
lines of a batch that is cancelling, expired or finalizing, and finalizes a batch whose
lines are all answered (or whose finalizer died).

**A line** is served by this process's own app (:func:`.inprocess.call`) at the lowest
priority (:data:`BATCH_PRIORITY`: interactive requests go first wherever the scheduler
queues), under the batch's key: its allow-list, limits and budgets, as a live request.
An answer that says *try later* (429 over a rate limit, 503 overloaded) puts the line back
and pauses the batch on this replica for its ``Retry-After``; after
:data:`MAX_ATTEMPTS` such answers it is answered with the last one. Any other answer is
the line's result: 2xx to the output file, the rest (a 400 for a bad body, a 403 for a
model the key may not use, 429 ``budget_exceeded``) to the error file, as OpenAI's.

**The end.** The replica that answers the last line moves the batch to ``finalizing``,
takes its finalizer lock, writes the output and error files (purpose ``batch_output``,
counted in the key's stored bytes but never refused: the answers are paid for) and moves it
to ``completed``. A cancelled batch ends ``cancelled`` once no line is leased (the lines
running are stopped, as a client that leaves stops a request); an expired one ``expired``,
each line not answered in the error file (``batch_expired``). What finished is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp

from gateway import outages
from gateway.errors import GatewayError, NotFoundError, StoreUnavailableError
from gateway.metrics import Metrics
from gateway.serving.batches.inprocess import Answer, BatchCaller, call
from gateway.state.batches import KEEP_S, LEASE_S, BatchStore, Claimed
from gateway.state.files import FILES, FileStore, derived_file_id
from gateway.state.stored_bytes import StoredBytes

logger = logging.getLogger("gateway")

#: How often the worker looks at the batches, at most.
TICK_S = 0.5
#: The priority of a batch's requests: the latest there is (docs/scheduling.md).
BATCH_PRIORITY = 100
#: Answers that say *try later* a line takes before it is answered with the last one.
MAX_ATTEMPTS = 20
#: The longest a batch pauses on this replica after a *try later* answer.
MAX_PAUSE_S = 30.0
#: How often the worker reads the bytes in every key's files (``gateway_files_bytes``).
FILES_GAUGE_S = 10.0


class BatchWorker:
    """Runs batch lines on this replica (see the module's docstring)."""

    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        stored_bytes: StoredBytes,
        metrics: Metrics,
        concurrency: int,
        tick_s: float = TICK_S,
        lease_s: float = LEASE_S,
        max_output_bytes: int = 32 << 20,
    ) -> None:
        self.max_output_bytes = max_output_bytes
        """The most bytes of results one batch keeps (``GATEWAY_MAX_FILE_MB``): a result
        past it is answered ``batch_output_too_large`` instead."""
        self.store = store
        self.files = files
        self.stored_bytes = stored_bytes
        self.metrics = metrics
        self.concurrency = concurrency
        self.tick_s = tick_s
        self.lease_s = lease_s
        self.name = uuid.uuid4().hex
        self._app: ASGIApp | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._in_flight: dict[str, int] = {}
        """Lines running here, per model."""
        self._running: dict[str, dict[int, asyncio.Task[None]]] = {}
        """Lines running here, per batch, by index."""
        self._paused: dict[str, float] = {}
        self._finalizing: set[str] = set()
        self._files_read_at = -FILES_GAUGE_S
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        """Finalizations started by a line's end (kept until they end)."""

    def start(self, app: ASGIApp) -> None:
        self._app = app
        self._closing = False
        self._loop_task = asyncio.create_task(self._loop(), name="batch-worker")

    async def close(self) -> None:
        """Stops the worker and its lines, whose leases it gives back (another replica takes
        them at once rather than after a lease)."""
        self._closing = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for batch_id in list(self._running):
            with contextlib.suppress(Exception):
                await self._stop_lines(batch_id)

    async def _loop(self) -> None:
        # No wait for a Redis coming back (outages.py): the next tick is the retry, and the
        # waits the metrics count stay the requests'.
        outages.begin(0.0)
        this = asyncio.current_task()
        while not self._closing:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A cancel that reached a Redis call can come out as another error: stop.
                if self._closing or (this is not None and this.cancelling()):
                    raise asyncio.CancelledError from exc
                if not isinstance(exc, StoreUnavailableError):  # Redis away: /health says so
                    logger.exception("batch worker: a tick failed; the next one tries again")
            # The next tick, or a line's end, whichever comes first.
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({woken}, timeout=self.tick_s)
            finally:
                woken.cancel()
            self._wake.clear()

    async def _tick(self) -> None:
        batches = []
        active = await self.store.active()
        for batch_id in active:
            try:
                batches.append(await self.store.get(None, batch_id))
            except NotFoundError:  # its keys expired
                await self.store.retire(batch_id, None)
        # The slots of a model are shared among its batches running (each claims its share
        # first; what one leaves, the next may take), so one key's large batch does not
        # hold every slot while another's waits.
        running: dict[str, int] = {}
        for batch in batches:
            if batch["status"] == "in_progress":
                running[batch["model"]] = running.get(batch["model"], 0) + 1
        for batch in batches:
            share = max(1, -(-self.concurrency // running.get(batch["model"], 1)))
            await self._step(batch, share)
        self.metrics.batch_lines_queued.set(await self.store.queued(active))
        if time.monotonic() >= self._files_read_at + FILES_GAUGE_S:
            self._files_read_at = time.monotonic()
            self.metrics.files_bytes.set(await self.stored_bytes.fleet_used(FILES))

    async def _step(self, batch: dict[str, Any], share: int) -> None:
        batch_id, status = batch["id"], batch["status"]
        running = self._running.get(batch_id, {})
        if status != "in_progress":
            await self._stop_lines(batch_id)
        elif running:
            await self.store.renew(batch_id, list(running), self.lease_s)
        if status == "in_progress":
            if time.time() >= batch["expires_at"]:
                await self._stop_lines(batch_id)
                if await self.store.move(batch_id, "finalizing", "in_progress"):
                    self._finalize_soon(batch_id)
                return
            if self._paused.get(batch_id, 0.0) > time.monotonic():
                return
            model = batch["model"]
            mine = len(self._running.get(batch_id, {}))
            free = min(self.concurrency - self._in_flight.get(model, 0), share - mine)
            if free > 0:
                for claimed in await self.store.claim(batch_id, free, self.lease_s):
                    self._start_line(batch, claimed)
        elif status == "cancelling":
            if await self.store.leased(batch_id) == 0 and await self.store.move(
                batch_id, "finalizing", "cancelling"
            ):
                self._finalize_soon(batch_id)
        elif status == "finalizing":
            self._finalize_soon(batch_id)
        else:  # ended (its finalizer died before it retired it)
            await self.store.retire(batch_id, batch["owner"])

    def _start_line(self, batch: dict[str, Any], claimed: Claimed) -> None:
        model = batch["model"]
        self._in_flight[model] = self._in_flight.get(model, 0) + 1
        task = asyncio.create_task(self._guarded(batch, claimed))
        self._running.setdefault(batch["id"], {})[claimed.index] = task

        def done(_: asyncio.Task[None]) -> None:
            self._in_flight[model] -= 1
            lines = self._running.get(batch["id"], {})
            lines.pop(claimed.index, None)
            if not lines:
                self._running.pop(batch["id"], None)
            self._wake.set()

        task.add_done_callback(done)

    async def _stop_lines(self, batch_id: str) -> None:
        """Stops this replica's lines of the batch and gives their leases back."""
        lines = self._running.get(batch_id, {})
        if not lines:
            return
        indexes, tasks = list(lines), list(lines.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.release(batch_id, indexes)

    async def _guarded(self, batch: dict[str, Any], claimed: Claimed) -> None:
        """A line, its failure logged: its lease ends and another claim runs it again (Redis
        away when its result was to be written, say)."""
        try:
            await self._line(batch, claimed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, StoreUnavailableError):
                logger.exception("batch %s: line %d failed", batch["id"], claimed.index)

    async def _line(self, batch: dict[str, Any], claimed: Claimed) -> None:
        batch_id = batch["id"]
        item = json.loads(claimed.line)
        body = dict(item["body"])
        body["priority"] = BATCH_PRIORITY
        caller = BatchCaller(batch["owner"], batch["key_hash"])
        request_id = secrets.token_hex(16)
        assert self._app is not None
        try:
            answer = await call(
                self._app, batch["endpoint"], json.dumps(body).encode(), caller, request_id
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("batch %s: line %d failed in the gateway", batch_id, claimed.index)
            answer = Answer(
                500, {}, b'{"error": {"message": "The gateway failed.", "type": "server_error"}}'
            )
        if _error_code(answer) == "shutting_down":  # this replica drains: others take it
            await self.store.release(batch_id, [claimed.index])
            self._paused[batch_id] = time.monotonic() + MAX_PAUSE_S
            return
        if _later(answer):
            left = await self.store.retry(batch_id, claimed.index, MAX_ATTEMPTS)
            if left == 0:
                return  # answered elsewhere meanwhile
            if left > 0:
                wait = min(float(answer.headers.get("retry-after", "1") or 1), MAX_PAUSE_S)
                self._paused[batch_id] = time.monotonic() + wait
                self.metrics.batch_lines.labels("retried").inc()
                return
        ok = 200 <= answer.status < 300
        result, tokens = _result(item["custom_id"], answer, request_id)
        short = _failed_line(
            item["custom_id"],
            "batch_output_too_large",
            f"The batch's results reached {self.max_output_bytes >> 20} MB "
            "(GATEWAY_MAX_FILE_MB): this answer was dropped.",
        )
        left = await self.store.finish(
            batch_id, claimed.index, ok, result, tokens, self.max_output_bytes, short
        )
        if left < 0:
            return  # answered elsewhere meanwhile: this result is dropped
        self.metrics.batch_lines.labels("completed" if ok else "failed").inc()
        if left == 0 and await self.store.move(batch_id, "finalizing", "in_progress"):
            self._finalize_soon(batch_id)

    def _finalize_soon(self, batch_id: str) -> None:
        """Finalizes the batch in a task of its own (the tick goes on renewing leases)."""
        if batch_id in self._finalizing:
            return
        task = asyncio.create_task(self._finalize(batch_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finalize(self, batch_id: str) -> None:
        if batch_id in self._finalizing:
            return
        self._finalizing.add(batch_id)
        try:
            if await self.store.finalizer(batch_id, self.name):
                await self._write_results(batch_id)
        except GatewayError:
            logger.exception("batch %s: finalizing failed; another tries later", batch_id)
        finally:
            self._finalizing.discard(batch_id)

    async def _write_results(self, batch_id: str) -> None:
        batch = await self.store.get(None, batch_id)
        owner, counts = batch["owner"], batch["counts"]
        answered = counts.get("completed", 0) + counts.get("failed", 0)
        if "cancelling_at" in batch["times"]:
            end = "cancelled"
        elif answered >= counts.get("total", 0):
            end = "completed"
        else:
            end = "expired"
            for claimed in await self.store.unanswered(batch_id):
                expired = _failed_line(
                    json.loads(claimed.line)["custom_id"],
                    "batch_expired",
                    "This request could not be executed before the completion window expired.",
                )
                cap = self.max_output_bytes + len(expired)  # an expired line is always said
                if (
                    await self.store.finish(
                        batch_id, claimed.index, False, expired, (0, 0, 0), cap, expired
                    )
                    >= 0
                ):
                    self.metrics.batch_lines.labels("expired").inc()
        output, errors = await self.store.results(batch_id)
        expires = batch.get("output_expires_after")
        files: dict[str, str] = {}
        for name, lines in (("output", output), ("error", errors)):
            if not lines:
                continue
            file_id = derived_file_id(batch_id, name)
            try:  # written whole by a finalizer that died before the end (its record last)
                await self.files.get(owner, file_id)
            except NotFoundError:
                await self.files.create(
                    owner,
                    "batch_output",
                    f"{batch_id}_{name}.jsonl",
                    _chunks(lines),
                    expires_after_s=expires,
                    quota=False,
                    file_id=file_id,
                )
            files[f"{name}_file_id"] = file_id
        keep = max(int(batch["expires_at"] - time.time()), 0) + KEEP_S
        await self.store.set_files(batch_id, files, keep)
        await self.store.move(batch_id, end, "finalizing")
        await self.store.retire(batch_id, owner)
        await self.stored_bytes.drop(owner, f"batch:{batch_id}")
        self.metrics.batches.labels(end).inc()


def _error_code(answer: Answer) -> str | None:
    """The ``code`` of an error answer's body, if it has one."""
    if answer.status < 400:
        return None
    with contextlib.suppress(ValueError, KeyError, AttributeError, TypeError):
        return str(json.loads(answer.body)["error"]["code"])
    return None


def _later(answer: Answer) -> bool:
    """Whether the answer says to try again later: a rate limit (not a spent budget), or
    the gateway or its backend overloaded or away."""
    if answer.status == 503:
        return True
    return answer.status == 429 and _error_code(answer) != "budget_exceeded"


def _result(custom_id: str, answer: Answer, request_id: str) -> tuple[str, tuple[int, int, int]]:
    """The output (or error) file's line for ``answer``, and its tokens (input, output,
    reasoning)."""
    try:
        body: Any = json.loads(answer.body)
    except ValueError:
        body = {"error": {"message": answer.body.decode("utf-8", "replace")[:2000]}}
    line = {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": {
            "status_code": answer.status,
            "request_id": answer.headers.get("x-request-id", request_id),
            "body": body,
        },
        "error": None,
    }
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = (0, 0, 0)
    if isinstance(usage, dict):
        details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
        tokens = (
            int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0),
            int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0),
            int((details or {}).get("reasoning_tokens", 0) or 0),
        )
    return json.dumps(line), tokens


def _failed_line(custom_id: str, code: str, message: str) -> str:
    """An error file's line for a request the batch did not answer (``response`` null)."""
    return json.dumps(
        {
            "id": f"batch_req_{secrets.token_hex(12)}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


async def _chunks(lines: list[str]) -> AsyncIterator[bytes]:
    """The lines as a JSONL file, in pieces of about 1 MiB."""
    piece: list[str] = []
    size = 0
    for line in lines:
        piece.append(line)
        size += len(line) + 1
        if size >= 1 << 20:
            yield ("\n".join(piece) + "\n").encode()
            piece, size = [], 0
    if piece:
        yield ("\n".join(piece) + "\n").encode()
