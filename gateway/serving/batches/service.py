"""``/v1/batches``: a batch made from an uploaded JSONL file, read back, listed and
cancelled (the work: :mod:`gateway.serving.batches.worker`; the store:
:mod:`gateway.state.batches`).

**Making one.** The input file (``purpose: batch``, the caller's) is read and each line is
checked for what the batch itself needs: a JSON object (measured before it is parsed, as a
request body is) with a ``custom_id`` unique in the file, ``method: POST``, the batch's
``url``, a ``body`` object naming a ``model``, the same model on every line (as OpenAI
requires). A file that breaks one of these is a batch that ``failed`` at once, its
``errors`` naming the lines (at most :data:`MAX_ERRORS`). What a request's body holds is
checked by the endpoint itself when the line runs, as for a live request: a bad body is a
400 in the error file, the other lines are answered.

**Bounds.** At most ``GATEWAY_MAX_BATCH_LINES`` lines (OpenAI's 50,000), the file at most
``GATEWAY_MAX_FILE_MB``; at most ``GATEWAY_MAX_BATCHES_PER_KEY`` batches of one key not yet
ended (429 ``too_many_batches``); the lines are held in Redis while the batch runs and
count in the key's stored bytes (403 ``storage_quota_exceeded`` past its quota).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import GatewayError, InvalidRequestError, NotFoundError, RateLimitError
from gateway.serving.files import BadLine, ExpiresAfter, jsonl_object
from gateway.serving.json_shape import JsonLimits
from gateway.serving.protocol.common import list_page
from gateway.state.batches import KEEP_S, LIVE, BatchStore, new_batch_id
from gateway.state.files import FileStore
from gateway.state.keys import ApiKey
from gateway.state.stored_bytes import RECORD_OVERHEAD, StoredBytes

#: The endpoints a batch's lines may call (OpenAI's others, moderations, images and
#: videos, are no endpoints here).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
#: The window a batch has to run: OpenAI's one value.
WINDOW_S = {"24h": 24 * 3600}
#: Line errors a failed batch lists, at most (each message names at most 64 characters of
#: what the client sent: the record stays a few tens of KB).
MAX_ERRORS = 100
#: The longest model name a line may give (the record keeps it).
MAX_MODEL_CHARS = 256


class BatchCreate(BaseModel):
    """``POST /v1/batches`` (openai-python's ``BatchCreateParams``)."""

    model_config = ConfigDict(extra="forbid")
    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=64)
    completion_window: Literal["24h"]
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    output_expires_after: ExpiresAfter | None = None


