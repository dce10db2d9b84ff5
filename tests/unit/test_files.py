"""/v1/files through the official SDK against a real Redis: the round trip (upload, list,
retrieve, content, delete) with the bytes in Redis and in a directory, per-key isolation,
lifetimes, the size bound (the route's and the store's), the stored-bytes quota, purposes,
the JSONL check of a batch file, and the files the gateway makes (``quota=False``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi import FastAPI

from gateway.errors import PayloadTooLargeError
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.file_blobs import CHUNK_BYTES
from gateway.state.files import FileStore, derived_file_id
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import bearer, make_settings, new_key, sdk, serve

MB = 1024 * 1024
#: Every byte value, so that nothing on the way reads the file as text.
BINARY = bytes(range(256)) * (MB // 256)


def file_keys(server: EmbeddedRedis) -> list[bytes]:
    with redis.Redis.from_url(server.url) as client:
        return sorted(client.scan_iter("gw:file:*"))


async def used(http: httpx.AsyncClient, key: str | None = None) -> int:
    headers = bearer(key) if key else {}
    response = await http.get("/v1/me", headers=headers)
    assert response.status_code == 200, response.text
    return int(response.json()["storage"]["key"]["used_bytes"])


def store_of(app: FastAPI) -> FileStore:
    store: FileStore = app.state.services.file_store
    return store


async def pieces(data: bytes, size: int = 300_000) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("where", ["redis", "directory"])
async def test_round_trip(where: str, tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    directory = tmp_path / "files"
    settings = make_settings(files_dir=directory) if where == "directory" else make_settings()
    data = BINARY * 2 + b"tail"  # three pieces: 1 MiB, 1 MiB, 4 bytes
    async with serve(settings) as (_, http, client):
        made = await client.files.create(file=("data.bin", data), purpose="user_data")
        assert made.id.startswith("file-") and len(made.id) == 5 + 24
        assert made.object == "file" and made.bytes == len(data)
        assert made.filename == "data.bin" and made.purpose == "user_data"
        # Without expires_after it is kept GATEWAY_FILES_TTL_DAYS, which expires_at says.
        assert made.status == "processed" and made.expires_at == made.created_at + 30 * 86_400
        assert abs(made.created_at - time.time()) < 5
        assert (await client.files.retrieve(made.id)) == made
        listed = await client.files.list()
        assert [f.id for f in listed.data] == [made.id] and not listed.has_more
        assert (await client.files.content(made.id)).content == data
        assert await used(http) > len(data)

        if where == "redis":
            chunks = [k for k in file_keys(redis_server) if b":data:" in k]
            assert len(chunks) == 3
            with redis.Redis.from_url(redis_server.url) as plain:
                assert max(int(plain.strlen(k)) for k in chunks) == CHUNK_BYTES
        else:
            assert [p.name.split(".")[0] for p in directory.iterdir()] == [made.id]
            assert not any(b":data:" in k for k in file_keys(redis_server))

        deleted = await client.files.delete(made.id)
        assert deleted.id == made.id and deleted.deleted and deleted.object == "file"
        for call in (client.files.retrieve(made.id), client.files.content(made.id)):
            with pytest.raises(openai.NotFoundError):
                await call
        assert (await client.files.list()).data == []
        assert await used(http) == 0
        assert file_keys(redis_server) == []  # the emptied indexes too
        if where == "directory":
            assert list(directory.iterdir()) == []

        empty = await client.files.create(file=("empty.txt", b""), purpose="user_data")
        assert empty.bytes == 0 and (await client.files.content(empty.id)).content == b""


async def test_bytes_lost_from_the_directory_are_a_503_not_a_cut_200(tmp_path: Path) -> None:
    directory = tmp_path / "files"
    async with serve(make_settings(files_dir=directory)) as (_, http, client):
        made = await client.files.create(file=("data.bin", BINARY), purpose="user_data")
        for path in directory.iterdir():
            path.unlink()  # an operator's mistake, a volume not mounted on this replica
        answer = await http.get(f"/v1/files/{made.id}/content")
        assert answer.status_code == 503, answer.status_code
        assert answer.json()["error"]["code"] == "file_storage_unavailable"


async def test_another_key_sees_nothing(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    mine = await client.files.create(file=("a.txt", b"secret"), purpose="user_data")
    other = sdk(http, (await new_key(http))["key"])
    for call in (
        other.files.retrieve(mine.id),
        other.files.content(mine.id),
        other.files.delete(mine.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            await call
        assert refused.value.body["param"] == "file_id"  # type: ignore[index]
        assert mine.id in refused.value.message
    assert (await other.files.list()).data == []
    assert (await other.files.list(purpose="user_data")).data == []
    # Still there for its owner; an id of another form is as unknown.
    assert (await client.files.content(mine.id)).content == b"secret"
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve("file-../../etc")


async def test_list_pages_orders_and_purposes(client: openai.AsyncOpenAI) -> None:
    made = [
        await client.files.create(file=(f"{i}.txt", b"x"), purpose="user_data") for i in range(3)
    ]
    batch = await client.files.create(file=("b.jsonl", b'{"a": 1}\n'), purpose="batch")
    page = await client.files.list(limit=2)
    assert [f.id for f in page.data] == [batch.id, made[2].id] and page.has_more
    rest = await client.files.list(limit=2, after=page.data[-1].id)
    assert [f.id for f in rest.data] == [made[1].id, made[0].id] and not rest.has_more
    everything = [f.id async for f in client.files.list(limit=1, order="asc")]
    assert everything == [*(f.id for f in made), batch.id]
    assert [f.id for f in (await client.files.list(purpose="batch")).data] == [batch.id]
    assert (await client.files.list(purpose="batch_output")).data == []
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.list(purpose="nonsense")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.list(after="file-" + "0" * 24)
    assert refused.value.body["param"] == "after"  # type: ignore[index]


async def test_expires_after_sets_expires_at_and_the_ttl(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    made = await client.files.create(
        file=("a.txt", b"soon"),
        purpose="user_data",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert made.expires_at == made.created_at + 3600
    kept = await client.files.create(file=("b.txt", b"kept"), purpose="user_data")
    with redis.Redis.from_url(redis_server.url) as plain:
        ttl = {k: plain.ttl(k) for k in plain.scan_iter("gw:file:*:rec:*")}
    soon = next(t for k, t in ttl.items() if made.id.encode() in k)
    later = next(t for k, t in ttl.items() if kept.id.encode() in k)
    assert 3500 < soon <= 3600 and 30 * 86_400 - 100 < later <= 30 * 86_400
    # curl's -F sends it as JSON text.
    form = {"purpose": "user_data", "expires_after": '{"anchor": "created_at", "seconds": 7200}'}
    response = await http.post("/v1/files", data=form, files={"file": ("c.txt", b"c")})
    assert response.status_code == 200, response.text
    assert response.json()["expires_at"] == response.json()["created_at"] + 7200
    for seconds in (60, 2_592_001):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.files.create(
                file=("d.txt", b"d"),
                purpose="user_data",
                expires_after={"anchor": "created_at", "seconds": seconds},
            )
        assert "expires_after" in str(refused.value.body["param"])  # type: ignore[index]


async def test_purposes(client: openai.AsyncOpenAI) -> None:
    for purpose, code in (
        ("batch_output", "invalid_value"),
        ("assistants", "unsupported_value"),
        ("fine-tune", "unsupported_value"),
        ("vision", "unsupported_value"),
        ("nonsense", "invalid_value"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.files.create(file=("a.jsonl", b"{}\n"), purpose=purpose)  # type: ignore[arg-type]
        body: dict[str, Any] = refused.value.body  # type: ignore[assignment]
        assert (body["param"], body["code"]) == ("purpose", code), body
    made = await client.files.create(file=("e.jsonl", b'{"x": 1}'), purpose="evals")
    assert str(made.purpose) == "evals"  # (the SDK's FileObject does not list it, and takes it)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b'{"a": 1}\n[1, 2]\n', "Line 2"),
        (b'{"a": 1}\nnot json\n', "Line 2"),
        (b'{"a": 1}\r\n\r\n{"b": \n', "Line 3"),
        (b'{"a": "\\ud800"}\n', "Line 1"),
        (b'{"a": "\xff"}\n', "Line 1"),
        (b"[" * 200 + b"]" * 200 + b"\n", "Line 1"),
        (b"\n\n", "no line"),
    ],
)
async def test_a_batch_file_must_be_jsonl(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, data: bytes, line: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("b.jsonl", data), purpose="batch")
    body: dict[str, Any] = refused.value.body  # type: ignore[assignment]
    assert body["param"] == "file" and line in body["message"], body
    assert (await client.files.list()).data == [] and await used(http) == 0


async def test_a_large_batch_file_is_checked_as_it_is_stored(client: openai.AsyncOpenAI) -> None:
    line = b'{"custom_id": "r", "method": "POST", "body": {"text": "' + b"y" * 4000 + b'"}}\n'
    data = line * 600  # 2.4 MB, lines across pieces
    made = await client.files.create(file=("big.jsonl", data), purpose="batch")
    assert (await client.files.content(made.id)).content == data
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("bad.jsonl", data + b"[]\n" + data), purpose="batch")
    assert "Line 601" in refused.value.message


async def test_a_batch_file_of_more_lines_than_a_batch_runs_is_refused(
    redis_server: EmbeddedRedis,
) -> None:
    # Blank lines count too: a file of tiny lines costs a bounded time to check.
    async with serve(make_settings(max_batch_lines=5)) as (_, _, client):
        five = b'{"custom_id": "r"}\n' * 5
        assert (await client.files.create(file=("ok.jsonl", five), purpose="batch")).bytes
        for data in (five + b'{"custom_id": "s"}\n', five + b"\n"):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.files.create(file=("long.jsonl", data), purpose="batch")
            body: dict[str, Any] = refused.value.body  # type: ignore[assignment]
            assert (body["code"], body["param"]) == ("too_many_lines", "file"), body
            assert "GATEWAY_MAX_BATCH_LINES" in body["message"]
        assert len((await client.files.list()).data) == 1


async def test_size_over_the_limit_is_a_413_with_nothing_stored(
    redis_server: EmbeddedRedis,
) -> None:
    # A body past the request limit: the files route takes GATEWAY_MAX_FILE_MB + 1 MiB.
    settings = make_settings(max_file_mb=1.5, max_request_mb=1)
    async with serve(settings) as (_, http, client):
        made = await client.files.create(file=("ok.bin", BINARY + b"1"), purpose="user_data")
        assert made.bytes == MB + 1
        before = await used(http)
        keys = file_keys(redis_server)
        # Within the route's body cap, past the file's limit.
        response = await http.post(
            "/v1/files", data={"purpose": "user_data"}, files={"file": ("x", BINARY * 2)}
        )
        assert_openai_error(response, 413, code="file_too_large", param="file")
        assert "GATEWAY_MAX_FILE_MB" in response.json()["error"]["message"]
        # Past the route's body cap: refused before it is read, naming the file too.
        response = await http.post(
            "/v1/files", data={"purpose": "user_data"}, files={"file": ("x", BINARY * 3)}
        )
        assert_openai_error(response, 413, code="file_too_large", param="file")
        assert await used(http) == before and file_keys(redis_server) == keys


async def test_the_store_refuses_while_streaming(
    app: FastAPI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    store = store_of(app)
    store.max_bytes = MB
    owner = (await new_key(http))["id"]
    with pytest.raises(PayloadTooLargeError) as refused:
        await store.create(owner, "user_data", "x", pieces(BINARY * 2), expires_after_s=None)
    assert refused.value.param == "file" and refused.value.code == "file_too_large"
    assert file_keys(redis_server) == []
    assert await store.list(owner, purpose=None, after=None, limit=10, order="desc") == ([], False)


async def test_past_the_quota_is_a_403_with_nothing_stored(redis_server: EmbeddedRedis) -> None:
    async with serve(make_settings(stored_mb_per_key=1)) as (_, http, client):
        small = await client.files.create(file=("s.bin", b"s" * 1000), purpose="user_data")
        before = await used(http)
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await client.files.create(file=("big.bin", BINARY * 2), purpose="user_data")
        body: dict[str, Any] = refused.value.body  # type: ignore[assignment]
        assert (body["code"], body["param"]) == ("storage_quota_exceeded", "file")
        assert "DELETE /v1/files/{id}" in body["message"]
        assert await used(http) == before
        assert [f.id for f in (await client.files.list()).data] == [small.id]
        assert not [
            k for k in file_keys(redis_server) if b":data:" in k and small.id.encode() not in k
        ]


async def test_a_file_the_gateway_makes_is_counted_never_refused(
    redis_server: EmbeddedRedis,
) -> None:
    async with serve(make_settings(stored_mb_per_key=1, max_file_mb=1)) as (app, http, _):
        key = await new_key(http)
        data = b'{"id": "batch_req_1"}\n' * 150_000  # 3.3 MB: past the quota and the size bound
        made = await store_of(app).create(
            key["id"],
            "batch_output",
            "batch_x_output.jsonl",
            pieces(data),
            expires_after_s=7200,
            quota=False,
        )
        assert made["purpose"] == "batch_output" and made["bytes"] == len(data)
        assert made["expires_at"] == made["created_at"] + 7200
        assert await used(http, key["key"]) > MB  # counted, past the quota
        owner = sdk(http, key["key"])
        assert (await owner.files.retrieve(made["id"])).purpose == "batch_output"
        assert await store_of(app).read(key["id"], made["id"]) == data
        assert (await owner.files.content(made["id"])).content == data
        # The key is now past its quota: its own uploads are refused until it deletes.
        with pytest.raises(openai.PermissionDeniedError):
            await owner.files.create(file=("a.txt", b"a"), purpose="user_data")
        await owner.files.delete(made["id"])
        assert await used(http, key["key"]) == 0
        assert (await owner.files.create(file=("a.txt", b"a"), purpose="user_data")).bytes == 1


@pytest.mark.parametrize("where", ["redis", "directory"])
async def test_a_file_made_twice_under_its_derived_id_is_one_file(
    where: str, tmp_path: Path, redis_server: EmbeddedRedis
) -> None:
    # A batch's finalizer that died after writing its output file is followed by another,
    # which writes the same file again: it replaces the first, nothing is left beside it.
    settings = make_settings(files_dir=tmp_path) if where == "directory" else make_settings()
    async with serve(settings) as (app, http, _):
        key = await new_key(http)
        file_id = derived_file_id("batch_abc", "output")
        assert (
            file_id
            == derived_file_id("batch_abc", "output")
            != derived_file_id("batch_abc", "error")
        )
        data = b'{"custom_id": "a"}\n' * 1000
        counted = []
        for _ in range(2):
            made = await store_of(app).create(
                key["id"],
                "batch_output",
                "batch_abc_output.jsonl",
                pieces(data, 7000),
                expires_after_s=None,
                quota=False,
                file_id=file_id,
            )
            assert made["id"] == file_id
            counted.append(await used(http, key["key"]))
        owner = sdk(http, key["key"])
        assert [f.id async for f in owner.files.list()] == [file_id]
        assert (await owner.files.content(file_id)).content == data
        assert counted[0] == counted[1] > len(data)  # counted once
        await owner.files.delete(file_id)
        assert await used(http, key["key"]) == 0
