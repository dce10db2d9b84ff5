"""``docs/conformance.md`` checked against the pinned openai SDK and against the app.

Every request field of openai-python's request types (its ``TypedDict``s, both stream
variants) has one row in the doc's table for its endpoint, with one class: honoured,
refused (with a code) or metadata. Each is declared by the gateway's request model, so it is
never "unrecognized"; through the app (fake backend), a refused field set to a sample value
is a 400 with the doc's code and a ``param`` naming it, a metadata field is served, and a
made-up field is a 400 "Unrecognized request argument". A new SDK release therefore fails
here, naming the field, before a user's request does. The doc's tables, the SDK's fields and
the sample values are read by :mod:`tests.support.conformance`.
"""

from __future__ import annotations

import io
import json
import wave
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.bodies import USER_HI, assert_openai_error
from tests.support.conformance import (
    BEYOND,
    MADE_UP,
    SDK_TABLES,
    Model,
    Row,
    all_rows,
    names,
    rows_of,
    sample_values,
)


def _declared(model: Model, field: str) -> bool:
    """Whether ``model`` takes ``field`` (by name, or by its alias: a form's ``name[]``)."""
    return any(
        field in (name, (info.alias or "").removesuffix("[]"))
        for name, info in model.model_fields.items()
    )


def _sdk_cases() -> list[tuple[str, str]]:
    return sorted((name, field) for name, t in SDK_TABLES.items() for field in t.sdk())


# --- (a) and (b): every SDK field has a class and is declared ----------------------------


@pytest.mark.parametrize(("table", "field"), _sdk_cases())
def test_every_sdk_field_has_one_class_in_the_doc(table: str, field: str) -> None:
    heading = SDK_TABLES[table].heading
    rows = rows_of(heading).get(field, [])
    assert rows, f"docs/conformance.md, '{heading}': no row for the SDK's field '{field}'"
    assert len(rows) == 1, f"'{heading}': '{field}' has {len(rows)} rows"


@pytest.mark.parametrize("table", sorted(SDK_TABLES))
def test_the_doc_names_no_field_the_sdk_lacks(table: str) -> None:
    spec = SDK_TABLES[table]
    stale = set(rows_of(spec.heading)) - spec.sdk()
    assert not stale, f"'{spec.heading}' has rows the SDK does not define: {sorted(stale)}"


@pytest.mark.parametrize(
    ("table", "field"), [case for case in _sdk_cases() if SDK_TABLES[case[0]].model]
)
def test_every_sdk_field_is_declared_by_the_request_model(table: str, field: str) -> None:
    model = SDK_TABLES[table].model
    assert model is not None
    assert _declared(model, field), f"{model.__name__} does not declare '{field}'"


@pytest.mark.parametrize("table", sorted(BEYOND))
def test_every_extension_is_documented_and_declared(table: str) -> None:
    """The request model's fields beyond the SDK's are exactly the doc's extension table."""
    model = SDK_TABLES[table].model
    assert model is not None
    names = {(info.alias or name).removesuffix("[]") for name, info in model.model_fields.items()}
    extensions = names - SDK_TABLES[table].sdk()
    documented = set(rows_of(BEYOND[table]))
    assert extensions == documented, (
        f"{model.__name__}: undocumented {sorted(extensions - documented)}, "
        f"documented but not declared {sorted(documented - extensions)}"
    )


# --- (c): through the app ----------------------------------------------------------------

FUNCTION_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


NAMESPACE_TOOL = {
    "type": "namespace",
    "name": "crm",
    "description": "CRM.",
    "tools": [FUNCTION_TOOL],
}
#: Values the issue-36 clients send for honoured fields: each is served (a 200).
HONOURED: list[tuple[str, str, dict[str, Any]]] = [
    ("chat", "store", {"store": True, "metadata": {"topic": "demo"}}),
    ("chat", "reasoning_effort", {"model": "fake-reasoner", "reasoning_effort": "max"}),
    ("responses", "background", {"background": True}),
    ("responses", "truncation", {"truncation": "auto"}),
    (
        "responses",
        "stream_options",
        {"stream": True, "stream_options": {"include_obfuscation": False}},
    ),
    (
        "responses",
        "background_options",
        {"background": True, "background_options": {"completion_window": "2h"}},
    ),
    ("responses.reasoning", "effort", {"model": "fake-reasoner", "reasoning": {"effort": "max"}}),
    (
        "responses.reasoning",
        "summary",
        {"model": "fake-reasoner", "reasoning": {"summary": "auto"}},
    ),
    ("responses.reasoning", "generate_summary", {"reasoning": {"generate_summary": "concise"}}),
    ("responses.tools", "function", {"tools": [FUNCTION_TOOL]}),
    ("responses.tools", "namespace", {"tools": [NAMESPACE_TOOL]}),
    (
        "responses.include",
        "reasoning.encrypted_content",
        {"store": False, "include": ["reasoning.encrypted_content"]},
    ),
    (
        "responses.include",
        "message.output_text.logprobs",
        {"include": ["message.output_text.logprobs"]},
    ),
    (
        "responses.include",
        "message.input_image.image_url",
        {"include": ["message.input_image.image_url"]},
    ),
    (
        "responses.function_tool",
        "allowed_callers",
        {"tools": [{**FUNCTION_TOOL, "allowed_callers": ["direct"]}]},
    ),
    ("speech", "instructions", {"instructions": "Speak softly."}),
]

