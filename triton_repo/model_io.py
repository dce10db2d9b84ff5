"""Reading request tensors and ending requests with errors, shared by the models here.

Each ``model.py`` puts this repository's root on ``sys.path`` in ``initialize`` and imports
this module from there. Functions take ``pb_utils`` as an argument because that module
exists only inside Triton's Python-backend stub.
"""

from __future__ import annotations

from typing import Any


def read_scalar(pb_utils: Any, request: Any, name: str) -> Any:
    """The single element of an optional [1] input, or None when it was not sent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    array = tensor.as_numpy().reshape(-1)
    if array.size != 1:
        raise ValueError(f"input '{name}' must hold exactly one element")
    return array[0]


def read_string(pb_utils: Any, request: Any, name: str) -> str | None:
    value = read_scalar(pb_utils, request, name)
    if value is None:
        return None
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise ValueError(f"input '{name}' is not valid UTF-8") from exc


def send_error(pb_utils: Any, sender: Any, message: str, code: str = "INTERNAL") -> None:
    """Ends a request with an error response; ``code`` names a ``TritonError`` code
    (``INVALID_ARG`` for the client's fault, ``CANCELLED`` when the client went away)."""
    sender.send(
        pb_utils.InferenceResponse(
            error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
        ),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    )