class BatchService:
    """Makes, reads, lists and cancels batches (see the module's docstring)."""

    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        stored_bytes: StoredBytes,
        json_limits: JsonLimits,
        max_lines: int,
        max_per_key: int,
    ) -> None:
        self.store = store
        self.files = files
        self.stored_bytes = stored_bytes
        self.json_limits = json_limits
        self.max_lines = max_lines
        self.max_per_key = max_per_key
        self._reading = asyncio.Semaphore(1)
        """One input file read and checked at a time on this replica (up to 32 MB each)."""

    async def create(self, caller: ApiKey, key_hash: str, body: BatchCreate) -> dict[str, Any]:
        if body.endpoint not in ENDPOINTS:
            raise InvalidRequestError(
                f"Batches here call {', '.join(ENDPOINTS)}; '{body.endpoint}' is not served.",
                param="endpoint",
                code="unsupported_value",
            )
        for key in body.metadata or {}:
            if len(key) > 64:
                raise InvalidRequestError(
                    "metadata keys are at most 64 characters.", param="metadata"
                )
        try:
            found = await self.files.get(caller.id, body.input_file_id)
        except NotFoundError as exc:
            raise NotFoundError(exc.message, param="input_file_id") from None
        if found["purpose"] != "batch":
            raise InvalidRequestError(
                f"The file '{body.input_file_id}' was uploaded with purpose "
                f"'{found['purpose']}'; a batch reads a file of purpose 'batch'.",
                param="input_file_id",
            )
        now = int(time.time())
        window = WINDOW_S[body.completion_window]
        batch_id = new_batch_id()
        # The key's room (a live batch, the lines' bytes: about the file's) is taken before
        # the file is read, and a replica reads one file at a time: refusals cost nothing.
        before = await self.store.admit_live(caller.id, batch_id, now + window, self.max_per_key)
        if before >= self.max_per_key:
            raise _too_many(before)
        entry = f"batch:{batch_id}"
        try:
            hold = await self.stored_bytes.hold(
                caller.id,
                entry,
                int(found["bytes"]) + RECORD_OVERHEAD,
                "input_file_id",
                "a smaller input file",
            )
        except BaseException:
            await self.store.forget_live(caller.id, batch_id)
            raise
        try:
            async with self._reading:
                data = await self.files.read(caller.id, body.input_file_id)
                lines, errors, model = await asyncio.to_thread(self._checked, data, body.endpoint)
                del data
            record: dict[str, Any] = {
                "id": batch_id,
                "object": "batch",
                "endpoint": body.endpoint,
                "input_file_id": body.input_file_id,
                "completion_window": body.completion_window,
                "created_at": now,
                "expires_at": now + window,
                "metadata": body.metadata,
                "model": model,
                "owner": caller.id,
                "key_hash": key_hash,
                "output_expires_after": body.output_expires_after.seconds
                if body.output_expires_after
                else None,
                "errors": {"object": "list", "data": errors} if errors else None,
            }
            ttl = window + KEEP_S
            if errors:  # a failed batch keeps its record (tens of KB at most), counted
                await self.store.forget_live(caller.id, batch_id)
                await self.store.create(record, "failed", [], ttl)
                size = len(json.dumps(record)) + RECORD_OVERHEAD
                await self.stored_bytes.put(caller.id, entry, size, ttl, hold)
            else:
                await self.store.create(record, "in_progress", lines, ttl)
                size = sum(len(line) for line in lines) + RECORD_OVERHEAD
                await self.stored_bytes.put(caller.id, entry, size, window, hold)
        except BaseException:
            await self.store.forget_live(caller.id, batch_id)
            raise
        finally:
            await self.stored_bytes.release(hold)
        return public(await self.store.get(caller.id, batch_id))

    async def live(self, owner: str) -> int:
        """How many of the key's batches have not ended."""
        return await self.store.live(owner)

    def _checked(self, data: bytes, endpoint: str) -> tuple[list[str], list[dict[str, Any]], str]:
        """The file's lines to run, the errors that fail the batch (none: it runs) and the
        model every line names."""
        lines: list[str] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        models: dict[str, None] = {}  # in the order the lines name them

        def error(number: int | None, code: str, message: str, param: str | None = None) -> None:
            if len(errors) < MAX_ERRORS:
                errors.append({"code": code, "line": number, "message": message, "param": param})

        for number, raw in enumerate(_lines(data), start=1):
            if len(errors) >= MAX_ERRORS:
                break  # it fails: the rest need no reading
            if number > self.max_lines:  # every line counts, as the upload's check counts
                error(
                    number,
                    "too_many_lines",
                    f"A batch holds at most {self.max_lines} requests (GATEWAY_MAX_BATCH_LINES).",
                )
                break
            if not raw.strip():
                continue
            try:  # the upload's check passed it; read it the same way
                item = jsonl_object(raw, self.json_limits, "This line")
            except BadLine as exc:
                bounds = exc.code != "invalid_file_format"  # else not a JSON object
                error(number, exc.code if bounds else "invalid_json_line", exc.message)
                continue
            problem = _line_problem(item, endpoint, seen)
            if problem is not None:
                error(number, *problem)
                continue
            seen.add(item["custom_id"])
            models.setdefault(item["body"]["model"], None)
            lines.append(raw.strip().decode())
        if not lines and not errors:
            error(None, "empty_file", "The input file holds no request.")
        if len(models) > 1:
            error(
                None,
                "mismatched_model",
                f"Every request of a batch names the same model; this file names "
                f"{len(models)}: {', '.join(list(models)[:5])}.",
                "model",
            )
        return lines, errors, next(iter(models), "")

    async def running(self) -> list[dict[str, Any]]:
        """Every batch not yet ended, whoever's (the admin's view): each as the API shows
        it, with the key that made it."""
        shown = []
        for batch_id in await self.store.active():
            try:
                found = await self.store.get(None, batch_id)
            except GatewayError:
                continue
            if found["status"] in LIVE:  # not one that ended a moment ago
                shown.append({**public(found), "owner": found["owner"]})
        return shown

    async def get(self, owner: str, batch_id: str) -> dict[str, Any]:
        return public(await self.store.get(owner, batch_id))

    async def list(self, owner: str, after: str | None, limit: int) -> dict[str, Any]:
        ids, more = await self.store.page(owner, after, limit)
        data = []
        for batch_id in ids:
            try:
                data.append(public(await self.store.get(owner, batch_id)))
            except GatewayError:
                continue  # expired meanwhile
        return list_page(data, more)

    async def cancel(self, owner: str, batch_id: str) -> dict[str, Any]:
        found = await self.store.get(owner, batch_id)
        if found["status"] not in ("cancelling", "cancelled"):
            moved = await self.store.move(batch_id, "cancelling", "validating", "in_progress")
            if not moved:
                status = (await self.store.get(owner, batch_id))["status"]
                if status not in ("cancelling", "cancelled"):
                    raise InvalidRequestError(
                        f"This batch is {status}: only a batch that is validating or in "
                        "progress can be cancelled.",
                        param="batch_id",
                        code="batch_not_cancellable",
                    )
        return public(await self.store.get(owner, batch_id))


