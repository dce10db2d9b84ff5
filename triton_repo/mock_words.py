"""Weightless chat models with the vLLM-backend tensors, for fast tests and benchmarks:
``mock_chat``, and the reasoning models ``mock_r1`` and ``mock_qwen3`` (each model folder's
``model.py`` builds :class:`MockChat`).

It answers every prompt with deterministic words, so the gateway's own cost can be measured
against a direct Triton call. Concurrent requests stream concurrently, as from a batching
engine: one scheduler thread interleaves them. (A thread per request crashed Triton 2.51's
Python backend when several sent responses at once, so all sends happen on that thread.)

Behaviour (documented in ``triton_repo/README.md``):
- it answers the nine words of :data:`SENTENCE` and finishes ``stop``; ``max_tokens`` caps
  the answer (finish ``length``), as a real model's end of sequence would come first;
- a ``stop`` string ends the text before it and finishes ``stop``;
- a prompt token is a whitespace-separated word of the prompt;
- with a structured-output constraint (``json`` schema or ``json_object``) it writes a JSON
  value that fits, a whitespace-separated piece per token, and finishes ``stop`` (or
  ``length`` when ``max_tokens`` cuts it);
- with ``logprobs`` it reports made-up but consistent log probabilities: token ``i`` has
  ``-0.1 * (i % 5 + 1)``, its alternatives are other words of the sentence, each lower;
- as vLLM's engine: a prompt that fills ``context_length`` is refused, and generation stops
  at the end of the context (finish ``length``) whatever ``max_tokens`` asked;
- directives in the prompt steer it for tests: ``[mock:delay_ms=N]`` waits N ms before each
  token (default: the ``token_delay_ms`` config parameter), ``[mock:fail_after=N]`` sends N
  tokens, then an error response, ``[mock:say=TEXT]`` answers TEXT (percent-encoded, so it
  can hold brackets), a whitespace-separated piece per token, ``[mock:words=N]`` answers N
  words (the sentence over and over: a long answer).

A reasoning model (``mock_reasoning: true`` in its config) reasons first: ``<think>`` (left
out when the prompt already opens it, as DeepSeek-R1's template does), the words of
:data:`THOUGHT` (or of a ``[mock:think=TEXT]`` directive), ``</think>``, then its answer as
above. A prompt that already closes the reasoning (a template with thinking switched off, or
the reasoning given) gets the answer only, and so does a request with a constraint: the
Triton vLLM backend enforces a grammar from the first token, which leaves no room to reason.
"""

from __future__ import annotations

import heapq
import itertools
import json
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import triton_python_backend_utils as pb_utils

SENTENCE = "The quick brown fox jumps over the lazy dog."
THOUGHT = "The user wrote to me, so I answer with the sentence I know."
_DIRECTIVE = re.compile(r"\[mock:(delay_ms|fail_after|say|words|think)=([^\]\s]+)\]")


