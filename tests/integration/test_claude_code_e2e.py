"""Claude Code (npm ``@anthropic-ai/claude-code``, pinned in ``tests/js/package-lock.json``)
against the real stack through nginx, configured as its docs show for a gateway:
``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` (a user key), the model and its small fast model
both ``mock_chat`` (whose 32k context holds Claude Code's system prompt and tools), and
non-essential traffic off. ``claude -p --output-format json`` prints the result: the
assertions read it, and the file the agent's Bash call wrote."""

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
