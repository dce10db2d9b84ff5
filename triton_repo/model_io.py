"""Reading request tensors and ending requests with errors, shared by the models here.

Each ``model.py`` puts this repository's root on ``sys.path`` in ``initialize`` and imports
this module from there. Functions take ``pb_utils`` as an argument because that module
exists only inside Triton's Python-backend stub.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


#: How an INVALID_ARG error's text starts: on a stream Triton passes the text without its
#: code, and the gateway reads this prefix as "the client's input is at fault" (a 400 with
#: the text, not a 500 whose text stays in the log).
INVALID_PREFIX = "Invalid request: "


def send_error(pb_utils: Any, sender: Any, message: str, code: str = "INTERNAL") -> None:
    """Ends a request with an error response; ``code`` names a ``TritonError`` code
    (``INVALID_ARG`` for the client's fault, ``CANCELLED`` when the client went away)."""
    if code == "INVALID_ARG":
        message = INVALID_PREFIX + message
    sender.send(
        pb_utils.InferenceResponse(
            error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
        ),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    )


def decoupled_parameters(pb_utils: Any, args: dict[str, Any]) -> dict[str, str]:
    """Checks that the model's config is decoupled (every model here streams) and returns
    its ``parameters`` as plain strings."""
    config = json.loads(args["model_config"])
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise pb_utils.TritonModelException(f"{args['model_name']} must be decoupled")
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def serve_each(
    pb_utils: Any,
    requests: list[Any],
    handle: Callable[[Any, Any], None],
    model_name: str,
    invalid: type[Exception] = ValueError,
) -> None:
    """Runs ``handle(request, sender)`` for each request in turn. ``invalid`` errors end the
    request with INVALID_ARG; any other error with INTERNAL, so no request is left open."""
    for request in requests:
        sender = request.get_response_sender()
        try:
            handle(request, sender)
        except invalid as exc:
            send_error(pb_utils, sender, str(exc), "INVALID_ARG")
        except Exception as exc:
            send_error(pb_utils, sender, f"{model_name} failed: {exc}")
