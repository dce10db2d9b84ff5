"""Continuous batching on llama.cpp: the running sequences decode together, one token each
per ``llama_decode``, and a new request joins between two steps (as vLLM and llama.cpp's
server schedule), so concurrent users no longer wait for each other's whole answers.

The engine owns one llama.cpp context with a slot (sequence id) per concurrent sequence. It
knows nothing of Triton: a request enters as a :class:`Sequence` whose :class:`Consumer`
turns tokens into responses, and every consumer call happens on the engine's one scheduler
thread (Triton 2.51's Python backend crashed when several threads sent responses at once).

Choices that keep a greedy answer the same, token for token, whoever else is running
(``tests/models/test_smollm2_batching.py`` holds this on the real weights, and holds a lone
answer to the one smollm2 gave before batching):

- The KV cache is not unified: llama.cpp splits ``n_ctx`` into a stream of
  ``context_length`` cells per slot, so a sequence attends over its own cells, laid out as
  when it runs alone. In a unified cache a sequence's cells lie wherever they were free, and
  its logits differed from the lone run's (by up to 0.8 in the first step's logits).
- A prompt is evaluated on its own, in chunks cut at multiples of ``n_batch`` from its
  start (as ``Llama.eval`` cut them), so the chunks do not depend on what else is waiting. A
  step spends at most ``n_batch`` prompt tokens, so a long prompt holds the running
  sequences up a chunk at a time, not for the whole prompt.
- The decode step puts one row per sequence in one batch; llama.cpp's CPU kernels compute
  each row's products on their own, and a row's logits were bit-identical to the same
  sequence's logits in a batch of one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Sampler(Protocol):
    """Draws a sequence's tokens (``llama_sampling.TokenSampler``)."""

    def sample(self, logits: Any) -> int: ...

    def close(self) -> None: ...


class Consumer(Protocol):
    """A request's side of a sequence; the engine calls it from its scheduler thread only."""

    def token(self, token: int, logits: Any) -> bool:
        """Takes a sampled token and a pointer to the logits it was drawn from (valid during
        the call only). False ends the sequence: the consumer has sent its last response."""
        ...

    def cancelled(self) -> bool:
        """True once the client has gone away; asked before each decode of the sequence."""
        ...

    def cancel(self) -> None:
        """Ends the reply of a sequence the engine stopped because it was cancelled."""
        ...

    def fail(self, message: str) -> None:
        """Ends the reply with an error: the engine cannot go on with this sequence."""
        ...


@dataclass(eq=False)
class Sequence:
    """One request's generation: its prompt, sampler and consumer, and where it stands."""

    prompt: list[int]
    sampler: Sampler
    consumer: Consumer
    slot: int = -1
    """The llama.cpp sequence id it holds, -1 while it waits for one."""
    n_past: int = 0
    """Tokens of this sequence in the KV cache (the position of the next one)."""
    pending: int = -1
    """The last sampled token, decoded at the next step."""


#: Work handed to the engine from another thread; it runs on the scheduler thread and
#: returns the sequence to start, or None when it has already answered the request.
Job = Callable[[], Sequence | None]


