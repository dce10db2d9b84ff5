"""The pure parts of the Triton adapter: model configs, gRPC status mapping, sampling JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from gateway.backend import SamplingOptions
from gateway.backend.triton import model_info_from_config
from gateway.backend.triton_errors import check_control, model_error, status_error
from gateway.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GatewayError,
    InvalidRequestError,
    ModelControlDisabledError,
    ModelNotFoundError,
)

VLLM_INPUTS = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": ["1"]},
    {"name": "stream", "data_type": "TYPE_BOOL", "dims": ["1"], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": ["1"], "optional": True},
]


def params(**values: str) -> dict[str, Any]:
    """A config's ``parameters`` as Triton's JSON model config has them."""
    return {key: {"string_value": value} for key, value in values.items()}


def test_config_parameters_are_read() -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    info = model_info_from_config(
        "llama",
        {
            "name": "llama",
            "backend": "python",
            "input": [{"name": "INPUT0"}],
            "parameters": params(openai_task="chat", chat_template=template, context_length="4096"),
        },
    )
    assert info.name == "llama"
    assert info.task == "chat"
    assert info.ready is True
    assert info.chat_template == template
    assert info.context_length == 4096


def test_explicit_task_wins_over_vllm_inputs() -> None:
    config = {"input": VLLM_INPUTS, "parameters": params(openai_task="speech")}
    assert model_info_from_config("m", config).task == "speech"


def test_stock_vllm_model_is_a_chat_model() -> None:
    config = {"backend": "vllm", "input": VLLM_INPUTS, "parameters": params(max_model_len="8192")}
    info = model_info_from_config("vllm_model", config)
    assert info.task == "chat"
    assert info.chat_template is None  # chat is refused unless a tokenizer gives one
    assert info.context_length == 8192


def test_context_length_is_preferred_over_max_model_len() -> None:
    config = {"parameters": params(openai_task="chat", context_length="1024", max_model_len="8192")}
    assert model_info_from_config("m", config).context_length == 1024


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"input": [{"name": "INPUT0"}, {"name": "INPUT1"}]},
        {"input": [{"name": "text_input"}]},  # only half of the vLLM inputs
        {"input": [{"name": "text_input"}], "parameters": params(chat_template="x")},
        {"input": [{"name": "x"}], "parameters": params(openai_task="")},
    ],
)
def test_models_without_a_task_have_none(config: dict[str, Any]) -> None:
    assert model_info_from_config("m", config).task is None


def test_empty_task_parameter_on_a_vllm_model_still_means_chat() -> None:
    config = {"input": VLLM_INPUTS, "parameters": params(openai_task="")}
    assert model_info_from_config("m", config).task == "chat"


@pytest.mark.parametrize("value", ["", "abc", "-1", "4k", "1.5"])
def test_unusable_context_length_is_ignored(value: str) -> None:
    info = model_info_from_config("m", {"parameters": params(context_length=value)})
    assert info.context_length is None


def test_empty_chat_template_means_none() -> None:
    info = model_info_from_config("m", {"parameters": params(chat_template="")})
    assert info.chat_template is None


@pytest.mark.parametrize(
    ("code", "model", "error_type", "status"),
    [
        ("UNAVAILABLE", None, BackendUnavailableError, 503),
        ("CANCELLED", "m", BackendUnavailableError, 503),
        ("DEADLINE_EXCEEDED", "m", BackendTimeoutError, 504),
        ("INVALID_ARGUMENT", "m", InvalidRequestError, 400),
        ("NOT_FOUND", "m", ModelNotFoundError, 404),
        ("NOT_FOUND", None, BackendError, 500),
        ("INTERNAL", "m", BackendError, 500),
        ("RESOURCE_EXHAUSTED", "m", BackendError, 500),
    ],
)
def test_grpc_status_mapping(
    code: str, model: str | None, error_type: type[GatewayError], status: int
) -> None:
    error = status_error(code, "details from triton", model)
    assert type(error) is error_type
    assert error.status_code == status


def test_status_errors_keep_the_details_in_the_log_only() -> None:
    down = status_error("UNAVAILABLE", "connection refused to ipv4:10.0.0.7:8001")
    assert "10.0.0.7" not in down.message and "10.0.0.7" in (down.detail or "")
    # The client's own input is judged: the client needs that text to fix it.
    assert "bad tensor" in status_error("INVALID_ARGUMENT", "bad tensor").message
    error = status_error("INTERNAL", "boom", "m")
    assert "boom" not in error.message and error.detail == "INTERNAL: boom"
    assert error.code == "model_error"
    not_found = status_error("NOT_FOUND", "unknown model", "llama")
    assert not_found.body()["error"]["code"] == "model_not_found"
    assert "llama" in not_found.message


def test_a_model_marks_its_refusals_of_the_clients_input_on_a_stream() -> None:
    refused = model_error("m", "Invalid request: cannot enforce this JSON schema")
    assert isinstance(refused, InvalidRequestError)
    assert refused.message == "cannot enforce this JSON schema"
    too_long = model_error("m", "Invalid request: exceeds the maximum context length")
    assert too_long.code == "context_length_exceeded"
    failed = model_error("m", "Traceback ... /opt/models/m/1/model.py")
    assert failed.status_code == 500 and "model.py" not in failed.message


def test_sampling_json_omits_unset_fields() -> None:
    assert json.loads(SamplingOptions().to_json()) == {}
    assert json.loads(SamplingOptions(max_tokens=16, stop=["\n"]).to_json()) == {
        "max_tokens": 16,
        "stop": ["\n"],
    }


def test_sampling_json_keeps_zero_values() -> None:
    # 0 is a real setting (greedy decoding, seed 0, no penalty), not "unset".
    options = SamplingOptions(temperature=0.0, seed=0, presence_penalty=0.0, frequency_penalty=0.0)
    assert json.loads(options.to_json()) == {
        "temperature": 0.0,
        "seed": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }


def test_sampling_json_uses_vllm_names() -> None:
    options = SamplingOptions(
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        seed=1,
        stop=["a", "b"],
        presence_penalty=0.5,
        frequency_penalty=-0.5,
    )
    assert json.loads(options.to_json()) == {
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 1,
        "stop": ["a", "b"],
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
    }


def test_model_control_off_is_a_409_not_an_outage() -> None:
    """Triton 2.51 started with --model-control-mode=none or poll answers load/unload with
    UNAVAILABLE and this message (read from the real binary)."""
    refused = InferenceServerException(
        "explicit model load / unload is not allowed if polling is enabled",
        status="StatusCode.UNAVAILABLE",
    )
    with pytest.raises(ModelControlDisabledError) as raised:
        check_control(refused)
    assert raised.value.status_code == 409
    assert raised.value.code == "model_control_disabled"
    # Any other failure goes on to the usual mapping.
    check_control(InferenceServerException("failed to load", status="StatusCode.INTERNAL"))
