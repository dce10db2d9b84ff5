"""Triton as the model profiles meet it: model configs as each backend writes them (vLLM by
release, TensorRT-LLM's ensemble, a model of the ``openai_*`` parameters), the request
tensors a profile built, decoded, and responses to read back."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from gateway.backend import grpc_streams as streams
from gateway.backend.profiles import ModelConfig, contract_for


def spec(name: str, kind: str, dims: list[int], optional: bool = True) -> dict[str, Any]:
    return {"name": name, "data_type": kind, "dims": [str(d) for d in dims], "optional": optional}


def vllm_inputs(release: str) -> list[dict[str, Any]]:
    """The vLLM backend's auto-completed inputs at a release (vllm_backend src/model.py)."""
    names = [spec("text_input", "TYPE_STRING", [1], optional=False)]
    if release in ("25.05", "25.11"):
        names.append(spec("image", "TYPE_STRING", [-1]))
    names += [
        spec("stream", "TYPE_BOOL", [1]),
        spec("sampling_parameters", "TYPE_STRING", [1]),
        spec("exclude_input_in_output", "TYPE_BOOL", [1]),
    ]
    if release != "24.05":
        names += [
            spec(n, "TYPE_BOOL", [1])
            for n in (
                "return_finish_reason",
                "return_cumulative_logprob",
                "return_logprobs",
                "return_num_input_tokens",
                "return_num_output_tokens",
            )
        ]
    if release == "25.11":
        names.append(spec("embedding_request", "TYPE_STRING", [1]))
    return names


def vllm(release: str, **params: str) -> ModelConfig:
    return ModelConfig.from_json(
        "m",
        {
            "backend": "vllm",
            "input": vllm_inputs(release),
            "output": [spec("text_output", "TYPE_STRING", [-1])]
            + (
                []
                if release == "24.05"
                else [
                    spec("finish_reason", "TYPE_STRING", [-1]),
                    spec("logprobs", "TYPE_STRING", [-1]),
                    spec("num_input_tokens", "TYPE_UINT32", [1]),
                    spec("num_output_tokens", "TYPE_UINT32", [-1]),
                ]
            ),
            "model_transaction_policy": {"decoupled": True},
            "parameters": {k: {"string_value": v} for k, v in params.items()},
        },
    )


#: TensorRT-LLM's ensemble inputs that matter here (r25.05 branch names; r24.08 in brackets).
def trtllm_ensemble(seed: str = "seed", exclude: bool = True) -> dict[str, Any]:
    inputs = [
        spec("text_input", "TYPE_STRING", [1], optional=False),
        spec("max_tokens", "TYPE_INT32", [1], optional=False),
        spec("stop_words", "TYPE_STRING", [-1]),
        spec("temperature", "TYPE_FP32", [1]),
        spec(seed, "TYPE_UINT64", [1]),
        spec("stream", "TYPE_BOOL", [1]),
    ]
    if exclude:
        inputs.append(spec("exclude_input_in_output", "TYPE_BOOL", [1]))
    return {
        "platform": "ensemble",
        "max_batch_size": 64,
        "input": inputs,
        "output": [spec("text_output", "TYPE_STRING", [-1])],
        "ensemble_scheduling": {
            "step": [
                {"model_name": "preprocessing"},
                {"model_name": "tensorrt_llm"},
                {"model_name": "postprocessing"},
            ]
        },
    }


def decoded(inputs: list[streams.Input]) -> dict[str, tuple[str, list[int], bytes]]:
    return {d.name: (d.datatype, list(d.shape), raw) for d, raw in inputs}


def text_of(raw: bytes) -> list[str]:
    """The strings of a BYTES tensor's raw contents."""
    out, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack_from("<I", raw, at)
        out.append(raw[at + 4 : at + 4 + size].decode())
        at += 4 + size
    return out


def response(final: bool = False, **outputs: Any) -> streams.Outputs:
    """A Triton response carrying ``outputs`` (str -> BYTES, int -> UINT32)."""
    message = service_pb2.ModelInferResponse()
    for name, value in outputs.items():
        tensor = message.outputs.add(name=name)
        if isinstance(value, str | bytes):
            data = value.encode() if isinstance(value, str) else value
            tensor.datatype, tensor.shape[:] = "BYTES", [1]
            message.raw_output_contents.append(struct.pack("<I", len(data)) + data)
        else:
            tensor.datatype, tensor.shape[:] = "UINT32", [1]
            message.raw_output_contents.append(np.array([value], np.uint32).tobytes())
    message.parameters["triton_final_response"].bool_param = final
    return streams.Outputs(message)


def audio_model(task: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], **p: str):
    params = {"openai_task": task, **p}
    return contract_for(
        ModelConfig.from_json(
            "m",
            {
                "input": inputs,
                "output": outputs,
                "parameters": {k: {"string_value": v} for k, v in params.items()},
            },
        )
    )
