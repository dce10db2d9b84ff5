"""The client's events: one pydantic model per event type, together one union keyed on
``type`` (:data:`ClientEvent`), parsed once by :func:`parse_event`.

The models hold the API's shape: every field an event may carry (an unknown one is
refused as ``unknown_parameter`` naming it, as OpenAI refuses them), its type and range,
and the fields this gateway does not serve, refused by name as ``unsupported_parameter``
when they ask for something. What depends on the deployment (the models, voices and
languages there are, the bounds of what a session keeps) is checked where the event is
acted on (:mod:`~gateway.serving.realtime.session_config`, the handlers).

A refusal is a :class:`ClientEventError`: the session sends it back as an ``error`` event,
with ``param`` the field's path in the event (``session.audio.input.format.type``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Annotated, Literal

from pydantic import Field, Tag, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from gateway.errors import InvalidRequestError
from gateway.serving.json_shape import JsonLimits, json_shape, surrogate_refusal
from gateway.serving.realtime.specs import (
    MAX_ITEM_ID_CHARS,
    ClientItem,
    RealtimeSessionSpec,
    ResponseSpec,
    SessionSpec,
    Strict,
    TranscriptionSessionSpec,
    tagged,
)

#: The most characters of a client's text (a field's name, an unknown type) an error echoes.
ECHOED_CHARS = 64
#: The longest ``event_id`` a client may give an event (it is echoed with its errors).
MAX_EVENT_ID_CHARS = 256

#: A client event larger than this is parsed in a worker thread (an append of minutes of
#: audio takes tens of milliseconds to parse); smaller ones are not worth the hop.
_PARSE_IN_THREAD_BYTES = 64 * 1024


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientEventError(InvalidRequestError):
    """A client event the session cannot act on: sent back as an ``error`` event."""

    event_id: str | None = None
    """The refused event's ``event_id``, when it was refused before it was parsed whole."""


def unsupported(param: str, message: str) -> ClientEventError:
    return ClientEventError(message, param=param, code="unsupported_parameter")


# --- the events -------------------------------------------------------------------------


#: A client's id of an item or a response, as a client event refers to one.
Ref = Annotated[str, Field(max_length=MAX_ITEM_ID_CHARS)]


class _Event(Strict):
    event_id: Annotated[str, Field(max_length=MAX_EVENT_ID_CHARS)] | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionSpec


class BufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class BufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class BufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: ClientItem
    previous_item_id: Ref | None = None


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: Ref


class ItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: Ref


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: Ref
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseSpec | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: Ref | None = None


#: Every client event's model: each has its handler (tests/unit/test_realtime.py checks).
EVENTS: tuple[type[_Event], ...] = (
    SessionUpdate,
    BufferAppend,
    BufferCommit,
    BufferClear,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ResponseCreate,
    ResponseCancel,
)

ClientEvent = Annotated[
    Annotated[SessionUpdate, Tag("session.update")]
    | Annotated[BufferAppend, Tag("input_audio_buffer.append")]
    | Annotated[BufferCommit, Tag("input_audio_buffer.commit")]
    | Annotated[BufferClear, Tag("input_audio_buffer.clear")]
    | Annotated[ItemCreate, Tag("conversation.item.create")]
    | Annotated[ItemDelete, Tag("conversation.item.delete")]
    | Annotated[ItemRetrieve, Tag("conversation.item.retrieve")]
    | Annotated[ItemTruncate, Tag("conversation.item.truncate")]
    | Annotated[ResponseCreate, Tag("response.create")]
    | Annotated[ResponseCancel, Tag("response.cancel")],
    tagged(None),
]
_CLIENT_EVENT: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
_SESSION_SPEC: TypeAdapter[SessionSpec] = TypeAdapter(SessionSpec)


# --- parsing ----------------------------------------------------------------------------


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _fields_of(details: ErrorDetails, data: object) -> tuple[int | str, ...]:
    """The error's ``loc`` without what is no field of ``data``: the tags of the unions on
    the way (``session.update``, ``server_vad``...) and the labels of the others
    (``literal['auto']``...); a missing field, which ``data`` cannot hold, is kept."""
    kept: list[int | str] = []
    loc = details["loc"]
    for index, part in enumerate(loc):
        inside = isinstance(data, dict) and part in data
        if inside or (isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)):
            kept.append(part)
            data = data[part]  # type: ignore[index]
        elif index == len(loc) - 1 and details["type"] == "missing":
            kept.append(part)
    return tuple(kept)


