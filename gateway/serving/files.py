"""The Files API (``/v1/files``), as openai-python types it: upload (multipart), list,
retrieve, download the content, delete; per key, stored by
:class:`gateway.state.files.FileStore` (where the bytes live, the lifetime, the quota).

**Purposes.** ``batch`` (a Batch API input), ``user_data`` and ``evals`` are uploaded;
``batch_output`` is only made by the gateway (a batch's results and errors), and uploading
one is a 400 as at OpenAI. ``assistants``, ``vision`` and ``fine-tune`` name APIs the
gateway does not serve (no Assistants, no fine-tuning), so a file for them could never be
used: a 400 ``unsupported_value`` naming ``purpose``, rather than bytes kept for nothing.
``list``'s ``purpose`` filter takes any purpose OpenAI defines (one nothing here makes
lists nothing).

**A ``batch`` file is JSONL**, checked as it is stored, one line at a time (never the whole
file parsed at once): each line that is not blank is one JSON object, valid UTF-8, within
the request body's bounds (``GATEWAY_MAX_JSON_*``, :mod:`gateway.serving.json_shape`) and
without a lone surrogate; else a 400 naming ``file`` and the line, and nothing is kept.
Blank lines are skipped. Whether each line is a valid batch request is the Batch API's to
check, when a batch is created.

**Bounds.** The file is at most ``GATEWAY_MAX_FILE_MB`` (413 ``file_too_large``, before
anything is stored when the upload's size is known); its name at most
:data:`MAX_FILENAME_CHARS` characters; ``expires_after.seconds`` 3600 to 2592000.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field, model_validator

from gateway.errors import InvalidRequestError, PayloadTooLargeError
from gateway.serving.json_shape import JsonLimits, json_shape, surrogate_refusal
from gateway.serving.protocol import Strict
from gateway.serving.protocol.common import bracketed, list_page
from gateway.state.files import MAX_EXPIRES_S, MIN_EXPIRES_S, FileStore

#: What a client may upload.
UPLOADED = ("batch", "user_data", "evals")
#: What only the gateway makes.
MADE = ("batch_output",)
#: OpenAI's purposes for APIs the gateway does not serve, and why they are refused.
UNSERVED = {
    "assistants": "the gateway has no Assistants API",
    "vision": "the gateway does no fine-tuning",
    "fine-tune": "the gateway does no fine-tuning",
}
#: Every purpose ``list`` filters by (OpenAI's).
LISTED = (
    *UPLOADED,
    *MADE,
    *UNSERVED,
    "assistants_output",
    "fine-tune-results",
)
MAX_FILENAME_CHARS = 255
#: The name of an upload that carries none.
DEFAULT_FILENAME = "file"
#: The longest ``expires_after`` sent as JSON text that is parsed.
_EXPIRES_TEXT_CHARS = 256
#: Pieces at most this large are checked on the event loop; larger ones in a thread.
_CHECKED_INLINE_BYTES = 256 * 1024


class ExpiresAfter(Strict):
    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRES_S, le=MAX_EXPIRES_S)


class FileCreate(Strict):
    """The form fields of ``POST /v1/files`` but the file. The SDKs send ``expires_after``
    as ``expires_after[anchor]`` and ``expires_after[seconds]`` fields; curl's ``-F`` may
    send it as JSON text."""

    purpose: str
    expires_after: ExpiresAfter | None = None

    @model_validator(mode="before")
    @classmethod
    def _expires_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields, nested = bracketed(data, "expires_after")
        raw = fields.get("expires_after")
        if nested:
            fields["expires_after"] = nested
        elif isinstance(raw, str) and len(raw) <= _EXPIRES_TEXT_CHARS:
            # Longer text is no such object (and JSON nested thousands deep would make the
            # parser recurse until it fails): left as text, refused as one naming the field.
            with contextlib.suppress(ValueError):
                fields["expires_after"] = json.loads(raw)
        return fields


def upload_purpose(purpose: str) -> str:
    """``purpose`` when a client may upload a file for it, else the 400."""
    if purpose in UPLOADED:
        return purpose
    if purpose in MADE:
        raise InvalidRequestError(
            f"Files with purpose '{purpose}' are made by the gateway (a batch's output); "
            f"upload one of: {', '.join(UPLOADED)}.",
            param="purpose",
        )
    if purpose in UNSERVED:
        raise InvalidRequestError(
            f"purpose '{purpose}' is not supported by this gateway: {UNSERVED[purpose]}. "
            f"Upload one of: {', '.join(UPLOADED)}.",
            param="purpose",
            code="unsupported_value",
        )
    raise InvalidRequestError(
        f"Invalid purpose '{purpose}': one of {', '.join(UPLOADED)}.", param="purpose"
    )


def listed_purpose(purpose: str | None) -> str | None:
    if purpose is None or purpose in LISTED:
        return purpose
    raise InvalidRequestError(
        f"Invalid purpose '{purpose}': one of {', '.join(LISTED)}.", param="purpose"
    )


def upload_filename(filename: str | None) -> str:
    name = filename or DEFAULT_FILENAME
    if len(name) > MAX_FILENAME_CHARS:
        raise InvalidRequestError(
            f"The file's name has {len(name)} characters; at most {MAX_FILENAME_CHARS}.",
            param="file",
        )
    return name


class JsonlCheck:
    """The lines of a ``batch`` file, checked as its bytes arrive (:meth:`feed`, then
    :meth:`end`): each line but a blank one is one JSON object (see the module's
    docstring). Only the line being read is kept."""

    def __init__(self, limits: JsonLimits, max_lines: int) -> None:
        self.limits = limits
        self.max_lines = max_lines
        """The most lines a file may have, blank ones included (``GATEWAY_MAX_BATCH_LINES``:
        a batch runs no more), so that a file of tiny lines costs a bounded time to check."""
        self.number = 1
        """The number of the line being read (from 1)."""
        self.objects = 0
        self._pending: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._pending.append(chunk[start:end])
            self._line(b"".join(self._pending))
            self._pending = []
            start = end + 1
        if start < len(chunk):
            self._pending.append(chunk[start:])

    def end(self) -> None:
        if self._pending:
            self._line(b"".join(self._pending))
            self._pending = []
        if not self.objects:
            raise InvalidRequestError(
                "The file holds no line: a batch file holds one JSON object (a request) per line.",
                param="file",
                code="invalid_file_format",
            )

    def _line(self, line: bytes) -> None:
        number = self.number
        self.number += 1
        if number > self.max_lines:
            raise InvalidRequestError(
                f"The file has more than {self.max_lines} lines: a batch file holds at most "
                f"{self.max_lines} requests (GATEWAY_MAX_BATCH_LINES), one per line.",
                param="file",
                code="too_many_lines",
            )
        if not line.strip():
            return
        try:
            jsonl_object(line, self.limits, f"Line {number} of the file")
        except BadLine as exc:
            if exc.code == "invalid_file_format":
                raise _not_jsonl(exc.message) from None
            raise InvalidRequestError(exc.message, param="file", code=exc.code) from None
        self.objects += 1


class BadLine(Exception):
    """A line of a JSONL file refused: past the JSON bounds (``code`` theirs) or not a JSON
    object (``code`` ``invalid_file_format``), and why (``message``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def jsonl_object(line: bytes, limits: JsonLimits, subject: str) -> dict[str, Any]:
    """One line of a JSONL file (not blank) as the JSON object it holds, ``subject``
    naming it in the :class:`BadLine` raised when it is not one: past the JSON bounds
    (their code), not UTF-8, a lone surrogate, not JSON, or not an object
    (``invalid_file_format``). The upload's check and a batch's read use it alike."""
    line = line.strip()
    refused = limits.refusal(json_shape(line, limits), subject)
    if refused is not None:
        raise BadLine(*refused)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise BadLine(f"{subject} is not UTF-8 text.", "invalid_file_format") from None
    lone = surrogate_refusal(line, subject)
    if lone is not None:
        raise BadLine(lone, "invalid_file_format")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"{subject} is not valid JSON ({exc.msg}).", "invalid_file_format") from None
    if not isinstance(value, dict):
        raise BadLine(f"{subject} is not a JSON object.", "invalid_file_format")
    return value


