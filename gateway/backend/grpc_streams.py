"""Triton's ``ModelStreamInfer`` without a new gRPC call per request.

Opening a bidirectional call costs more client CPU than everything else a request does with
Triton (call set-up, a task draining the request iterator, the half-close, the tear-down;
measured with py-spy and in process: about 1.1 ms per request against 0.5 ms on a call that
stays open). :class:`StreamPool` keeps finished calls open and gives each to the next
request. A call carries **one request at a time**, so cancelling the call still cancels
exactly one request in Triton (what a client that went away needs) and a failed call takes
only its own request with it.

Every request asks for Triton's empty final response
(``triton_enable_empty_final_response``), so the last response of a request is always the
one flagged ``triton_final_response``, and the call is free again after it.

A traced request (:mod:`gateway.tracing`) carries its span's ``traceparent`` as metadata of
its call, which Triton reads once, when the call opens: it goes on a new call of its own,
closed after it, and the kept calls never carry any (each later request on one would be
traced under that stale context).

Requests and responses are Triton's protobuf messages, built and read here directly: BYTES
tensors are length-prefixed strings (Triton's raw binary format), numbers little-endian.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import triton_to_np_dtype

#: One input: its tensor description and its raw contents.
Input = tuple[Any, bytes]
#: gRPC metadata of a call (a trace context's ``traceparent``, ``tracestate``).
Metadata = tuple[tuple[str, str], ...]

# The same as tritonclient's channel: Triton accepts messages up to 2 GB.
_MAX_MESSAGE = 2**31 - 1
#: Options of every channel to Triton (the kept streams' and tritonclient's).
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    # gRPC waits longer and longer between reconnection attempts (up to 120 s by default),
    # so after a Triton restart the gateway could answer 503 for minutes while Triton is
    # back. A restarted Triton is found within a second instead; reconnecting is cheap.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def tensor(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Input:
    return service_pb2.ModelInferRequest().InferInputTensor(
        name=name, datatype=datatype, shape=list(shape)
    ), raw


def text(name: str, value: str | bytes) -> Input:
    """A one-element BYTES tensor."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    return tensor(name, "BYTES", [1], struct.pack("<I", len(data)) + data)


def texts(name: str, values: Sequence[bytes], shape: Sequence[int]) -> Input:
    raw = b"".join(struct.pack("<I", len(v)) + v for v in values)
    return tensor(name, "BYTES", shape, raw)


def flag(name: str, value: bool) -> Input:
    return tensor(name, "BOOL", [1], b"\x01" if value else b"\x00")


def array(name: str, values: npt.NDArray[Any], datatype: str) -> Input:
    contiguous = np.ascontiguousarray(values, dtype=triton_to_np_dtype(datatype))
    return tensor(name, datatype, contiguous.shape, contiguous.tobytes())


def request(model: str, inputs: Sequence[Input], request_id: str = "") -> Any:
    """A ``ModelInferRequest`` that ends with a response flagged final (``request_id``: its
    id, which a model may be told to stop by)."""
    message = service_pb2.ModelInferRequest(
        model_name=model,
        id=request_id,
        inputs=[description for description, _ in inputs],
        raw_input_contents=[raw for _, raw in inputs],
    )
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


#: Little-endian readers of a tensor's first element, by Triton datatype.
_FORMATS = {
    "INT8": "<b", "INT16": "<h", "INT32": "<i", "INT64": "<q",
    "UINT8": "<B", "UINT16": "<H", "UINT32": "<I", "UINT64": "<Q",
    "FP32": "<f", "FP64": "<d", "BOOL": "<?",
}  # fmt: skip
_UNPACK = {name: struct.Struct(f).unpack_from for name, f in _FORMATS.items()}
_SIZES = {name: struct.calcsize(f) for name, f in _FORMATS.items()}


