"""The official npm ``openai`` client and the Vercel AI SDK against the real stack, through
nginx.

The checks live in ``tests/js/*.mjs`` (node:assert, one line per check); ``make test``
installs the pinned client from ``tests/js/package-lock.json`` with ``npm ci``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.stack import GatewayProcess

JS_DIR = Path(__file__).resolve().parents[1] / "js"


def run_script(stack: GatewayProcess, script: str) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node, "node is not installed (make test installs Debian's nodejs)"
    assert (JS_DIR / "node_modules" / "openai").is_dir(), "run: npm ci --prefix tests/js"
    key = stack.user_headers()["Authorization"].removeprefix("Bearer ")
    env = {**os.environ, "OPENAI_BASE_URL": stack.base_url + "/v1", "OPENAI_API_KEY": key}
    return subprocess.run(
        [node, script], cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=180
    )


def test_npm_client_agents_calls(stack: GatewayProcess) -> None:
    result = run_script(stack, "agents.mjs")
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert report.count("ok - ") == 5, report


def test_npm_client_responses_and_embeddings(stack: GatewayProcess) -> None:
    result = run_script(stack, "responses.mjs")
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert report.count("ok - ") == 3, report


def test_vercel_ai_sdk_holds_a_three_turn_chat_on_the_responses_provider(
    stack: GatewayProcess,
) -> None:
    # Turns 2 and 3 send the stored assistant messages as item_reference items.
    result = run_script(stack, "vercel_chat.mjs")
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert report.count("ok - ") == 1, report
