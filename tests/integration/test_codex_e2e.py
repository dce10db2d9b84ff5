"""The OpenAI Codex CLI (npm ``@openai/codex``, pinned in ``tests/js/package-lock.json``)
against the real stack through nginx, configured as its users configure a custom provider.

Codex speaks only the Responses API, statelessly: every request is ``stream: true``,
``store: false``, with ``include: ["reasoning.encrypted_content"]``, ``reasoning.summary``,
``client_metadata``, ``namespace`` tools, and the whole conversation sent back each turn
(the tool calls and their ``function_call_output``). ``codex exec --json`` prints one JSON
event a line: the assertions read those, and the files the agent wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.bodies import mock_say
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

CODEX = Path(__file__).resolve().parents[1] / "js" / "node_modules" / ".bin" / "codex"
#: What mock_chat answers a prompt without directives (triton_repo/mock_words.py).
SENTENCE = "The quick brown fox jumps over the lazy dog."


def configure(home: Path, stack: GatewayProcess, *, web_search: bool = False) -> None:
    """``$CODEX_HOME/config.toml`` as Codex's docs show a custom provider, with a short
    instructions file (its own prompt is ~30 KB, more than a small model's context), no
    approval prompts and the workspace as the only place it may write."""
    instructions = home / "instructions.md"
    instructions.write_text("You are a coding agent in a test. Answer briefly.\n")
    lines = [
        'model = "mock_chat"',
        'model_provider = "gateway"',
        'approval_policy = "never"',
        'sandbox_mode = "workspace-write"',
        f"model_instructions_file = {json.dumps(str(instructions))}",
        "check_for_update_on_startup = false",
    ]
    if not web_search:
        lines.append('web_search = "disabled"')
    lines += [
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[model_providers.gateway]",
        'name = "Triton gateway"',
        f"base_url = {json.dumps(stack.base_url + '/v1')}",
        'env_key = "GATEWAY_API_KEY"',
        'wire_api = "responses"',
    ]
    (home / "config.toml").write_text("\n".join(lines) + "\n")


def codex_exec(
    stack: GatewayProcess, tmp_path: Path, prompt: str, *, web_search: bool = False
) -> tuple[list[dict[str, Any]], Path, str]:
    """Runs ``codex exec --json PROMPT`` in a fresh workspace; returns its events, the
    workspace, and everything it printed (for failure messages)."""
    assert CODEX.exists(), "run: npm ci --prefix tests/js"
    home, workspace = tmp_path / "codex-home", tmp_path / "workspace"
    home.mkdir()
    workspace.mkdir()
    configure(home, stack, web_search=web_search)
    key = stack.user_headers()["Authorization"].removeprefix("Bearer ")
    env = {
        **os.environ,
        "CODEX_HOME": str(home),
        "HOME": str(tmp_path),  # the shell tool's login shell reads no user profile
        "GATEWAY_API_KEY": key,
    }
    result = subprocess.run(
        [str(CODEX), "exec", "--json", "--strict-config", "--skip-git-repo-check", prompt],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return events, workspace, report


def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == kind
    ]


def test_codex_answers_a_prompt_on_mock_chat(stack: GatewayProcess, tmp_path: Path) -> None:
    events, _, report = codex_exec(stack, tmp_path, "Say hello")
    assert [e["type"] for e in events if e["type"].startswith("turn.")] == [
        "turn.started",
        "turn.completed",
    ], report
    assert [m["text"] for m in items(events, "agent_message")] == [SENTENCE], report


def test_codex_runs_the_tool_call_it_is_steered_to_make(
    stack: GatewayProcess, tmp_path: Path
) -> None:
    # mock_chat writes a call of Codex's shell tool; the command writes a file and prints a
    # directive, so the answer after the call is the command's output: proof that Codex
    # sent the function_call_output back and the gateway put it in the prompt.
    command = "echo codex-ran-this > proof.txt && echo " + mock_say("Wrote proof.txt")
    call = {"name": "exec_command", "arguments": {"cmd": command}}
    events, workspace, report = codex_exec(
        stack, tmp_path, mock_say(f"<tool_call>{json.dumps(call)}</tool_call>")
    )
    assert events[-1]["type"] == "turn.completed", report
    [ran] = items(events, "command_execution")
    assert (ran["status"], ran["exit_code"]) == ("completed", 0), report
    assert (workspace / "proof.txt").read_text() == "codex-ran-this\n", report
    assert [m["text"] for m in items(events, "agent_message")] == ["Wrote proof.txt"], report


def test_codex_with_web_search_on_is_told_what_to_turn_off(
    stack: GatewayProcess, tmp_path: Path
) -> None:
    # Left on, Codex offers OpenAI's hosted web_search tool, which no model here can run:
    # a 400 unsupported_tool naming it, not an "unrecognized argument".
    events, _, report = codex_exec(stack, tmp_path, "Say hello", web_search=True)
    [failed] = [e for e in events if e["type"] == "turn.failed"]
    error = json.loads(failed["error"]["message"])["error"]
    assert error["code"] == "unsupported_tool", report
    assert "web_search" in error["message"], report
