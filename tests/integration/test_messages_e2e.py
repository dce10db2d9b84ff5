"""Anthropic's Messages API on the shared real stack (nginx, two replicas, Triton, Redis;
the reasoning model mock_qwen3 loaded through the admin API) with the official ``anthropic``
SDK: text and its stream, max_tokens, a tool
round trip, thinking, count_tokens, a key's model allow-list and budget, nginx's 413, all in
Anthropic's error shape; and Claude Code (npm ``@anthropic-ai/claude-code``, pinned in
``tests/js/package-lock.json``) configured as its docs show for a gateway:
``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` (a user key), the model and its small fast
model both ``mock_chat`` (whose 32k context holds Claude Code's system prompt and tools), and
non-essential traffic off. ``claude -p --output-format json`` prints the result: the
assertions read it, and the file the agent's Bash call wrote."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.bodies import mock_say
from tests.support.shapes import CLAUDE_WEATHER
from tests.support.shared_stack import UPLOAD_LIMIT_MB
from tests.support.stack import GatewayProcess

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


@pytest.fixture(scope="module")
def claude(stack: GatewayProcess) -> anthropic.Anthropic:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        answer = http.post("/admin/models/mock_qwen3/load")
        assert answer.status_code == 200, answer.text
    return anthropic.Anthropic(base_url=stack.base_url, api_key=stack.admin_key, max_retries=0)


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_text_whole_and_streamed_through_nginx(claude: anthropic.Anthropic) -> None:
    sentence = "Paris is the capital of France."
    message = claude.messages.create(
        model="mock_chat", max_tokens=64, messages=ask(f"Capital? {mock_say(sentence)}")
    )
    assert message.content[0].text == sentence  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    with claude.messages.stream(
        model="mock_chat", max_tokens=64, messages=ask(f"Capital? {mock_say(sentence)}")
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == sentence and final.usage.input_tokens > 0


def test_max_tokens_cuts_the_answer(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="mock_chat", max_tokens=5, messages=ask("Tell me about the sea. [mock:words=50]")
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    assert len(message.content[0].text.split()) == 5  # type: ignore[union-attr]


def test_a_stop_sequence_is_named_whole_and_streamed(claude: anthropic.Anthropic) -> None:
    """mock_chat lists include_stop_str_in_output among its sampling_extensions: it keeps
    the stop string, and the gateway cuts it and names it."""
    asked: dict = {
        "model": "mock_chat",
        "max_tokens": 64,
        "messages": ask("Tell me about dogs."),
        "stop_sequences": ["dog", " jumps"],
    }
    message = claude.messages.create(**asked)
    assert message.content[0].text == "The quick brown fox"  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " jumps")
    with claude.messages.stream(**asked) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "The quick brown fox" and final.stop_sequence == " jumps"


def test_a_tool_round_trip_on_mock_chat(claude: anthropic.Anthropic) -> None:
    call = f"<tool_call>{json.dumps(CALL)}</tool_call>"
    asked = claude.messages.create(
        model="mock_chat",
        max_tokens=64,
        messages=ask(f"Weather? {mock_say(call)}"),
        tools=[CLAUDE_WEATHER],
    )
    assert asked.stop_reason == "tool_use"
    (use,) = [block for block in asked.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    answer = claude.messages.create(
        model="mock_chat",
        max_tokens=64,
        tools=[CLAUDE_WEATHER],
        messages=[
            {"role": "user", "content": f"Weather? {mock_say('It is sunny in Paris.')}"},
            {"role": "assistant", "content": [block.model_dump() for block in asked.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert answer.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]


def test_thinking_from_a_reasoning_model(claude: anthropic.Anthropic) -> None:
    thought = "The user asks where; I know it is Paris."
    prompt = f"Where? [mock:think={urllib.parse.quote(thought)}] {mock_say('Paris.')}"
    with claude.messages.stream(
        model="mock_qwen3",
        max_tokens=256,
        messages=ask(prompt),
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking.strip() == thought  # type: ignore[union-attr]
    assert final.content[1].text.strip() == "Paris."  # type: ignore[union-attr]


def test_count_tokens_and_a_keys_allow_list(
    claude: anthropic.Anthropic, stack: GatewayProcess
) -> None:
    short = claude.messages.count_tokens(model="mock_chat", messages=ask("Hi"))
    longer = claude.messages.count_tokens(
        model="mock_chat", messages=ask("Hi"), system="You answer in one word, always."
    )
    assert 0 < short.input_tokens < longer.input_tokens
    key = stack.create_key("messages", models=["mock_qwen3"])["key"]
    user = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        user.messages.create(model="mock_chat", max_tokens=8, messages=ask("Hi"))
    assert refused.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    allowed = user.messages.create(
        model="mock_qwen3", max_tokens=256, messages=ask(f"Hi {mock_say('Hello.')}")
    )
    assert [block.type for block in allowed.content] == ["text"]  # thinking not asked for


def test_a_keys_budget_stops_it_in_anthropics_shape(stack: GatewayProcess) -> None:
    key = stack.create_key("budgeted", budget={"tokens_per_day": 60})["key"]
    user = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as spent:
        for _ in range(20):
            user.messages.create(model="mock_chat", max_tokens=16, messages=ask("Hi"))
    assert spent.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "budget" in spent.value.body["error"]["message"]  # type: ignore[index]


def test_nginxs_own_413_has_anthropics_shape(stack: GatewayProcess) -> None:
    # Over nginx's cap (the gateway's request limit, UPLOAD_LIMIT_MB + 1 on this stack).
    huge = b'{"model": "mock_chat", "x": "' + b"x" * ((UPLOAD_LIMIT_MB + 2) * 1024 * 1024) + b'"}'
    headers = {"x-api-key": stack.admin_key, "content-type": "application/json"}
    refused = httpx.post(stack.base_url + "/v1/messages", content=huge, headers=headers)
    assert refused.status_code == 413, refused.text
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "request_too_large"


CLAUDE = Path(__file__).resolve().parents[1] / "js" / "node_modules" / ".bin" / "claude"
#: What mock_chat answers a prompt without directives (triton_repo/mock_words.py).
SENTENCE = "The quick brown fox jumps over the lazy dog."


def claude_print(
    stack: GatewayProcess, tmp_path: Path, prompt: str, *tools: str
) -> tuple[dict[str, Any], Path, str]:
    """Runs ``claude -p PROMPT`` in a fresh workspace and home; returns its JSON result, the
    workspace, and everything it printed (for failure messages)."""
    assert CLAUDE.exists(), "run: npm ci --prefix tests/js"
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    key = stack.user_headers()["Authorization"].removeprefix("Bearer ")
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
        "ANTHROPIC_BASE_URL": stack.base_url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": "mock_chat",
        "ANTHROPIC_SMALL_FAST_MODEL": "mock_chat",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "mock_chat",
        # Its default max_tokens (32,000) and the prompt would overflow a 32k context.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    command = [str(CLAUDE), "-p", "--output-format", "json", "--model", "mock_chat"]
    if tools:
        command += [f"--allowedTools={','.join(tools)}"]
    result = subprocess.run(
        [*command, prompt],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, report
    return json.loads(result.stdout), workspace, report


def test_claude_code_answers_a_prompt_on_mock_chat(stack: GatewayProcess, tmp_path: Path) -> None:
    result, _, report = claude_print(stack, tmp_path, "Say hello")
    assert result["is_error"] is False, report
    assert result["result"] == SENTENCE, report


def test_claude_code_runs_the_bash_call_it_is_steered_to_make(
    stack: GatewayProcess, tmp_path: Path
) -> None:
    # mock_chat writes a call of Claude Code's Bash tool; the command writes a file and
    # prints a directive, so the answer after the call is the command's output: proof that
    # Claude Code sent the tool_result back and the gateway put it in the prompt.
    command = "echo claude-ran-this > proof.txt && echo " + mock_say("Wrote proof.txt")
    call = {"name": "Bash", "arguments": {"command": command, "description": "Write a file"}}
    result, workspace, report = claude_print(
        stack, tmp_path, mock_say(f"<tool_call>{json.dumps(call)}</tool_call>"), "Bash"
    )
    assert (workspace / "proof.txt").read_text() == "claude-ran-this\n", report
    assert result["result"] == "Wrote proof.txt", report
