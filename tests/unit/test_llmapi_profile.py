"""The ``llmapi`` profile: TensorRT-LLM's LLM API Triton model, from its own config
(``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt``, decoupled or not as its
``model.yaml`` makes it), the request tensors built from it and its responses read back.
The stand-in that runs it end to end: ``triton_repo/README.md``."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

import grpc
import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.backend import ChatImage, SamplingOptions
from gateway.backend import grpc_streams as streams
from gateway.backend.profiles import ModelConfig, contract_for
from gateway.backend.profiles.llmapi import LlmApiContract
from gateway.backend.triton import TritonBackend
from tests.support.triton import decoded, response, spec, text_of

SAMPLING = {
    "best_of": "TYPE_INT32",
    "temperature": "TYPE_FP32",
    "top_k": "TYPE_INT32",
    "top_p": "TYPE_FP32",
    "frequency_penalty": "TYPE_FP32",
    "presence_penalty": "TYPE_FP32",
    "max_tokens": "TYPE_INT32",
    "seed": "TYPE_UINT64",
    "exclude_input_from_output": "TYPE_BOOL",
    "return_perf_metrics": "TYPE_BOOL",
}


def llmapi(decoupled: bool = True, **params: str) -> ModelConfig:
    """Upstream's config as Triton serves it once ``model.yaml`` auto-completed it."""
    inputs = [
        spec("text_input", "TYPE_STRING", [-1], optional=False),
        spec("image_url", "TYPE_STRING", [-1]),
        spec("streaming", "TYPE_BOOL", [1]),
        *(spec(f"sampling_param_{n}", t, [1]) for n, t in SAMPLING.items()),
        spec("sampling_param_stop", "TYPE_STRING", [-1]),
        *(spec(n, "TYPE_BOOL", [1]) for n in ("return_finish_reason", "return_stop_reason")),
        spec("return_cumulative_logprob", "TYPE_BOOL", [1]),
        spec("stop", "TYPE_BOOL", [1]),
        spec("lora_id", "TYPE_UINT64", [1]),
        *(spec(n, "TYPE_STRING", [1]) for n in ("lora_name", "lora_path", "lora_ckpt_source")),
    ]
    outputs = [
        spec(n, "TYPE_STRING", [-1]) for n in ("text_output", "finish_reason", "stop_reason")
    ]
    outputs += [spec("kv_cache_hit_rate", "TYPE_FP32", [-1])]
    outputs += [spec(n, "TYPE_INT64", [1]) for n in ("arrival_time_ns", "first_token_time_ns")]
    return ModelConfig.from_json(
        "tensorrt_llm",
        {
            "backend": "python",
            "max_batch_size": 0,
            "input": inputs,
            "output": outputs,
            "model_transaction_policy": {"decoupled": decoupled},
            "parameters": {k: {"string_value": v} for k, v in params.items()},
        },
    )


def contract(decoupled: bool = True, **params: str) -> LlmApiContract:
    found = contract_for(llmapi(decoupled, **params))
    assert isinstance(found, LlmApiContract)
    return found


def test_it_is_recognised_by_its_inputs_and_serves_chat_without_logprobs_or_constraints() -> None:
    info = contract().info()
    assert (info.profile, info.task) == ("llmapi", "chat")
    assert info.takes == frozenset(
        {"max_tokens", "temperature", "top_p", "top_k", "frequency_penalty",
         "presence_penalty", "seed", "stop"}
    )  # fmt: skip
    assert not info.logprobs and info.structured_outputs == ()


def test_a_request_asks_for_no_echo_the_finish_reason_and_the_engine_metrics() -> None:
    options = SamplingOptions(max_tokens=7, temperature=0.5, top_k=-1, seed=3, stop=["END", "##"])
    inputs, rules = contract().generate("Hello", options, stream=True)
    sent = decoded(inputs)
    assert sent["text_input"][:2] == ("BYTES", [1]) and text_of(sent["text_input"][2]) == ["Hello"]
    assert sent["streaming"][2] == b"\x01"
    assert sent["sampling_param_exclude_input_from_output"][2] == b"\x01"
    assert sent["sampling_param_return_perf_metrics"][2] == b"\x01"
    assert sent["return_finish_reason"][2] == b"\x01"
    assert np.frombuffer(sent["sampling_param_max_tokens"][2], np.int32).tolist() == [7]
    assert np.frombuffer(sent["sampling_param_top_k"][2], np.int32).tolist() == [0]  # no cut
    assert np.frombuffer(sent["sampling_param_seed"][2], np.uint64).tolist() == [3]
    # Upstream hands the stop tensor's bytes to the engine's tokenizer, which takes str:
    # the gateway cuts at the stop strings itself.
    assert "sampling_param_stop" not in sent and rules.stops == ("END", "##")
    assert "stop" not in sent  # the flag is for stopping, never sent with a generation
    assert rules.cumulative and rules.echo is None and rules.finish_output == "finish_reason"


