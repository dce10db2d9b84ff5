"""/v1/files: upload (multipart), list, retrieve, content, delete (the caller's own files;
another key's file is a 404). What each does: :mod:`gateway.serving.files`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import Field

from gateway.api.auth import CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.serving.files import FileCreate
from gateway.state.file_blobs import CHUNK_BYTES

router = APIRouter(prefix="/v1/files", tags=["files"])


class FileForm(FileCreate):
    """The whole multipart form, so that a field it does not declare is refused too."""

    file: UploadFile = Field(description="The file: JSONL for purpose batch")


@router.post("")
async def create_file(
    caller: CallerDep, services: ServicesDep, form: Annotated[FileForm, Form()]
) -> dict[str, Any]:
    upload = form.file
    return await services.files.create(caller.id, form, upload.filename, upload.size, _read(upload))


@router.get("")
async def list_files(
    caller: CallerDep,
    services: ServicesDep,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    """The caller's files, newest first by default, paginated as OpenAI lists are
    (``after`` a file id)."""
    return await services.files.list(caller.id, purpose, after, limit, order)


@router.get("/{file_id}")
async def get_file(file_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return await services.files.get(caller.id, file_id)


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The bytes"}},
)
async def file_content(file_id: str, caller: CallerDep, services: ServicesDep) -> StreamingResponse:
    """The file's bytes, streamed as they are read. The first piece is read before the
    answer starts, so a file gone meanwhile is its 404, and bytes that cannot be read its
    503, rather than a 200 cut short."""
    found = await services.files.get(caller.id, file_id)
    pieces = services.files.content(caller.id, file_id)
    first = await anext(pieces, b"")
    return StreamingResponse(
        _then(first, pieces),
        media_type="application/octet-stream",
        headers={"Content-Length": str(found["bytes"])},
    )


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for piece in rest:
        yield piece


@router.delete("/{file_id}")
async def delete_file(file_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return await services.files.delete(caller.id, file_id)


async def _read(upload: UploadFile) -> AsyncIterator[bytes]:
    """The uploaded file (spooled by the form parser), 1 MiB at a time."""
    while piece := await upload.read(CHUNK_BYTES):
        yield piece