#: Each HTTP table: the URL, a valid body, and how a field's sample is put in it.
BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "fake-chat", "messages": USER_HI}),
    "completions": ("/v1/completions", {"model": "fake-chat", "prompt": "Hi"}),
    "responses": ("/v1/responses", {"model": "fake-chat", "input": "Hi"}),
    "embeddings": ("/v1/embeddings", {"model": "fake-embed", "input": "Hi"}),
    "speech": ("/v1/audio/speech", {"model": "fake-tts", "input": "Hi.", "voice": "alloy"}),
    "transcriptions": ("/v1/audio/transcriptions", {"model": "fake-stt"}),
    "translations": ("/v1/audio/translations", {"model": "fake-stt"}),
}


def _endpoint(table: str) -> str:
    return table.split(".")[0].removesuffix("+")


def _with(table: str, field: str, value: Any) -> tuple[dict[str, Any], str]:
    """The fields a request sets to carry ``value`` as ``field`` of ``table``, and the
    ``param`` an error about it names (or starts with)."""
    if table == "responses.reasoning":
        return {"reasoning": {field: value}}, f"reasoning.{field}"
    if table == "responses.tools":
        return {"tools": [value]}, "tools[0]"
    if table == "responses.function_tool":
        return {"tools": [{**FUNCTION_TOOL, field: value}]}, f"tools[0].{field}"
    if table == "responses.include":
        return {"include": [value]}, "include[0]"
    return {field: value}, field


def _wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16_000)
        tone = np.sin(np.arange(16_000) / 10) * 8000
        audio.writeframes(tone.astype("<i2").tobytes())
    return out.getvalue()


async def _post(http: httpx.AsyncClient, table: str, fields: dict[str, Any]) -> httpx.Response:
    url, base = BASES[_endpoint(table)]
    body = {**base, **fields}
    if _endpoint(table) not in ("transcriptions", "translations"):
        return await http.post(url, json=body)
    form: dict[str, Any] = {}
    for name, value in body.items():
        if isinstance(value, list):
            form[f"{name}[]"] = value
        else:
            form[name] = value if isinstance(value, str) else json.dumps(value)
    return await http.post(url, data=form, files={"file": ("a.wav", _wav())})


def _cases(kind: str, http_only: bool) -> list[Any]:
    cases = []
    for table, row in all_rows():
        if row.kind != kind or table.startswith("realtime") == http_only:
            continue
        values = sample_values(table, row) or [None]
        for index, value in enumerate(values):
            cases.append(pytest.param(table, row, value, id=f"{table}-{row.field}-{index}"))
    return cases


@pytest.mark.parametrize(("table", "row", "value"), _cases("refused", http_only=True))
async def test_a_refused_field_is_a_400_with_its_code_naming_it(
    http: httpx.AsyncClient, table: str, row: Row, value: Any
) -> None:
    assert value is not None, f"SAMPLES has no value for {table} '{row.field}'"
    fields, param = _with(table, row.field, value)
    error = assert_openai_error(await _post(http, table, fields), 400, code=row.code)
    assert names(error["param"], param), f"param {error['param']!r} does not name {param!r}"


@pytest.mark.parametrize(("table", "row", "value"), _cases("metadata", http_only=True))
async def test_a_metadata_field_is_accepted(
    http: httpx.AsyncClient, table: str, row: Row, value: Any
) -> None:
    assert value is not None, f"SAMPLES has no value for {table} '{row.field}'"
    fields, _ = _with(table, row.field, value)
    response = await _post(http, table, fields)
    assert response.status_code == 200, response.text
    if row.field == "service_tier":  # the answer says the tier that served it
        assert response.json()["service_tier"] == "default"


@pytest.mark.parametrize(
    ("table", "field", "fields"),
    [pytest.param(t, f, b, id=f"{t}-{f}") for t, f, b in HONOURED],
)
async def test_what_clients_send_for_an_honoured_field_is_served(
    http: httpx.AsyncClient, table: str, field: str, fields: dict[str, Any]
) -> None:
    row = rows_of(SDK_TABLES[table].heading).get(field, [])
    assert row and row[0].kind == "honoured", f"{table} '{field}' is not honoured in the doc"
    response = await _post(http, table, fields)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("table", ["responses.tools", "responses.include"])
def test_every_honoured_value_has_a_sample(table: str) -> None:
    """A table of values has no request model to declare them: each honoured value is
    served by :func:`test_what_clients_send_for_an_honoured_field_is_served`."""
    honoured = {
        f for f, rows in rows_of(SDK_TABLES[table].heading).items() if rows[0].kind == "honoured"
    }
    assert honoured <= {f for t, f, _ in HONOURED if t == table}


@pytest.mark.parametrize("table", sorted(BASES))
async def test_a_made_up_field_is_unrecognized(http: httpx.AsyncClient, table: str) -> None:
    response = await _post(http, table, {MADE_UP: "1"})
    error = assert_openai_error(response, 400, param=MADE_UP)
    assert error["message"] == f"Unrecognized request argument supplied: {MADE_UP}"
    assert error["code"] is not None