def test_a_stream_to_a_deployment_that_is_not_decoupled_is_one_request_and_can_be_stopped() -> None:
    inputs, _ = contract(decoupled=False).generate("Hi", SamplingOptions(), stream=True)
    assert decoded(inputs)["streaming"][2] == b"\x00"  # upstream refuses streaming then
    stop = contract(decoupled=False).stop_request()
    assert stop is not None and decoded(stop)["stop"][2] == b"\x01"
    assert contract(decoupled=True).stop_request() is None  # the cancelled stream stops it


def test_the_cumulative_text_is_sent_as_deltas_with_the_engines_finish_reason() -> None:
    _, rules = contract().generate("Hello", SamplingOptions(max_tokens=3), stream=True)
    reader = contract().reader("Hello", rules)
    pieces = [
        reader.read(response(text_output=text, finish_reason="None"))
        for text in ("The", "The quick", "The quick brown")
    ]
    assert [p.text for p in pieces if p] == ["The", " quick", " brown"]
    reader.read(response(text_output="The quick brown", finish_reason="length"))
    last = reader.finish()
    assert last.finish_reason == "length"
    assert last.estimated and last.completion_tokens > 0  # the model reports no counts


def test_an_engine_reason_openai_lacks_reads_as_stop() -> None:
    _, rules = contract().generate("Hi", SamplingOptions(), stream=False)
    reader = contract().reader("Hi", rules)
    reader.read(response(final=True, text_output="Bye", finish_reason="cancelled"))
    assert reader.finish().finish_reason == "stop"


def test_without_the_exclude_input_the_echoed_prompt_is_cut() -> None:
    config = llmapi()
    inputs = {
        n: s for n, s in config.inputs.items() if n != "sampling_param_exclude_input_from_output"
    }
    plain = LlmApiContract(ModelConfig(**{**config.__dict__, "inputs": inputs}))
    _, rules = plain.generate("Say it", SamplingOptions(), stream=False)
    reader = plain.reader("Say it", rules)
    chunk = reader.read(response(final=True, text_output="Say it and done", finish_reason="stop"))
    assert chunk is not None and chunk.text == " and done"


def number_response(**outputs: Any) -> streams.Outputs:
    """A response whose numbers are INT64/FP32 tensors, as the config declares them."""
    message = service_pb2.ModelInferResponse()
    for name, (kind, value) in outputs.items():
        tensor = message.outputs.add(name=name, datatype=kind, shape=[1])
        if kind == "BYTES":
            data = str(value).encode()
            message.raw_output_contents.append(struct.pack("<I", len(data)) + data)
        else:
            dtype = {"INT64": np.int64, "FP32": np.float32}[kind]
            message.raw_output_contents.append(np.array([value], dtype).tobytes())
        assert tensor.name == name
    return streams.Outputs(message)


def test_engine_metrics_are_read_as_numbers_or_as_upstreams_text() -> None:
    llm = contract()
    as_text = number_response(
        kv_cache_hit_rate=("BYTES", 0.75),
        arrival_time_ns=("BYTES", 1_000_000_000),
        first_scheduled_time_ns=("BYTES", 1_002_000_000),
        first_token_time_ns=("BYTES", 1_050_000_000),
    )
    assert llm.engine_stats(as_text) == {
        "kv_cache_hit_rate": 0.75, "queue_s": 0.002, "first_token_s": 0.05,
    }  # fmt: skip
    as_numbers = number_response(
        kv_cache_hit_rate=("FP32", 0.5),
        arrival_time_ns=("INT64", 10),
        first_token_time_ns=("INT64", 1_000_000_010),
    )
    assert llm.engine_stats(as_numbers) == {"kv_cache_hit_rate": 0.5, "first_token_s": 1.0}
    assert llm.engine_stats(response(text_output="x")) == {}


