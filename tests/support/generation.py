"""Whether a model on the stack is generating, by Triton's custom metric of the tokens each
model generated: a test waits for it to stand still instead of sleeping a fixed time."""

from __future__ import annotations

import re
import time

import httpx

from tests.support.stack import GatewayProcess


def generated_tokens(stack: GatewayProcess, model: str) -> float:
    """Triton's custom metric of tokens the model generated (see triton_repo/README.md)."""
    text = httpx.get(stack.triton_metrics, timeout=5).text
    match = re.search(rf'^model_generated_tokens_total{{model="{model}"}} (\S+)$', text, re.M)
    assert match, f"no token metric for {model} in Triton's /metrics"
    return float(match.group(1))


def generation_stops(
    stack: GatewayProcess, model: str, still_s: float = 0.5, timeout_s: float = 10
) -> float:
    """Waits until ``model``'s generated-token counter has stood still for ``still_s``
    (polled every 0.1 s) and returns it: the model stopped generating. Fails when it keeps
    growing for ``timeout_s`` (a cancelled request the model went on with). The models slowed
    for these tests make a token every 20-40 ms, so a running one never stands still that
    long."""
    deadline = time.monotonic() + timeout_s
    last, since = generated_tokens(stack, model), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = generated_tokens(stack, model)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return now
    raise AssertionError(f"{model} kept generating for {timeout_s} s (at {last} tokens)")
