"""The byte-level "engine" behind the stand-in models of other backends.

The stand-ins (``vllm_r*``, the TensorRT-LLM ``ensemble`` steps and BLS, ``seed_llm``)
reproduce the tensors and response rules of backends that cannot run here (vLLM and
TensorRT-LLM need a GPU); this module is the weightless model they all drive, so every
stand-in answers the same prompt the same way:

- a token is one UTF-8 byte: token id = byte value (0-255), so a text's tokens are its
  bytes and :data:`EOS` (256) is the only special token;
- the answer is :data:`ANSWER`, or the text of a ``[say=TEXT]`` directive in the prompt
  (percent-encoded, decoded with ``urllib.parse.unquote``); after the answer the model
  emits :data:`EOS`, and when told to go on (``ignore_eos``, ``min_tokens``) it starts the
  answer again after a space;
- ``[delay_ms=N]`` in the prompt asks the stand-ins to wait N ms before each token, so a
  test can cancel a request half way.

:class:`Scheduler` runs many requests' generations on one thread (sends from several threads
at once crashed Triton 2.51's Python backend), and :func:`embed` gives the embedding
stand-in a small deterministic vector.
"""

from __future__ import annotations

import codecs
import heapq
import itertools
import queue
import re
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

ANSWER = "The quick brown fox jumps over the lazy dog."
EOS = 256
"""The end-of-sequence token: the one token that is not a byte."""
EOS_TEXT = "</s>"
"""How :data:`EOS` is spelled where a token's text is shown (logprobs)."""
VOCAB_SIZE = 257

_DIRECTIVE = re.compile(r"\[(say|delay_ms)=([^\]\s]*)\]")


@dataclass(frozen=True)
class Directives:
    """What the prompt asks of the engine (the last directive of each kind wins)."""

    answer: str
    delay_s: float


def directives(prompt: str) -> Directives:
    found = dict(_DIRECTIVE.findall(prompt))
    answer = urllib.parse.unquote(found["say"]) if "say" in found else ANSWER
    try:
        delay_s = max(0.0, float(found.get("delay_ms", "0")) / 1000.0)
    except ValueError:
        delay_s = 0.0
    return Directives(answer=answer, delay_s=delay_s)


def tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def text_bytes(tokens: Iterable[int]) -> bytes:
    """The bytes of the byte tokens (special and out-of-vocabulary ids are skipped, as a
    tokenizer's ``skip_special_tokens`` does)."""
    return bytes(t for t in tokens if 0 <= t < 256)


def detokenize(tokens: Iterable[int]) -> str:
    """Decodes tokens on their own, as a Hugging Face tokenizer's ``decode`` does: a
    character split across calls comes out as U+FFFD."""
    return text_bytes(tokens).decode("utf-8", errors="replace")


def decode_whole(data: bytes) -> str:
    """Decodes the characters that are complete: an unfinished UTF-8 sequence at the end is
    held back (vLLM's incremental detokenizer waits for the rest of a character)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)


def model_tokens(answer: str) -> Iterator[int]:
    """What the model generates, without end: the answer, EOS, then a space and the answer
    again, EOS, ... (the caller stops it, or skips an EOS it must not produce yet)."""
    first = answer.encode("utf-8")
    again = b" " + first
    yield from first
    yield EOS
    while True:
        yield from again
        yield EOS


def embed(text: str, dimensions: int = 16) -> list[float]:
    """A deterministic unit vector from hashed character trigrams (signed feature hashing):
    texts that share many trigrams point the same way, unrelated texts are far apart."""
    vector = np.zeros(dimensions, dtype=np.float64)
    padded = f"  {text.lower()} "
    for i in range(len(padded) - 2):
        h = zlib.crc32(padded[i : i + 3].encode("utf-8"))
        vector[h % dimensions] += 1.0 if (h >> 16) & 1 else -1.0
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        vector[0], norm = 1.0, 1.0
    return [float(x) for x in (vector / norm).astype(np.float32)]


class Scheduler:
    """One thread that runs every request's generation step by step.

    A job is a generator: each ``next()`` does one step (usually: make a token, send a
    response) and yields how long to wait before the next step. Jobs interleave, so
    concurrent streams progress together, and all responses are sent from this one thread.
    ``execute`` only submits jobs and returns at once.
    """

    def __init__(self, name: str, on_error: Callable[[object, BaseException], None]) -> None:
        self._on_error = on_error
        self._incoming: queue.SimpleQueue[tuple[Iterator[float], object] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=f"{name}-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Iterator[float], context: object = None) -> None:
        """Queues a job; ``context`` is handed to ``on_error`` if the job raises."""
        self._incoming.put((job, context))

    def close(self, timeout_s: float = 5.0) -> None:
        self._incoming.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        due: list[tuple[float, int, Iterator[float], object]] = []
        order = itertools.count()
        while True:
            wait = max(0.0, due[0][0] - time.monotonic()) if due else None
            try:
                item = (
                    self._incoming.get(timeout=wait) if wait != 0.0 else self._incoming.get_nowait()
                )
            except queue.Empty:
                item = ()
            if item is None:
                return
            if item:
                job, context = item
                heapq.heappush(due, (time.monotonic(), next(order), job, context))
                continue
            when, _, job, context = heapq.heappop(due)
            try:
                delay = next(job)
            except StopIteration:
                continue
            except Exception as exc:  # a bug must not leave the request open
                self._on_error(context, exc)
                continue
            heapq.heappush(due, (max(when + delay, time.monotonic()), next(order), job, context))


def triton_model(make: Callable[[Any, dict[str, Any]], Any]) -> type:
    """The ``TritonPythonModel`` class of a stand-in whose rules live in a shared module:
    ``make(pb_utils, args)`` builds the object that executes and finalizes. Each stand-in's
    ``model.py`` is then one line of its own (which class, which release)."""

    class TritonPythonModel:
        def initialize(self, args: dict[str, Any]) -> None:
            import triton_python_backend_utils as pb_utils

            self.model = make(pb_utils, args)

        def execute(self, requests: list[Any]) -> list[Any] | None:
            return self.model.execute(requests)  # type: ignore[no-any-return]

        def finalize(self) -> None:
            self.model.finalize()

    return TritonPythonModel
