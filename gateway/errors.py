"""Every failure the gateway reports, and the one place that turns them into OpenAI errors.

::

    GatewayError                      -> {"error": {"message", "type", "param", "code"}}
    ├── InvalidRequestError           400 invalid_request_error
    ├── AuthenticationError           401 invalid_request_error / invalid_api_key
    ├── PermissionDeniedError         403 invalid_request_error / permission_denied
    ├── NotFoundError                 404 invalid_request_error / not_found
    │   └── ModelNotFoundError        404 invalid_request_error / model_not_found
    ├── NotSupportedError             404 invalid_request_error / not_supported
    ├── PayloadTooLargeError          413 invalid_request_error / file_too_large
    ├── RateLimitError                429 requests|tokens / rate_limit_exceeded (Retry-After)
    ├── BudgetExceededError           429 insufficient_quota / budget_exceeded (Retry-After)
    ├── BudgetHeldError               429 tokens / budget_held (Retry-After: 1, retried)
    ├── BackendError                  500 server_error / model_error
    ├── BackendUnavailableError       503 server_error / backend_unavailable (Retry-After)
    ├── StoreUnavailableError         503 server_error / store_unavailable (Retry-After)
    │   └── StoreFullError            503 server_error / store_full (Retry-After)
    ├── OverloadedError               503 server_error / overloaded (Retry-After)
    └── BackendTimeoutError           504 server_error / backend_timeout

Routers never catch exceptions: the handlers installed by :func:`install_handlers` render
these, FastAPI's validation errors (as 400, like OpenAI) and anything unexpected (500),
always in the OpenAI error body. Errors after a stream began are rendered by the chat
service as an SSE ``error`` event with the same body (see :func:`error_body`).

No internals reach a client: what Redis, gRPC or Triton said (peer addresses, file paths,
tracebacks) is an error's ``detail``, which the handlers log with the request's id; the
client reads a fixed message that carries that id, and the ``X-Request-ID`` header.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

logger = logging.getLogger("gateway")


class GatewayError(Exception):
    """An error with its HTTP status and OpenAI error fields."""

    status_code = 500
    type = "server_error"
    code: str | None = None
    #: Set for failures of a part expected back (restarted by ``gateway up``, Kubernetes or
    #: a failover): ``Retry-After`` tells clients (the OpenAI SDKs retry 503s) when to try.
    retry_after_s: int | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ):
        """``message`` is what the client reads; ``detail``, what went wrong inside (a
        server's own words), is only logged."""
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.param = param
        self.headers = headers or {}
        if self.retry_after_s is not None:
            self.headers.setdefault("Retry-After", str(self.retry_after_s))
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequestError(GatewayError):
    """A request the gateway refuses; its ``code`` says why (``invalid_value`` unless a
    more telling one is given: every refusal has a code)."""

    status_code = 400
    type = "invalid_request_error"
    code = "invalid_value"


class AuthenticationError(GatewayError):
    """No key, or a key that is unknown, revoked or expired."""

    status_code = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class PermissionDeniedError(GatewayError):
    """A valid key that may not do this (role or model)."""

    status_code = 403
    type = "invalid_request_error"
    code = "permission_denied"


class NotFoundError(GatewayError):
    status_code = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist", param="model")


class ModelControlDisabledError(GatewayError):
    """Triton runs with ``--model-control-mode`` none or poll: models cannot be loaded or
    unloaded through its API (the repository decides), which is no outage."""

    status_code = 409
    type = "invalid_request_error"
    code = "model_control_disabled"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    type = "invalid_request_error"
    code = "file_too_large"


class NotSupportedError(GatewayError):
    """An OpenAI endpoint that no model here can serve."""

    status_code = 404
    type = "invalid_request_error"
    code = "not_supported"


class RateLimitError(GatewayError):
    """A key's limit is reached. ``type`` names the limit as OpenAI does (``requests`` or
    ``tokens``); ``Retry-After`` says when to try again."""

    status_code = 429
    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, limit: str, retry_after_s: float, headers: dict[str, str]
    ) -> None:
        retry_after = str(max(1, math.ceil(retry_after_s)))
        super().__init__(message, headers={**headers, "Retry-After": retry_after})
        self.type = "tokens" if limit == "tokens" else "requests"
        self.limit = limit


class BudgetExceededError(GatewayError):
    """A key's or its project's budget is spent (docs/budgets.md). OpenAI's own 429 for a
    spent quota has the type ``insufficient_quota``; ``Retry-After`` says when the period
    resets, and ``x-should-retry: false`` stops the SDKs from retrying (they would for any
    429, and the wait is hours)."""

    status_code = 429
    type = "insufficient_quota"
    code = "budget_exceeded"

    def __init__(self, message: str, scope: str, retry_after_s: float) -> None:
        retry_after = str(max(1, math.ceil(retry_after_s)))
        super().__init__(message, headers={"Retry-After": retry_after, "x-should-retry": "false"})
        self.scope = scope


