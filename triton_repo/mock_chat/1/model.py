"""A weightless chat model with the vLLM-backend tensors, for fast tests and benchmarks.

It answers every prompt with deterministic words, so the gateway's own cost can be measured
against a direct Triton call. Concurrent requests stream concurrently, as from a batching
engine: one scheduler thread interleaves them. (A thread per request crashed Triton 2.51's
Python backend when several sent responses at once, so all sends happen on that thread.)

Behaviour (documented in ``triton_repo/README.md``):
- without ``max_tokens`` it sends the nine words of :data:`SENTENCE` and finishes ``stop``;
  with ``max_tokens`` it sends exactly that many words (cycling) and finishes ``length``;
- a ``stop`` string ends the text before it and finishes ``stop``;
- a prompt token is a whitespace-separated word of the prompt;
- directives in the prompt steer it for tests: ``[mock:delay_ms=N]`` waits N ms before each
  token (default: the ``token_delay_ms`` config parameter), ``[mock:fail_after=N]`` sends N
  tokens, then an error response.
"""

from __future__ import annotations

import heapq
import itertools
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import triton_python_backend_utils as pb_utils

SENTENCE = "The quick brown fox jumps over the lazy dog."
_DIRECTIVE = re.compile(r"\[mock:(delay_ms|fail_after)=(\d+)\]")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import vllm_contract

        self.contract = vllm_contract
        parameters = vllm_contract.decoupled_parameters(pb_utils, args)
        self.default_delay_s = float(parameters.get("token_delay_ms") or "0") / 1000.0
        self.words = SENTENCE.split(" ")
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])
        self.incoming: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self.scheduler = threading.Thread(target=self._schedule, name="mock-chat", daemon=True)
        self.scheduler.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                decoded: Any = self.contract.read_request(pb_utils, request)
            except self.contract.InvalidRequest as exc:
                decoded = exc
            self.incoming.put((decoded, sender))
        return None

    def _schedule(self) -> None:
        """Runs every request's generator step by step, each step when its delay is due."""
        due: list[tuple[float, int, Any, Any]] = []  # (when, order, steps, sender)
        order = itertools.count()
        while True:
            wait = max(0.0, due[0][0] - time.monotonic()) if due else None
            try:
                item = (
                    self.incoming.get(timeout=wait) if wait != 0.0 else self.incoming.get_nowait()
                )
            except queue.Empty:
                item = ()
            if item is None:  # finalize
                return
            if item:
                decoded, sender = item
                if isinstance(decoded, Exception):
                    self.contract.send_error(pb_utils, sender, str(decoded), "INVALID_ARG")
                else:
                    heapq.heappush(
                        due, (time.monotonic(), next(order), self._stream(decoded, sender), sender)
                    )
                continue
            when, _, steps, sender = heapq.heappop(due)
            try:
                delay = next(steps)
            except StopIteration:
                continue
            except Exception as exc:  # the request must end even if this model has a bug
                self.contract.send_error(pb_utils, sender, f"mock_chat failed: {exc}")
                continue
            heapq.heappush(due, (max(when + delay, time.monotonic()), next(order), steps, sender))

    def _stream(self, request: Any, sender: Any) -> Iterator[float]:
        """One request's generation; yields the delay before its next token."""
        directives = dict(_DIRECTIVE.findall(request.prompt))
        delay = self.default_delay_s
        if "delay_ms" in directives:
            delay = float(directives["delay_ms"]) / 1000.0
        fail_after = int(directives["fail_after"]) if "fail_after" in directives else None
        params = request.params
        limit = params.max_tokens if params.max_tokens is not None else len(self.words)
        finish = "length" if params.max_tokens is not None else "stop"
        n_in = len(request.prompt.split())
        text, sent, unsent_tokens = "", 0, 0
        for i in range(limit):
            if sender.is_cancelled():
                self.contract.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                return
            if fail_after is not None and i == fail_after:
                self.contract.send_error(pb_utils, sender, "mock_chat: failure requested")
                return
            yield delay  # lets the scheduler interleave other requests, even at no delay
            word = self.words[i % len(self.words)]
            text += word if i == 0 else " " + word
            self.tokens.increment(1)
            unsent_tokens += 1
            cut = min((text.find(s) for s in params.stop if s in text), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
                break
            # Hold back a tail that could still grow into a stop string, as engines do.
            safe = len(text) - _stop_prefix_len(text, params.stop)
            if request.stream and safe > sent and i < limit - 1:
                sender.send(
                    self.contract.make_response(
                        pb_utils, request, text[sent:safe], None, n_in, unsent_tokens
                    )
                )
                sent, unsent_tokens = safe, 0
        sender.send(
            self.contract.make_response(
                pb_utils, request, text[sent:], finish, n_in, unsent_tokens
            ),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self) -> None:
        self.incoming.put(None)
        self.scheduler.join(timeout=5)


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best