def _too_many(live: int) -> RateLimitError:
    refused = RateLimitError(
        f"This key has {live} batches not yet ended, the most one key may have "
        "(GATEWAY_MAX_BATCHES_PER_KEY); wait for one to end or cancel one.",
        "batches",
        60.0,
        # The SDKs would wait out the Retry-After twice: a batch ends in minutes or hours.
        {"x-should-retry": "false"},
    )
    refused.code = "too_many_batches"
    return refused


def _line_problem(item: Any, endpoint: str, seen: set[str]) -> tuple[str, str, str] | None:
    """Why a parsed line cannot run: (code, message, param), or None."""
    if not isinstance(item, dict):
        return "invalid_json_line", "Each line is a JSON object.", "line"
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return (
            "missing_custom_id",
            "Each line needs a custom_id: a string of 1 to 512 characters.",
            "custom_id",
        )
    if custom_id in seen:
        return (
            "duplicate_custom_id",
            f"The custom_id '{custom_id[:64]}' is on an earlier line too.",
            "custom_id",
        )
    if item.get("method") != "POST":
        return "invalid_method", "Each line's method is POST.", "method"
    if item.get("url") != endpoint:
        return (
            "invalid_url",
            f"Each line's url is the batch's endpoint, '{endpoint}'.",
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "invalid_body", "Each line's body is a JSON object naming a model.", "body"
    if not 0 < len(body["model"]) <= MAX_MODEL_CHARS:
        return "invalid_body", f"A model's name is 1 to {MAX_MODEL_CHARS} characters.", "body.model"
    if body.get("stream"):
        return (
            "invalid_body",
            "A batch's requests are not streamed: leave stream out.",
            "body.stream",
        )
    return None


def _lines(data: bytes) -> Iterator[bytes]:
    """The lines of ``data``, one at a time (no list of them all). Lines end at ``\n``
    only, as the upload's check reads them (a ``\r`` inside is the line's)."""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        yield data[start:end]
        start = end + 1
    if start < len(data):
        yield data[start:]


def public(stored: dict[str, Any]) -> dict[str, Any]:
    """The batch as the API shows it (openai-python's ``Batch``)."""
    times, counts, files = stored["times"], stored["counts"], stored["files"]
    inputs, outputs = counts.get("input_tokens", 0), counts.get("output_tokens", 0)
    shown = {
        name: stored[name]
        for name in (
            "id",
            "object",
            "endpoint",
            "input_file_id",
            "completion_window",
            "created_at",
            "expires_at",
            "metadata",
            "model",
            "errors",
        )
    }
    return {
        **shown,
        "status": stored["status"],
        "output_file_id": files.get("output_file_id"),
        "error_file_id": files.get("error_file_id"),
        **{
            f"{name}_at": times.get(f"{name}_at")
            for name in ("in_progress", "finalizing", "completed", "failed", "expired")
        },
        "cancelling_at": times.get("cancelling_at"),
        "cancelled_at": times.get("cancelled_at"),
        "request_counts": {
            "total": counts.get("total", 0),
            "completed": counts.get("completed", 0),
            "failed": counts.get("failed", 0),
        },
        "usage": {
            "input_tokens": inputs,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": outputs,
            "output_tokens_details": {"reasoning_tokens": counts.get("reasoning_tokens", 0)},
            "total_tokens": inputs + outputs,
        },
    }
