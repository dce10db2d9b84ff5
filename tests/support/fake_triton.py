"""An in-process gRPC server that speaks Triton's ``ModelInfer`` and ``ModelStreamInfer``, for
the kept streams and what an outage does to them."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

from tritonclient.grpc import service_pb2, service_pb2_grpc


def _response(model: str, word: str | None, final: bool) -> Any:
    reply = service_pb2.ModelStreamInferResponse()
    infer = reply.infer_response
    infer.model_name = model
    if word is not None:
        data = word.encode()
        infer.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        infer.raw_output_contents.append(struct.pack("<I", len(data)) + data)
        infer.outputs.add(name="count", datatype="UINT32", shape=[1])
        infer.raw_output_contents.append(struct.pack("<I", len(word)))
    infer.parameters["triton_final_response"].bool_param = final
    return reply


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``echo`` answers each word of its text, then an empty final response; ``slow``
    answers a word every 10 ms until cancelled; ``fail`` sends an error; ``end`` answers
    and then ends the whole stream (as a server going away would)."""

    def __init__(self) -> None:
        self.calls = 0
        self.traceparents: list[str | None] = []
        """Each call's ``traceparent`` metadata, as it opened."""
        self.served: list[tuple[int, str]] = []
        """(call number, text) of each request read."""
        self.cancelled: list[str] = []
        self.completed: list[str] = []

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # a plain call
        self.traceparents.append(dict(context.invocation_metadata()).get("traceparent"))
        return service_pb2.ModelInferResponse(model_name=request.model_name)

    async def ModelStreamInfer(  # the gRPC method's name
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        self.calls += 1
        number = self.calls
        self.traceparents.append(dict(context.invocation_metadata()).get("traceparent"))
        async for request in request_iterator:
            assert request.parameters["triton_enable_empty_final_response"].bool_param
            raw = request.raw_input_contents[0]
            text = raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()
            model = request.model_name
            self.served.append((number, text))
            if model == "fail":
                yield service_pb2.ModelStreamInferResponse(error_message=f"failed: {text}")
                continue
            words = text.split() if model != "slow" else [text] * 1000
            try:
                for word in words:
                    if model == "slow":
                        await asyncio.sleep(0.01)
                    yield _response(model, word, final=False)
                yield _response(model, None, final=True)
            except asyncio.CancelledError:
                self.cancelled.append(text)
                raise
            self.completed.append(text)
            if model == "end":
                return
