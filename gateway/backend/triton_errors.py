"""How Triton's failures read as gateway errors (for :mod:`gateway.backend.triton`).

gRPC status codes of the call map to gateway errors by kind (UNAVAILABLE -> 503,
DEADLINE_EXCEEDED -> 504, ...). An error a model sends inside the stream reaches the gateway
as text only (Triton 2.51's ``triton_grpc_error`` mode, which would carry the code, crashes
the server on an error after the first response), so it becomes a 500 ``model_error``,
unless its text starts with ``Invalid request: `` (:data:`INVALID_PREFIX`, how this
repository's models mark INVALID_ARG, see ``triton_repo/model_io.py``): then it is a 400
with the text.

What gRPC, Triton or a model said is kept from inference clients (it names peer addresses,
``ipv4:127.0.0.1:8001``, and model files, and Python-backend models and TensorRT-LLM's BLS
send whole tracebacks): it is the error's ``detail``, logged with the request id, and the
client reads a fixed message. Two kinds of text pass: INVALID_ARGUMENT and a prompt too long
for the context are the server's verdict on the request's own input, which the client must
read to fix it; and the admin API's load and unload errors, whose caller is the operator who
must fix the model.
"""

from __future__ import annotations

import grpc
from tritonclient.utils import InferenceServerException

from gateway.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GatewayError,
    InvalidRequestError,
    ModelControlDisabledError,
    ModelNotFoundError,
)


def status_error(code: str, message: str, model: str | None = None) -> GatewayError:
    """Maps a gRPC status (name, e.g. ``UNAVAILABLE``) to the gateway error of that kind;
    the status and its message are the detail (see the module docstring)."""
    detail = f"{code}: {message}"
    if code in ("UNAVAILABLE", "CANCELLED"):
        return BackendUnavailableError(
            "The model server (Triton) is unavailable; try again shortly.", detail=detail
        )
    if code == "DEADLINE_EXCEEDED":
        return BackendTimeoutError(
            "The model server (Triton) did not answer in time.", detail=detail
        )
    if code == "NOT_FOUND" and model is not None:
        return ModelNotFoundError(model)
    if code == "INVALID_ARGUMENT":
        return InvalidRequestError(message)
    return BackendError("The model server (Triton) failed to serve the request.", detail=detail)


#: How engines refuse a prompt too long for the context: vLLM's OpenAI server (and the models
#: here, which copy its wording), vLLM's engine behind Triton's vLLM backend (25.05+) and
#: TensorRT-LLM's LLM API. Errors on a stream carry no status code, and a model that is not
#: decoupled answers INTERNAL whatever went wrong: the message is the only sign.
CONTEXT_EXCEEDED = (
    "maximum context length",
    "longer than the maximum model length",
    # TensorRT-LLM's LLM API: the prompt and max_tokens together past its max_seq_len.
    "should not exceed max_seq_len",
)
#: How Triton refuses load/unload when it was not started with --model-control-mode=explicit
#: (polling: "... not allowed if polling is enabled"; none: "... not allowed"). Its status
#: code (UNAVAILABLE) would read as an outage.
CONTROL_DISABLED = ("explicit model load / unload is not allowed",)

#: How a running Triton refuses a request with UNAVAILABLE of its own (a model's queue of
#: its dynamic batcher is full: ``max_queue_size``): that is no outage to wait for, and
#: trying again at once would only add to its queue.
SERVER_BUSY = ("Exceeds maximum queue size",)


#: How a model marks an error on a stream as the client's fault (see the module docstring).
INVALID_PREFIX = "Invalid request: "


def model_error(model: str, message: str) -> GatewayError:
    """An error response of a model on a stream."""
    invalid = message.startswith(INVALID_PREFIX)
    message = message.removeprefix(INVALID_PREFIX)
    if any(sign in message for sign in CONTEXT_EXCEEDED):
        return InvalidRequestError(message, code="context_length_exceeded")
    if invalid:
        return InvalidRequestError(message)
    return BackendError(f"The model '{model}' failed to serve the request.", detail=message)


def from_client_error(exc: InferenceServerException, model: str | None = None) -> GatewayError:
    status = exc.status() or ""
    return status_error(status.removeprefix("StatusCode."), exc.message() or str(exc), model)


def check_control(exc: InferenceServerException) -> None:
    message = exc.message() or str(exc)
    if any(sign in message for sign in CONTROL_DISABLED):
        raise ModelControlDisabledError(
            "This Triton server does not let models be loaded or unloaded through its API "
            "(it was not started with --model-control-mode=explicit). Change its model "
            f"repository instead. Triton said: {message}"
        ) from exc


def from_rpc_error(exc: grpc.aio.AioRpcError, model: str | None = None) -> GatewayError:
    details = exc.details() or ""
    if model is not None and any(sign in details for sign in CONTEXT_EXCEEDED):
        return model_error(model, details)
    return status_error(exc.code().name, details, model)
