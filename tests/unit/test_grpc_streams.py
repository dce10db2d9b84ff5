"""The kept Triton streams (``gateway/backend/grpc_streams.py``) against an in-process gRPC
server that speaks Triton's ``ModelStreamInfer``: calls are reused, and a request that is
abandoned, fails, or meets a stream the server ended never harms another request."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc

from gateway.backend import grpc_streams as streams
from tests.support.fake_triton import FakeTriton


@pytest.fixture
async def triton() -> AsyncIterator[tuple[FakeTriton, streams.StreamPool]]:
    server = grpc.aio.server()
    fake = FakeTriton()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = streams.StreamPool(f"127.0.0.1:{port}")
    try:
        yield fake, pool
    finally:
        await pool.close()
        await server.stop(None)


async def words(
    pool: streams.StreamPool,
    model: str,
    text: str,
    take: int | None = None,
    metadata: streams.Metadata | None = None,
) -> list:
    out = []
    request = streams.request(model, [streams.text("text_input", text)])
    async with aclosing(pool.infer(request, metadata)) as responses:
        async for outputs in responses:
            word = outputs.first_bytes("text_output")
            if word is not None:
                out.append((word.decode(), outputs.first_number("count")))
            if take is not None and len(out) >= take:
                break
    return out


async def test_requests_one_after_another_share_one_call(triton: Any) -> None:
    fake, pool = triton
    assert await words(pool, "echo", "a bb") == [("a", 1.0), ("bb", 2.0)]
    assert await words(pool, "echo", "ccc") == [("ccc", 3.0)]
    assert await words(pool, "echo", "d e f") == [("d", 1.0), ("e", 1.0), ("f", 1.0)]
    assert fake.calls == 1


async def test_concurrent_requests_get_their_own_answers(triton: Any) -> None:
    fake, pool = triton
    texts = [" ".join(f"w{i}x{j}" for j in range(i + 1)) for i in range(6)]
    answers = await asyncio.gather(*(words(pool, "echo", t) for t in texts))
    assert [" ".join(w for w, _ in a) for a in answers] == texts
    assert fake.calls == 6
    await asyncio.gather(*(words(pool, "echo", t) for t in texts))
    assert fake.calls == 6  # the six kept calls served the second round


async def test_leaving_early_cancels_only_that_request(triton: Any) -> None:
    fake, pool = triton
    other = asyncio.create_task(words(pool, "echo", "x " * 50))
    assert len(await words(pool, "slow", "stop-me", take=2)) == 2
    for _ in range(100):
        if fake.cancelled:
            break
        await asyncio.sleep(0.01)
    assert fake.cancelled == ["stop-me"]
    assert len(await other) == 50
    # The cancelled call is not kept: the next request still gets its answer.
    assert await words(pool, "echo", "after") == [("after", 5.0)]


async def test_an_error_response_raises_and_the_next_request_is_served(triton: Any) -> None:
    fake, pool = triton
    assert await words(pool, "echo", "warm") == [("warm", 4.0)]
    with pytest.raises(streams.ModelError, match="failed: boom"):
        await words(pool, "fail", "boom")
    assert await words(pool, "echo", "fine") == [("fine", 4.0)]
    assert fake.calls == 2  # the failed request's call was dropped, not reused


async def test_a_stream_the_server_ended_is_replaced(triton: Any) -> None:
    fake, pool = triton
    assert await words(pool, "end", "last") == [("last", 4.0)]
    # The server ended the call after that answer; the kept call is dead.
    assert await words(pool, "echo", "next one") == [("next", 4.0), ("one", 3.0)]
    assert fake.completed == ["last", "next one"]


async def test_a_traced_request_opens_a_call_with_its_traceparent_that_is_not_kept(
    triton: Any,
) -> None:
    """Triton reads a call's trace context once, when it opens: a traced request gets a
    call of its own carrying it; the kept calls carry none, before and after."""
    fake, pool = triton
    assert await words(pool, "echo", "plain") == [("plain", 5.0)]
    traced = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)
    assert await words(pool, "echo", "traced", metadata=traced) == [("traced", 6.0)]
    assert await words(pool, "echo", "again") == [("again", 5.0)]
    assert fake.traceparents == [None, traced[0][1]]
    # The traced request went on call 2 alone; the kept call 1 served the others.
    assert fake.served == [(1, "plain"), (2, "traced"), (1, "again")]
    # A model that is not decoupled: one plain call, with the context when traced.
    request = streams.request("echo", [streams.text("text_input", "x")])
    await pool.infer_once(request)
    await pool.infer_once(request, traced)
    assert fake.traceparents[2:] == [None, traced[0][1]]


def test_tensors_are_encoded_as_triton_reads_them() -> None:
    request = streams.request("m", [streams.text("t", "héllo"), streams.flag("f", True)])
    assert [i.name for i in request.inputs] == ["t", "f"]
    assert request.raw_input_contents[0] == struct.pack("<I", 6) + "héllo".encode()
    assert request.raw_input_contents[1] == b"\x01"
    name, raw = streams.array("a", np.array([1.5, -2.0]), "FP32")
    assert list(name.shape) == [2] and name.datatype == "FP32"
    assert np.frombuffer(raw, dtype=np.float32).tolist() == [1.5, -2.0]