def test_lora_adapters_send_id_name_and_path_together() -> None:
    llm = contract(lora_adapters="sql=7:/loras/sql,bare,support=12,again=7:/loras/again")
    assert llm.info().adapters == ("sql",)  # no id and path, or sql's id again
    inputs, _ = llm.generate("Hi", SamplingOptions(lora_name="sql"), stream=False)
    sent = decoded(inputs)
    assert np.frombuffer(sent["lora_id"][2], np.uint64).tolist() == [7]
    assert text_of(sent["lora_name"][2]) == ["sql"] and text_of(sent["lora_path"][2]) == [
        "/loras/sql"
    ]


def test_images_go_as_data_urls_to_a_deployment_said_to_see_them() -> None:
    image = ChatImage(b"\x89PNG....", "png", 2, 2)
    assert contract().info().image_input is None  # the input alone does not say
    seeing = contract(vision="true")
    inputs, _ = seeing.generate("What?", SamplingOptions(), stream=False, images=(image,))
    (url,) = text_of(decoded(inputs)["image_url"][2])
    assert url == f"data:image/png;base64,{image.base64}"


def test_a_stop_string_the_engine_drops_at_the_end_is_never_sent() -> None:
    """The engine matches a stop string of several words only once whole: a stream may show
    its first words, then the final text drops them."""
    _, rules = contract().generate("Hi", SamplingOptions(stop=["lazy dog"]), stream=True)
    reader = contract().reader("Hi", rules)
    sent = []
    for text in ("The", "The quick", "The quick over the", "The quick over the lazy"):
        chunk = reader.read(response(text_output=text, finish_reason="None"))
        sent.append(chunk.text if chunk else "")
    reader.read(response(final=True, text_output="The quick over the ", finish_reason="stop"))
    sent.append(reader.finish().text)
    assert "".join(sent) == "The quick over the "


class StoppableTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A Triton whose model is not decoupled (plain calls): a generation waits until it is
    cancelled; a request with the ``stop`` flag is recorded by its id, as the LLM API model
    reads it, and answered with its CANCELLED error."""

    def __init__(self) -> None:
        self.generations: list[str] = []
        self.stops: list[str] = []
        self.generating = asyncio.Event()
        self.stopped = asyncio.Event()

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # the gRPC method's name
        names = [tensor.name for tensor in request.inputs]
        if "stop" in names:
            self.stops.append(request.id)
            self.stopped.set()
            await context.abort(grpc.StatusCode.CANCELLED, "Request cancelled by client")
        self.generations.append(request.id)
        self.generating.set()
        await asyncio.sleep(30)
        return service_pb2.ModelInferResponse(model_name=request.model_name)


async def test_a_generation_left_on_a_deployment_that_is_not_decoupled_is_stopped_by_id() -> None:
    server = grpc.aio.server()
    fake = StoppableTriton()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    backend = TritonBackend(f"127.0.0.1:{port}")
    backend._contracts["tensorrt_llm"] = contract(decoupled=False)
    try:

        async def generate() -> None:
            async for _ in backend.generate("tensorrt_llm", "Hi", SamplingOptions(), True):
                pass

        task = asyncio.ensure_future(generate())
        await asyncio.wait_for(fake.generating.wait(), 5)
        task.cancel()  # the client went away
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.wait_for(fake.stopped.wait(), 5)
        assert fake.stops == fake.generations  # the same request id, stopped once
        assert len(fake.generations[0]) == 32
    finally:
        await backend.close()
        await server.stop(None)


async def test_engine_measurements_go_on_the_request_span_and_to_the_metrics() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    heard: list[tuple[str, dict[str, float]]] = []
    backend = TritonBackend("127.0.0.1:1", on_engine=lambda m, s: heard.append((m, s)))
    stats = {"kv_cache_hit_rate": 0.75, "queue_s": 0.002}
    with provider.get_tracer("test").start_as_current_span("POST /v1/chat/completions"):
        backend._engine("tensorrt_llm", stats)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["triton.engine.kv_cache_hit_rate"] == 0.75
    assert span.attributes["triton.engine.queue_s"] == 0.002
    assert heard == [("tensorrt_llm", stats)]
    await backend.close()