class BatchEngine:
    """Sequences decoded side by side in one llama.cpp context of ``slots`` sequences.

    ``submit`` takes work from any thread; ``start`` runs the scheduler thread, ``stop`` ends
    it (sequences still running get an error). Tests drive ``step`` themselves instead.
    """

    def __init__(
        self,
        lib: Any,
        model: Any,
        *,
        slots: int,
        context_length: int,
        threads: int,
        n_batch: int = 512,
    ) -> None:
        most = min(n_batch, lib.llama_max_parallel_sequences())
        if not 1 <= slots <= most:
            raise ValueError(f"max_sequences must be between 1 and {most}, got {slots}")
        self.lib = lib
        self.n_batch = n_batch
        self.context_length = context_length
        params = lib.llama_context_default_params()
        params.n_ctx = context_length * slots  # split evenly: context_length per sequence
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = slots
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as Llama() sets it
        self.ctx = lib.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the batching context")
        if lib.llama_n_ctx_seq(self.ctx) < context_length:
            raise RuntimeError(f"llama.cpp gave each sequence fewer than {context_length} cells")
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(n_batch, 0, 1)
        self.free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()  # holding a slot, prompt not all in yet
        self.running: list[Sequence] = []
        self.inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    # -- the scheduler thread ------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Hands work to the scheduler thread (safe from any thread)."""
        self.inbox.put(job)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="llama-batching", daemon=True)
        self.thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ends the scheduler thread (it ends the requests still open with an error), then
        frees the llama.cpp context."""
        if self.thread is not None:
            self.inbox.put(None)
            self.thread.join(timeout=timeout_s)
            if self.thread.is_alive():
                return  # still decoding: leaking the context beats freeing it under use
            self.thread = None
        self.close()

    def close(self) -> None:
        """Ends the requests still open with an error and frees the llama.cpp context."""
        self._end_all("the model is being unloaded")
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def _run(self) -> None:
        try:
            while True:
                if not self.busy and not self._take(self.inbox.get()):
                    return  # idle, it slept until work or the stop came
                if not self.step():
                    return
        finally:  # the open requests are ended from this thread, as every other reply
            self._end_all("the model is being unloaded")

    def _end_all(self, message: str) -> None:
        for seq in [*self.waiting, *self.prefilling, *self.running]:
            self._end(seq, fail=message)
        self.waiting.clear()
        self.prefilling.clear()
        self.running = []

    def step(self) -> bool:
        """One round: new work taken, free slots filled, up to ``n_batch`` prompt tokens
        evaluated, then one token decoded for every running sequence. False once ``stop``
        was asked."""
        while not self.inbox.empty():
            if not self._take(self.inbox.get_nowait()):
                return False
        self._admit()
        self._prefill()
        self._decode()
        return True

    def _take(self, job: Job | None) -> bool:
        """Runs a job and queues its sequence; False for the stop signal (None)."""
        if job is None:
            return False
        try:
            seq = job()
        except Exception:  # a job answers its own request; this is a bug in it
            log.exception("a batching job failed")
            return True
        if seq is not None:
            self.waiting.append(seq)
        return True

    # -- scheduling ----------------------------------------------------------------------

    def _admit(self) -> None:
        while self.free and self.waiting:
            seq = self.waiting.popleft()
            if not self._alive(seq):
                continue
            if not 0 < len(seq.prompt) < self.context_length:
                self._end(seq, fail=f"a prompt must hold 1 to {self.context_length - 1} tokens")
                continue
            seq.slot = self.free.pop()
            # The slot's cells may still hold the previous sequence's tokens.
            self.lib.llama_memory_seq_rm(self.memory, seq.slot, -1, -1)
            self.prefilling.append(seq)

    def _prefill(self) -> None:
        """Evaluates prompt chunks, each in its own decode, until ``n_batch`` tokens are
        spent (at least one chunk). A finished prompt's first token is sampled at once."""
        spent = 0
        while self.prefilling:
            seq = self.prefilling[0]
            end = min(len(seq.prompt), (seq.n_past // self.n_batch + 1) * self.n_batch)
            if spent and spent + end - seq.n_past > self.n_batch:
                return
            chunk = seq.prompt[seq.n_past : end]
            for i, token in enumerate(chunk):
                self._put(i, token, seq.slot, seq.n_past + i, logits=end == len(seq.prompt))
            self.batch.n_tokens = len(chunk)
            spent += len(chunk)
            if not self._eval([seq]):
                self.prefilling.popleft()
                continue
            seq.n_past = end
            if end == len(seq.prompt):
                self.prefilling.popleft()
                if self._emit(seq, len(chunk) - 1):
                    self.running.append(seq)

    def _decode(self) -> None:
        """One token for every running sequence, in one batch: row i is sequence i."""
        self.running = [seq for seq in self.running if self._alive(seq)]
        for row, seq in enumerate(self.running):
            self._put(row, seq.pending, seq.slot, seq.n_past, logits=True)
        self.batch.n_tokens = len(self.running)
        if not self.running:
            return
        if not self._eval(self.running):
            self.running = []
            return
        for seq in self.running:
            seq.n_past += 1
        self.running = [seq for row, seq in enumerate(self.running) if self._emit(seq, row)]

    # -- one sequence --------------------------------------------------------------------

    def _put(self, row: int, token: int, slot: int, pos: int, logits: bool) -> None:
        batch = self.batch
        batch.token[row] = token
        batch.pos[row] = pos
        batch.n_seq_id[row] = 1
        batch.seq_id[row][0] = slot
        batch.logits[row] = logits

    def _eval(self, seqs: list[Sequence]) -> bool:
        """Runs the batch; on failure ends ``seqs`` with an error and returns False."""
        code = self.lib.llama_decode(self.ctx, self.batch)
        if code == 0:
            return True
        for seq in seqs:
            self._end(seq, fail=f"llama_decode failed (code {code})")
        return False

    def _alive(self, seq: Sequence) -> bool:
        """False (after ending it) for a sequence whose client has gone or that is full."""
        try:
            if seq.consumer.cancelled():
                self._end(seq, cancelled=True)
                return False
        except Exception as exc:
            self._end(seq, fail=f"checking for cancellation failed: {exc}")
            return False
        if seq.n_past >= self.context_length:
            self._end(seq, fail=f"the sequence reached {self.context_length} tokens")
            return False
        return True

    def _emit(self, seq: Sequence, row: int) -> bool:
        """Samples the sequence's next token from batch row ``row`` and hands it on; False
        (the sequence ended) when the consumer is done or failed."""
        try:
            logits = self.lib.llama_get_logits_ith(self.ctx, row)
            seq.pending = seq.sampler.sample(logits)
            if seq.consumer.token(seq.pending, logits):
                return True
        except Exception as exc:
            self._end(seq, fail=f"generation failed: {exc}")
            return False
        self._end(seq)
        return False

    def _end(self, seq: Sequence, *, cancelled: bool = False, fail: str | None = None) -> None:
        """Frees the sequence's slot and sampler; tells its consumer when it did not end by
        itself."""
        if seq.slot >= 0:
            self.free.append(seq.slot)
            seq.slot = -1
        seq.sampler.close()
        try:
            if cancelled:
                seq.consumer.cancel()
            elif fail is not None:
                seq.consumer.fail(fail)
        except Exception:  # the reply cannot be ended; nothing else depends on it
            log.exception("ending a sequence failed")