def _short(text: str) -> str:
    """What of a client's text an error echoes: at most :data:`ECHOED_CHARS` characters."""
    return text if len(text) <= ECHOED_CHARS else text[:ECHOED_CHARS] + "…"


def refusal(
    found: list[ErrorDetails], data: object, prefix: tuple[str, ...] = ()
) -> ClientEventError:
    """The errors of validating ``data`` as the client is told them: the one deepest in
    ``data`` (of a union's members, the one that got furthest), with the field's path
    and a code (``unknown_parameter``, ``unsupported_parameter``,
    ``missing_required_parameter``, ``invalid_type``, ``invalid_value``)."""
    paths = [_fields_of(details, data) for details in found]
    deepest = max(range(len(found)), key=lambda index: len(paths[index]))
    details, loc = found[deepest], (*prefix, *paths[deepest])
    kind = details["type"]
    message = details["msg"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        param = _path((*loc, "type"))
        expected = (details.get("ctx") or {}).get("expected_tags", "the documented types")
        return ClientEventError(
            f"Invalid value for '{param}': expected one of {expected}.", param=param
        )
    param = _short(_path(loc))
    if kind == "extra_forbidden":
        return ClientEventError(
            f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter"
        )
    if kind in ("unsupported_parameter", "unsupported_tool", "invalid_value"):
        return ClientEventError(message, param=param or None, code=kind)
    if kind == "missing":
        code = "missing_required_parameter"
        message = f"Missing required parameter: '{param}'."
    elif kind.endswith(("_type", "_parsing")):
        code, message = "invalid_type", f"Invalid type for '{param}': {message}."
    else:
        code, message = "invalid_value", f"Invalid value for '{param}': {message}."
    return ClientEventError(message, param=param or None, code=code)


def _decoded(raw: str | bytes, limits: JsonLimits) -> object:
    shape = json_shape(raw, limits)
    refused = limits.refusal(shape, "The event's JSON")
    if refused is not None:
        raise ClientEventError(refused[0], code=refused[1])
    lone = surrogate_refusal(raw, "The event's JSON")
    if lone is not None:
        raise ClientEventError(lone, code="invalid_json")
    try:
        return json.loads(raw)
    except RecursionError:  # a bound set past what the parser can nest
        raise ClientEventError(
            "The event's JSON nests too deep to be read (GATEWAY_MAX_JSON_DEPTH).",
            code="json_too_deep",
        ) from None
    except json.JSONDecodeError as exc:
        raise ClientEventError(
            f"The event is not valid JSON (line {exc.lineno}, column {exc.colno}).",
            code="invalid_json",
        ) from exc
    except ValueError as exc:  # bytes that are no Unicode text
        raise ClientEventError("The event is not valid JSON text.", code="invalid_json") from exc


def _validated(raw: str | bytes, limits: JsonLimits) -> ClientEvent:
    data = _decoded(raw, limits)
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ClientEventError("An event must be a JSON object with a 'type'.", param="type")
    try:
        return _CLIENT_EVENT.validate_python(data)
    except ValidationError as exc:
        found = exc.errors(include_url=False)  # (once: it costs for each error)
        if found[0]["type"] == "union_tag_invalid" and not found[0]["loc"]:
            refused = ClientEventError(
                f"Unknown event type '{_short(data['type'])}'.",
                param="type",
                code="invalid_event",
            )
        else:
            refused = refusal(found, data)
        event_id = data.get("event_id")
        refused.event_id = event_id if isinstance(event_id, str) else None
        raise refused from None


async def parse_event(raw: str | bytes, limits: JsonLimits) -> ClientEvent:
    """A client event, its JSON measured first (a large one parsed in a worker thread)."""
    if len(raw) > _PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_validated, raw, limits)
    return _validated(raw, limits)


def session_spec(value: object) -> RealtimeSessionSpec | TranscriptionSessionSpec:
    """A session configuration given outside an event (a client secret's ``session``),
    checked as a ``session.update``'s; a refusal names its field under ``session``."""
    try:
        return _SESSION_SPEC.validate_python(value)
    except ValidationError as exc:
        raise refusal(exc.errors(include_url=False), value, ("session",)) from None