class BudgetHeldError(GatewayError):
    """A budget would fit the request but for what requests of the same key or project still
    running have reserved (docs/budgets.md): a 429 the SDKs retry (``Retry-After: 1``), as
    the running requests release what they do not use when they end."""

    status_code = 429
    type = "tokens"
    code = "budget_held"

    def __init__(self, message: str, scope: str) -> None:
        super().__init__(message, headers={"Retry-After": "1", "x-should-retry": "true"})
        self.scope = scope


class BackendError(GatewayError):
    """The model or Triton failed while serving a request."""

    code = "model_error"


def unknown_parser(model: str, setting: str, name: str, known: Iterable[str]) -> BackendError:
    """A model's config names a parser (``setting``: ``tool_call_parser``,
    ``reasoning_parser``) the gateway does not have."""
    return BackendError(
        f"The model '{model}' names an unknown {setting} '{name}' (known: {', '.join(known)}).",
        code="model_config_error",
    )


class BackendUnavailableError(GatewayError):
    """Triton cannot be reached, or the model is not ready."""

    status_code = 503
    code = "backend_unavailable"
    retry_after_s = 2


class StoreUnavailableError(GatewayError):
    """Redis (keys, limits, sessions, usage) cannot be reached: nothing that needs it is let
    through. Clients read the same message whatever Redis said (its words are ``detail``)."""

    status_code = 503
    code = "store_unavailable"
    retry_after_s = 1
    reason = "The gateway's store (Redis) is unreachable; try again shortly."

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(self.reason, detail=detail)


class StoreFullError(StoreUnavailableError):
    """Redis refused a write because it reached its ``maxmemory``: with the ``noeviction``
    policy no key, session or rate-limit window is dropped to make room, so the request is
    refused instead; stored data expiring frees room again."""

    code = "store_full"
    retry_after_s = 30
    reason = "The gateway's store is full; try again later."


class FileStorageError(GatewayError):
    """The directory that holds uploaded files' bytes (``GATEWAY_FILES_DIR``) could not be
    read or written, or lacks a file its record names (a directory not shared by every
    replica): a fault of the deployment, not the request. What the system said is
    ``detail`` (logged)."""

    status_code = 503
    code = "file_storage_unavailable"
    retry_after_s = 5
    reason = "The gateway's file storage could not be read or written; try again later."

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(self.reason, detail=detail)


class OverloadedError(GatewayError):
    """The gateway's queue for a model is full, or the request waited in it too long: shed
    before Triton falls over (:mod:`gateway.backend.scheduling`). ``reason`` is
    ``queue_full`` or ``wait_timeout``; ``Retry-After`` is the queue's estimate of when a
    place frees."""

    status_code = 503
    code = "overloaded"

    def __init__(self, message: str, reason: str, retry_after_s: float) -> None:
        # 1 to 60 s: the OpenAI SDKs ignore a longer one (and slow streams must not make it
        # tell clients to stay away for minutes).
        retry_after = str(min(60, max(1, math.ceil(retry_after_s))))
        super().__init__(message, headers={"Retry-After": retry_after})
        self.reason = reason


class BackendTimeoutError(GatewayError):
    status_code = 504
    code = "backend_timeout"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_HTTP_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


#: The codes of Starlette's own errors (an unknown path, a method a path does not take).
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}

_LOCATIONS = {"body", "query", "path", "header"}


def _is_union_tag(part: str) -> bool:
    # pydantic names the member of a union a value failed as (``str``, ``list[str]``,
    # ``function-after[...]``); those are types, not parameters. No field here is so named.
    # A tagged union's tag has a colon (``tool:function``).
    return (
        "[" in part
        or ":" in part
        or part in {"str", "int", "float", "bool", "dict", "list", "none"}
    )


def _validation_param(loc: tuple[Any, ...]) -> str | None:
    # ("body", "messages", 0, "content") -> "messages.[0].content", as OpenAI names params.
    # The first name is a field of the body, never a union's tag: a multipart form's field
    # may be named like one (``timestamp_granularities[]``, ``chunking_strategy[type]``).
    named = [p for p in loc if p not in _LOCATIONS]
    parts = named[:1] + [p for p in named[1:] if not (isinstance(p, str) and _is_union_tag(p))]
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts) or None


def _most_telling(errors: list[Any]) -> Any:
    # A value that fails every member of a union yields one error per member; a broken
    # constraint (too long, out of range) says more than "not a string".
    return sorted(errors, key=lambda e: str(e.get("type", "")).endswith("_type"))[0]