class Outputs:
    """One response's output tensors, read from their raw contents."""

    __slots__ = ("_outputs", "final")

    def __init__(self, response: Any, final: bool | None = None) -> None:
        self.final: bool = (
            response.parameters["triton_final_response"].bool_param if final is None else final
        )
        # Triton sends every output's data in raw_output_contents, in the outputs' order.
        self._outputs = {
            t.name: (t, raw)
            for t, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        }

    @property
    def has_data(self) -> bool:
        """Whether the response carries any output (the empty final one does not)."""
        return bool(self._outputs)

    def _raw(self, name: str) -> bytes | None:
        found = self._outputs.get(name)
        return found[1] if found is not None else None

    def first_bytes(self, name: str) -> bytes | None:
        """The first element of a BYTES output (``None`` when absent or empty)."""
        raw = self._raw(name)
        if raw is None or len(raw) < 4:
            return None
        size = int.from_bytes(raw[:4], "little")
        return raw[4 : 4 + size]

    def array(self, name: str) -> npt.NDArray[Any] | None:
        """A numeric output as an array of its shape."""
        found = self._outputs.get(name)
        if found is None:
            return None
        described, raw = found
        values = np.frombuffer(raw, dtype=triton_to_np_dtype(described.datatype))
        return values.reshape(tuple(described.shape))

    def datatype(self, name: str) -> str | None:
        """An output's Triton datatype (``BYTES``, ``FP32``, ...); None when absent."""
        found = self._outputs.get(name)
        return str(found[0].datatype) if found is not None else None

    def first_number(self, name: str) -> float | None:
        """The first element of a numeric output (read on every streamed response, so
        without numpy for the common types)."""
        found = self._outputs.get(name)
        if found is None:
            return None
        described, raw = found
        unpack = _UNPACK.get(described.datatype)
        if unpack is None:
            values = self.array(name)
            return float(values.reshape(-1)[0]) if values is not None and values.size else None
        return float(unpack(raw)[0]) if len(raw) >= _SIZES[described.datatype] else None


class ModelError(Exception):
    """An error response a model sent on the stream (its message only: Triton 2.51 sends no
    code with it)."""


class StreamPool:
    """Open ``ModelStreamInfer`` calls on one channel, each lent to one request at a time."""

    def __init__(self, url: str, keep: int = 64) -> None:
        self.channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self._idle: list[Any] = []
        self._keep = keep

    def _take(self) -> tuple[Any, bool]:
        while self._idle:
            call = self._idle.pop()
            if not call.done():  # one Triton ended (a restart, say) is of no use
                return call, True
        return self._stub.ModelStreamInfer(), False

    def _give_back(self, call: Any) -> None:
        if len(self._idle) < self._keep:
            self._idle.append(call)
        else:
            call.cancel()

    async def _anew(self, dead: Any, message: Any) -> Any:
        """``message`` sent on a new call in place of the kept call ``dead``."""
        dead.cancel()
        call = self._stub.ModelStreamInfer()
        try:
            await call.write(message)
        except BaseException:
            call.cancel()
            raise
        return call

    async def infer(
        self, message: Any, metadata: Metadata | None = None
    ) -> AsyncGenerator[Outputs, None]:
        """Sends one request and yields its responses up to the final one. An error response
        raises :class:`ModelError`; a failed call raises ``grpc.aio.AioRpcError``. Leaving
        before the final response cancels the request in Triton. With ``metadata`` (a trace
        context), the request goes on a new call opened with it, which is not kept."""
        if metadata is None:
            call, reused = self._take()
        else:
            call, reused = self._stub.ModelStreamInfer(metadata=metadata), False
        try:
            await call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            if not reused:
                raise
            # A kept call that died since: this request goes on a new one.
            call, reused = await self._anew(call, message), False
        finished = False
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF and reused:
                    # A kept call the server had ended (its end not seen when it was taken):
                    # the request was never read, so it goes on a new call, once. (Triton
                    # ends a call cleanly only once the client stops sending; a call it
                    # read a request on and failed ends with an error status, not here.)
                    call, reused = await self._anew(call, message), False
                    continue
                if response is grpc.aio.EOF:
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.aio.Metadata(),
                        grpc.aio.Metadata(),
                        "Triton ended the stream before the final response",
                    )
                if response.error_message:
                    raise ModelError(response.error_message)
                reused = False  # answered on this call: an end from now on is a failure
                outputs = Outputs(response.infer_response)
                finished = outputs.final
                yield outputs
                if finished:
                    return
        finally:
            if finished and metadata is None:
                self._give_back(call)
            elif finished:
                # A traced call, its request done: ended as a client with no more to send,
                # not cancelled, so Triton ends the request (and exports its spans) as usual.
                # (Up to 5 s: on a busy machine Triton may take seconds to close it, and a
                # call dropped before it closed is cancelled, spans and all.)
                with contextlib.suppress(Exception):
                    await call.done_writing()
                    await asyncio.wait_for(call.code(), 5.0)
            else:
                # The client went away or the request failed: stop the model. (A traced
                # call, its request done, is simply closed.)
                call.cancel()

    async def infer_once(self, message: Any, metadata: Metadata | None = None) -> Outputs:
        """One request to a model that sends one response (not decoupled), as a plain
        call: a refusal then comes with its status code (``grpc.aio.AioRpcError``), where
        an error on a stream carries its text only. ``metadata``: its trace context."""
        response = await self._stub.ModelInfer(message, metadata=metadata)
        return Outputs(response, final=True)

    async def close(self) -> None:
        for call in self._idle:
            call.cancel()
        self._idle.clear()
        await self.channel.close()
