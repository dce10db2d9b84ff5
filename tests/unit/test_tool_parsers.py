"""The tool-call parsers: streamed and whole replies read the same, text that is not a
well-formed call stays content."""

from __future__ import annotations

import json

import pytest

from gateway.serving.tool_parsers import ParserDelta, ToolParser, assemble, get_parser
from gateway.serving.tool_parsers.forced import CallArrayParser, NamedCallParser

HERMES = get_parser("hermes")
TOOLS = ["get_weather", "lookup"]
TWO_CALLS = (
    "Let me check. <tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Pa\\"ris", "days": [1, 2]}}\n'
    "</tool_call>\n"
    '<tool_call>{"arguments": {"q": "x"}, "name": "lookup"}</tool_call>'
)


def streamed(parser: ToolParser, text: str, step: int) -> tuple[str, list[dict[str, str]]]:
    """Feeds ``text`` ``step`` characters at a time, as OpenAI clients assemble the deltas."""
    total = ParserDelta()
    for i in range(0, len(text), step):
        total.extend(parser.feed(text[i : i + step]))
    total.extend(parser.finish())
    calls: dict[int, dict[str, str]] = {}
    for piece in total.calls:
        call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
        if piece.id is not None:
            assert not call["id"], "a call is announced once"
            call["id"], call["name"] = piece.id, piece.name or ""
        call["arguments"] += piece.arguments
    return total.content, list(calls.values())


def test_hermes_reads_every_call_and_the_text_before_them() -> None:
    assert HERMES is not None
    content, calls = assemble(HERMES(TOOLS), TWO_CALLS)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "lookup"]
    assert json.loads(calls[0].arguments) == {"city": 'Pa"ris', "days": [1, 2]}
    assert json.loads(calls[1].arguments) == {"q": "x"}
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


@pytest.mark.parametrize("step", [1, 3, 17])
def test_hermes_streams_the_same_calls_in_pieces(step: int) -> None:
    assert HERMES is not None
    content, calls = streamed(HERMES(TOOLS), TWO_CALLS, step)
    assert content.strip() == "Let me check."
    assert [c["name"] for c in calls] == ["get_weather", "lookup"]
    assert json.loads(calls[0]["arguments"]) == {"city": 'Pa"ris', "days": [1, 2]}


def test_hermes_streams_arguments_before_the_call_ends() -> None:
    assert HERMES is not None
    parser = HERMES(TOOLS)
    first = parser.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert first.calls[0].name == "get_weather"
    assert first.calls[0].arguments == '{"city": "Pa'
    assert parser.feed('ris"}}').calls[0].arguments == 'ris"}'


@pytest.mark.parametrize(
    "text",
    [
        "Just text, no calls.",
        'A <tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call> call.',
        "Broken <tool_call>not json at all</tool_call>",
        "Ends on a partial tag <tool_ca",
    ],
)
def test_text_that_is_not_a_well_formed_call_stays_content(text: str) -> None:
    assert HERMES is not None
    content, calls = assemble(HERMES(TOOLS), text)
    assert calls == []
    assert content == text
    assert streamed(HERMES(TOOLS), text, 2) == (text, [])


def test_a_call_cut_by_max_tokens_keeps_what_was_written() -> None:
    assert HERMES is not None
    content, calls = assemble(HERMES(TOOLS), 'Hi <tool_call>{"name": "lookup", "arguments": {"q"')
    assert content == "Hi"
    assert calls[0].name == "lookup" and calls[0].arguments == '{"q"'


def test_forced_calls_read_constrained_json() -> None:
    text = '[{"name": "lookup", "arguments": {"q": "a"}}, {"name": "get_weather", "arguments": {}}]'
    content, calls = assemble(CallArrayParser(TOOLS), text)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("lookup", {"q": "a"}),
        ("get_weather", {}),
    ]
    _, pieces = streamed(CallArrayParser(TOOLS), text, 4)
    assert [p["name"] for p in pieces] == ["lookup", "get_weather"]
    content, calls = assemble(NamedCallParser("lookup"), '{"q": "b"}')
    assert content is None and calls[0].name == "lookup" and calls[0].arguments == '{"q": "b"}'