class MockChat:
    def initialize(self, args: dict[str, Any]) -> None:
        import json_example
        import vllm_contract

        self.contract = vllm_contract
        self.example = json_example.example
        parameters = vllm_contract.decoupled_parameters(pb_utils, args)
        self.default_delay_s = float(parameters.get("token_delay_ms") or "0") / 1000.0
        self.reasons = parameters.get("mock_reasoning", "").lower() == "true"
        self.context_length = int(parameters.get("context_length") or "4096")
        self.words = SENTENCE.split(" ")
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])
        self.incoming: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self.scheduler = threading.Thread(target=self._schedule, name="mock-chat", daemon=True)
        self.scheduler.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                decoded: Any = self._check(self.contract.read_request(pb_utils, request))
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

    def _check(self, request: Any) -> Any:
        """Refuses what this model cannot do before anything is sent."""
        n_in = len(request.prompt.split())
        if n_in >= self.context_length:
            raise self.contract.InvalidRequest(
                f"The decoder prompt (length {n_in}) is longer than the maximum model length "
                f"of {self.context_length - 1}."
            )
        constraint = request.params.constraint
        if constraint is not None and next(iter(constraint)) not in ("json", "json_object"):
            raise self.contract.InvalidRequest(
                f"mock_chat cannot enforce '{next(iter(constraint))}' structured outputs"
            )
        return request

    def _answer(self, request: Any, said: str | None) -> tuple[list[str], bool]:
        """The words to send, and whether they are the whole answer (False: the sentence,
        which a ``words`` directive repeats)."""
        constraint = request.params.constraint
        if constraint is not None:
            kind, value = next(iter(constraint.items()))
            answer = self.example(value) if kind == "json" else {"answer": SENTENCE}
            return json.dumps(answer).split(" "), True
        if said is not None:
            return urllib.parse.unquote(said).split(" "), True
        return self.words, False

    def _thoughts(self, request: Any, thought: str | None) -> list[str]:
        """A reasoning model's words before its answer (none: see the module's docstring)."""
        prompt = request.prompt.rstrip()
        if not self.reasons or request.params.constraint is not None:
            return []
        if prompt.endswith("</think>"):
            return []
        opening = [] if prompt.endswith("<think>") else ["<think>"]
        text = urllib.parse.unquote(thought) if thought is not None else THOUGHT
        return [*opening, *text.split(" "), "</think>"]

    def _logprobs(self, index: int, word: str, top: int | None) -> dict[str, Any]:
        logprob = -0.1 * (index % 5 + 1)
        entries = {str(index): {"logprob": logprob, "rank": 1, "decoded_token": word}}
        others = [w for w in self.words if w != word][: top or 0]
        for rank, other in enumerate(others, start=2):
            entries[f"alt{rank}"] = {
                "logprob": logprob - rank,
                "rank": rank,
                "decoded_token": other,
            }
        return entries

    def _stream(self, request: Any, sender: Any) -> Iterator[float]:
        """One request's generation; yields the delay before its next token."""
        directives = dict(_DIRECTIVE.findall(request.prompt))
        delay = self.default_delay_s
        if "delay_ms" in directives:
            delay = float(directives["delay_ms"]) / 1000.0
        fail_after = int(directives["fail_after"]) if "fail_after" in directives else None
        params = request.params
        words, whole = self._answer(request, directives.get("say"))
        thoughts = self._thoughts(request, directives.get("think"))
        if thoughts:
            words, whole = thoughts + words, True
        n_in = len(request.prompt.split())
        length = len(words)
        if not whole and "words" in directives:
            length = int(directives["words"])
        cap = self.context_length - n_in
        if params.max_tokens is not None:
            cap = min(cap, params.max_tokens)
        limit = min(length, cap)
        finish = "length" if limit < length else "stop"
        text = self.contract.StopText(params.stop, params.include_stop_str_in_output)
        unsent_tokens = 0
        logprobs: list[dict[str, Any]] = []
        for i in range(limit):
            if sender.is_cancelled():
                self.contract.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                return
            if fail_after is not None and i == fail_after:
                self.contract.send_error(pb_utils, sender, "mock_chat: failure requested")
                return
            yield delay  # lets the scheduler interleave other requests, even at no delay
            word = words[i % len(words)]
            self.tokens.increment(1)
            unsent_tokens += 1
            if params.logprobs is not None:
                logprobs.append(self._logprobs(i, word, params.logprobs))
            if text.add(word if i == 0 else " " + word):
                finish = "stop"
                break
            piece = text.ready() if request.stream and i < limit - 1 else ""
            if piece:
                sender.send(
                    self.contract.make_response(
                        pb_utils, request, piece, None, n_in, unsent_tokens, logprobs
                    )
                )
                unsent_tokens, logprobs = 0, []
        sender.send(
            self.contract.make_response(
                pb_utils, request, text.rest(), finish, n_in, unsent_tokens, logprobs
            ),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self) -> None:
        self.incoming.put(None)
        self.scheduler.join(timeout=5)