#: The header of a request's id: nginx sets it (the client's own when it looks like an id,
#: else a random one) and returns it; a client talking to a replica directly may send one.
REQUEST_ID_HEADER = "X-Request-ID"
#: What nginx accepts as a client's id (nginx/gateway.conf.template): nothing else reaches
#: a log line.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(request: Request) -> str:
    """The id of ``request``: its ``X-Request-ID`` when that looks like an id, else a new
    random one (nginx's form: 32 hex digits)."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


#: The routes whose errors take Anthropic's shape: the Messages API's clients read that.
ANTHROPIC_PATHS = ("/v1/messages",)

#: Anthropic's error types by HTTP status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_body(body: dict[str, Any], status: int, rid: str) -> dict[str, Any]:
    """An OpenAI error body in Anthropic's shape (``{"type": "error", "error": {"type",
    "message"}, "request_id"}``), its message naming the parameter."""
    message, param = body["error"]["message"], body["error"].get("param")
    if param and param not in message:  # no param in Anthropic's body: named here
        message = f"{param}: {message}"
    error = {"type": anthropic_type(status), "message": message}
    return {"type": "error", "error": error, "request_id": rid}


def _answer(
    request: Request, body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error response that names its request: the ``X-Request-ID`` header, and for a
    server error (whose details went only to the log) the id in the message as well, for
    the client to quote. On :data:`ANTHROPIC_PATHS`, in Anthropic's shape."""
    rid = request_id(request)
    if status >= 500:
        body["error"]["message"] += f" (request id: {rid})"
    if request.url.path.startswith(ANTHROPIC_PATHS):
        body = anthropic_body(body, status, rid)
    return JSONResponse(
        body, status_code=status, headers={**(headers or {}), REQUEST_ID_HEADER: rid}
    )


async def _on_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)  # registered for GatewayError only
    metrics = getattr(request.app.state, "metrics", None)
    if isinstance(exc, RateLimitError) and metrics is not None:
        metrics.rate_limited.labels(exc.limit).inc()
    response = _answer(request, exc.body(), exc.status_code, exc.headers)
    if exc.status_code >= 500:
        logger.warning(
            "request %s: %s: %s",
            response.headers[REQUEST_ID_HEADER],
            type(exc).__name__,
            exc.detail or exc.message,
        )
    elif exc.detail:  # a client's error told in a library's words (FFmpeg's, Jinja's)
        rid = response.headers[REQUEST_ID_HEADER]
        logger.info("request %s: %s: %s", rid, type(exc).__name__, exc.detail)
    return response


#: The codes of FastAPI's validation errors, by pydantic's error type (OpenAI's codes; a
#: value of the wrong type is ``invalid_type``, anything else ``invalid_value``).
_VALIDATION_CODES = {
    "json_invalid": "invalid_json",
    "missing": "missing_required_parameter",
    "extra_forbidden": "unsupported_parameter",
}


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first = _most_telling(errors) if errors else {"loc": (), "msg": "invalid request"}
    param = _validation_param(tuple(first.get("loc", ())))
    message = str(first.get("msg", "invalid request"))
    kind = str(first.get("type", ""))
    code = _VALIDATION_CODES.get(
        kind, "invalid_type" if kind.endswith("_type") else "invalid_value"
    )
    if kind == "json_invalid":
        message, param = "The request body is not valid JSON.", None
    elif first.get("type") == "extra_forbidden":
        # OpenAI's wording for a parameter it does not know; here also one it defines that
        # the gateway does not implement (refused rather than silently dropped).
        message = f"Unrecognized request argument supplied: {param}"
        code = "unsupported_parameter"
    elif param:
        message = f"{param}: {message}"
    others = {_validation_param(tuple(e.get("loc", ()))) for e in errors} - {param}
    if others:
        message += f" (and {len(others)} more invalid parameter(s))"
    return _answer(request, error_body(message, "invalid_request_error", param, code), 400)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    code = _HTTP_CODES.get(exc.status_code, kind)
    body = error_body(str(exc.detail), kind, code=code)
    return _answer(request, body, exc.status_code, exc.headers)


async def _on_client_gone(_: Request, exc: Exception) -> Response:
    # Nobody reads this; 499 is nginx's "client closed request", for the access log.
    return Response(status_code=499)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    body = error_body("The server had an error while processing your request.", "server_error")
    response = _answer(request, body, 500)
    logger.error("request %s: unhandled error", response.headers[REQUEST_ID_HEADER], exc_info=exc)
    return response


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(ClientDisconnect, _on_client_gone)
    app.add_exception_handler(Exception, _on_unexpected)