def _not_jsonl(message: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{message} A batch file is JSONL: one JSON object (a request) per line.",
        param="file",
        code="invalid_file_format",
    )


async def jsonl_checked(
    chunks: AsyncIterator[bytes], limits: JsonLimits, max_lines: int
) -> AsyncIterator[bytes]:
    """``chunks``, each passed on once its complete lines were checked (a 400 at the first
    line that is not a JSON object, or past ``max_lines`` lines)."""
    check = JsonlCheck(limits, max_lines)
    async for chunk in chunks:
        if len(chunk) <= _CHECKED_INLINE_BYTES:
            check.feed(chunk)
        else:
            await asyncio.to_thread(check.feed, chunk)
        yield chunk
    check.end()


class FileService:
    def __init__(self, store: FileStore, json_limits: JsonLimits, max_batch_lines: int) -> None:
        self.store = store
        self.json_limits = json_limits
        self.max_batch_lines = max_batch_lines

    async def create(
        self,
        owner: str,
        form: FileCreate,
        filename: str | None,
        size: int | None,
        chunks: AsyncIterator[bytes],
    ) -> dict[str, Any]:
        """Stores an upload of ``owner``: ``size`` (when known beforehand) is checked before
        anything is stored, the bytes as they are stored."""
        purpose = upload_purpose(form.purpose)
        name = upload_filename(filename)
        if size is not None and size > self.store.max_bytes:
            raise PayloadTooLargeError(
                f"The file is {size:,} bytes; the largest this gateway stores is "
                f"{self.store.max_file_mb:g} MB (GATEWAY_MAX_FILE_MB).",
                param="file",
                code="file_too_large",
            )
        if purpose == "batch":
            chunks = jsonl_checked(chunks, self.json_limits, self.max_batch_lines)
        expires = form.expires_after.seconds if form.expires_after is not None else None
        return await self.store.create(owner, purpose, name, chunks, expires_after_s=expires)

    async def list(
        self, owner: str, purpose: str | None, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        data, more = await self.store.list(
            owner, purpose=listed_purpose(purpose), after=after, limit=limit, order=order
        )
        return list_page(data, more)

    async def get(self, owner: str, file_id: str) -> dict[str, Any]:
        return await self.store.get(owner, file_id)

    def content(self, owner: str, file_id: str) -> AsyncIterator[bytes]:
        return self.store.chunks(owner, file_id)

    async def delete(self, owner: str, file_id: str) -> dict[str, Any]:
        return await self.store.delete(owner, file_id)
