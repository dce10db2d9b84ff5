"""``docs/conformance.md``'s Realtime tables checked over the WebSocket (the fake backend):
each field of the SDK's session and response configs is known to the gateway (an honoured
one, sent as null, is never an unknown parameter), a refused one is an ``error`` event with
the doc's code naming it, a metadata one is taken, and a made-up one is unknown. The doc's
tables and the sample values are read by :mod:`tests.support.conformance`, as for
``test_conformance.py``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.conformance import MADE_UP, Row, all_rows, names, sample_values
from tests.support.inprocess import AUTH
from tests.support.realtime import answer, message, realtime_app


def _event(table: str, field: str, value: Any) -> tuple[dict[str, Any], str]:
    """The client event that sets ``field`` of ``table`` to ``value``, and its path."""
    if table == "realtime.response":
        return {"type": "response.create", "response": {field: value}}, f"response.{field}"
    path = table.removeprefix("realtime.").split(".")[1:]  # session.audio.input -> audio, input
    spec: dict[str, Any] = {field: value}
    for name in reversed(path):
        spec = {name: spec}
    session = {"type": "realtime", "output_modalities": ["text"]} | spec
    return {"type": "session.update", "session": session}, ".".join(["session", *path, field])


def _answer(table: str, field: str, value: Any) -> tuple[list[dict[str, Any]], str]:
    """What a session sends while it handles the event setting ``field`` to ``value``."""
    event, path = _event(table, field, value)
    with realtime_app() as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        if table == "realtime.response":  # something to respond to
            ws.send_json(message("Hi"))
        return answer(ws, event), path


def _realtime_cases() -> list[Any]:
    cases = []
    for table, row in all_rows():
        if not table.startswith(("realtime.session", "realtime.response")):
            continue  # (``realtime.client_secrets`` is a REST body: test_conformance.py)
        values = [None] if row.kind == "honoured" else sample_values(table, row) or [None]
        for index, value in enumerate(values):
            cases.append(pytest.param(table, row, value, id=f"{table}-{row.field}-{index}"))
    return cases


@pytest.mark.parametrize(("table", "row", "value"), _realtime_cases())
def test_each_realtime_field_is_known_and_taken_as_its_class(
    table: str, row: Row, value: Any
) -> None:
    """An honoured field (sent as null) is never an unknown parameter; a refused one is an
    ``error`` with its code naming it; a metadata one is no error."""
    if row.kind != "honoured":
        assert value is not None, f"SAMPLES has no value for {table} '{row.field}'"
    seen, path = _answer(table, row.field, value)
    errors = [event["error"] for event in seen if event["type"] == "error"]
    unknown = [e for e in errors if e.get("code") == "unknown_parameter"]
    assert not unknown, f"{path} is unknown to the gateway: {unknown}"
    if row.kind == "refused":
        assert errors, f"{path} = {value!r} was not refused"
        assert errors[0]["code"] == row.code, errors[0]
        assert names(errors[0]["param"], path), errors[0]
    if row.kind == "metadata":
        assert not errors, f"{path} = {value!r} was refused: {errors}"


@pytest.mark.parametrize("table", ["realtime.session", "realtime.response"])
def test_a_made_up_realtime_field_is_unknown(table: str) -> None:
    seen, path = _answer(table, MADE_UP, 1)
    errors = [event["error"] for event in seen if event["type"] == "error"]
    assert errors and errors[0]["code"] == "unknown_parameter", errors
    assert errors[0]["param"] == path
