"""Stand-in for TensorRT-LLM's LLM API Triton model (``triton_backend/all_models/llmapi/
tensorrt_llm`` in ``NVIDIA/TensorRT-LLM``): ``trtllm_llmapi`` (decoupled) and
``trtllm_llmapi_sync`` (upstream's shipped ``decoupled: False``) build :class:`LlmApiStandin`.

The tensors and rules are upstream's ``config.pbtxt``, ``1/model.py`` and ``1/helpers.py``
(documented in ``README.md``); the engine is ``mock_chat``'s word model (``mock_words.py``):

- ``max_batch_size`` and decoupling come from ``model.yaml``'s ``triton_config`` through
  ``auto_complete_config``; ``cancellation_check_period_ms`` (default 100) too.
- The prompt is element 0 of the 1-D ``text_input``. The answer is the sentence (or a
  ``[mock:...]`` directive's words), one word per token, at most ``max_tokens`` (the LLM
  API's default: 32). ``text_output`` is the LLM API's ``CompletionOutput.text``: the whole
  text so far (cumulative while streaming), after the prompt unless
  ``sampling_param_exclude_input_from_output`` is true (the Triton model's default: false).
- A stop string ends the text before it (``finish_reason`` ``stop``, ``stop_reason`` the
  string). As the engine matches stop words token by token, a stream may show the start of
  a stop string made of several words before the final response drops it.
- Any failure ends the request with ``Error generating request: ...`` (code INTERNAL) and a
  ``text_output`` of ``["N/A"]``, as upstream: streaming on a non-decoupled model, LoRA
  inputs, the context check of the engine, a ``[mock:fail_after=N]`` directive.
- ``stop`` true aborts the running request that has the same Triton request id: a stream
  ends with a final response whose finish reason is ``cancelled``, a non-streamed request
  gets no response at all; the stop request itself is answered with a CANCELLED error.
  A client's cancellation is polled every ``cancellation_check_period_ms``.

Generation runs on one scheduler thread that also sends every response (a thread per
request crashed Triton 2.51's Python backend when several sent at once, see
``mock_words.py``); :class:`Generation` is the engine, free of Triton, for unit tests.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import queue
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mock_words import _DIRECTIVE, SENTENCE

DEFAULT_MAX_TOKENS = 32
"""``tensorrt_llm.SamplingParams.max_tokens``'s default: the most tokens without the input."""
BLOCK_WORDS = 4
"""Prompt words per KV-cache block of the stand-in (a real engine's block: 32 tokens)."""
CACHED_BLOCKS = 4096
"""Blocks the stand-in's prefix cache keeps (least recently used dropped first)."""
LORA_CKPT_SOURCES = ("hf", "nemo")
SAMPLING_IGNORED = (
    "best_of",
    "temperature",
    "top_k",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "seed",
)


class EngineError(Exception):
    """A request the engine refuses or fails; sent as ``Error generating request: ...``."""


# -- the engine: mock_chat's words, the LLM API's outputs ----------------------------------------


class PrefixCache:
    """The engine's KV-cache block reuse, per model instance: a prompt's full blocks of
    :data:`BLOCK_WORDS` words are reused when an earlier prompt had the same words up to
    the block's end."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.total_allocated = 0

    def admit(self, words: list[str], max_new: int) -> dict[str, int]:
        """Counts a new request's blocks and caches its full prompt blocks: the numbers of
        ``KvCacheMetrics`` (reused, missed, new, total)."""
        full = len(words) // BLOCK_WORDS
        reused = 0
        for i in range(1, full + 1):
            key = tuple(words[: i * BLOCK_WORDS])
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            reused = i
        for i in range(reused + 1, full + 1):
            self.blocks[tuple(words[: i * BLOCK_WORDS])] = None
        while len(self.blocks) > CACHED_BLOCKS:
            self.blocks.popitem(last=False)
        context_blocks = -(-len(words) // BLOCK_WORDS)
        new = -(-(len(words) + max_new) // BLOCK_WORDS) - reused
        self.total_allocated += new
        return {
            "reused": reused,
            "missed": context_blocks - reused,
            "new": new,
            "total": self.total_allocated,
        }


@dataclass
class Generation:
    """One request's generation: ``step()`` adds a word; the fields are what the LLM API's
    ``RequestOutput`` carries (``text``, ``finished``, ``finish_reason``, ``stop_reason``)."""

    prompt: str
    words: list[str]
    max_tokens: int
    stops: list[str] = field(default_factory=list)
    echo: bool = True
    fail_after: int | None = None
    generated: str = ""
    count: int = 0
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | None = None

    @property
    def text(self) -> str:
        return self.prompt + self.generated if self.echo else self.generated

    def step(self) -> None:
        """Generates the next word (or fails as a directive asked); sets ``finished``."""
        if self.fail_after is not None and self.count == self.fail_after:
            raise EngineError("the engine failed (a [mock:fail_after] directive)")
        word = self.words[self.count % len(self.words)]
        self.generated += word if self.count == 0 else " " + word
        self.count += 1
        hits = [(self.generated.find(s), s) for s in self.stops if s and s in self.generated]
        if hits:
            at, stop = min(hits)
            self.generated = self.generated[:at]
            self.finished, self.finish_reason, self.stop_reason = True, "stop", stop
        elif self.count >= len(self.words):  # the end of the answer (mock_chat's rule)
            self.finished, self.finish_reason = True, "stop"
        elif self.count >= self.max_tokens:
            self.finished, self.finish_reason = True, "length"

    def abort(self) -> None:
        """``RequestOutput.abort()``: the next output is the final one, finish ``cancelled``."""
        if not self.finished:
            self.finished, self.finish_reason = True, "cancelled"


def answer_words(prompt: str) -> tuple[list[str], int | None]:
    """mock_chat's answer to a prompt (its ``[mock:say|words]`` directives) and the
    ``fail_after`` directive."""
    directives = dict(_DIRECTIVE.findall(prompt))
    fail_after = int(directives["fail_after"]) if "fail_after" in directives else None
    if "say" in directives:
        return urllib.parse.unquote(directives["say"]).split(" "), fail_after
    words = SENTENCE.split(" ")
    if "words" in directives:
        n = int(directives["words"])
        return [words[i % len(words)] for i in range(n)], fail_after
    return words, fail_after


def word_delay_s(prompt: str, default_s: float) -> float:
    directives = dict(_DIRECTIVE.findall(prompt))
    return float(directives["delay_ms"]) / 1000.0 if "delay_ms" in directives else default_s


def read_model_yaml(model_dir: str) -> dict[str, Any]:
    """``model.yaml`` (or ``$LLM_CONFIG_PATH``, relative to the model's folder), as upstream
    reads it."""
    import yaml

    path = os.path.join(model_dir, os.environ.get("LLM_CONFIG_PATH", "model.yaml"))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"'{path}' containing TRT-LLM engine args not found")
    with open(path) as file:
        loaded = yaml.safe_load(file)
    if not isinstance(loaded, dict) or not isinstance(loaded.get("triton_config"), dict):
        raise ValueError(f"'{path}' has no triton_config mapping")
    return loaded


# -- the Triton model --------------------------------------------------------------------------


@dataclass
class Job:
    """A running request (upstream's ``RequestData`` and its coroutine's state)."""

    key: int
    user_id: str
    request: Any
    sender: Any
    streaming: bool
    output_config: dict[str, bool]
    perf: bool
    gen: Generation
    delay_s: float
    kv: dict[str, int]
    arrival_ns: int
    first_token_ns: int = 0
    last_token_ns: int = 0
    closed: bool = False
    """The client went away: its CANCELLED error is sent, nothing more can be."""
    done: bool = False


class LlmApiStandin:
    """The Triton model; each model folder's ``model.py`` subclasses it with ``model_dir``."""

    model_dir = ""

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        """Sets decoupling and ``max_batch_size`` from ``model.yaml``'s ``triton_config``
        (they are not in ``config.pbtxt``), as upstream."""
        triton_config = read_model_yaml(cls.model_dir)["triton_config"]
        auto_complete_model_config.set_model_transaction_policy(
            dict(decoupled=bool(triton_config["decoupled"]))
        )
        auto_complete_model_config.set_max_batch_size(int(triton_config["max_batch_size"]))
        return auto_complete_model_config

    def initialize(self, args: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb_utils
        from vllm_contract import TokenCounter

        self.pb = pb_utils
        loaded = read_model_yaml(self.model_dir)
        triton_config = loaded["triton_config"]
        self.decoupled = bool(triton_config["decoupled"])
        self.multimodal = bool(triton_config.get("multimodal", False))
        self.poll_s = int(triton_config.get("cancellation_check_period_ms", 100)) / 1000.0
        self.max_seq_len = int(loaded.get("max_seq_len", 4096))
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.default_delay_s = float(params.get("token_delay_ms") or "0") / 1000.0
        text_config = pb_utils.get_output_config_by_name(config, "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(text_config["data_type"])
        self.tokens = TokenCounter(pb_utils, args["model_name"])
        self.cache = PrefixCache()
        self.running: dict[int, Job] = {}  # upstream's req_id_to_request_data
        self.by_user: dict[str, set[int]] = {}  # upstream's triton_user_id_to_req_ids
        self.keys = itertools.count()
        self.due: list[tuple[float, int, Job]] = []  # (when, order, job): the next steps
        self.order = itertools.count()
        self.incoming: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.scheduler = threading.Thread(target=self._schedule, name="llmapi", daemon=True)
        self.scheduler.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self.incoming.put(request)
        return None

    def finalize(self) -> None:
        self.incoming.put(None)
        self.scheduler.join(timeout=5)

    # -- scheduling: every send happens on this thread ---------------------------------------

    def _schedule(self) -> None:
        due, order = self.due, self.order
        next_poll = time.monotonic() + self.poll_s
        while True:
            now = time.monotonic()
            if now >= next_poll:
                self._poll_cancelled()
                next_poll = now + self.poll_s
            until = min(next_poll, due[0][0]) if due else next_poll
            try:
                request = self.incoming.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                request = False
            if request is None:  # finalize
                return
            if request is not False:
                job = self._start(request)
                if job is not None:  # as mock_chat, a word's delay comes before it
                    heapq.heappush(due, (time.monotonic() + job.delay_s, next(order), job))
                continue
            if not due or due[0][0] > time.monotonic():
                continue
            _, _, job = heapq.heappop(due)
            if job.done:
                continue
            if self._advance(job):
                heapq.heappush(due, (time.monotonic() + job.delay_s, next(order), job))

    def _start(self, request: Any) -> Job | None:
        """Upstream's ``_execute_single_request`` up to generation: a stop request is
        answered here; a new request is checked and registered."""
        sender = request.get_response_sender()
        user_id = request.request_id()
        try:
            stop = self._scalar(request, "stop")
        except EngineError as exc:
            self._fail(sender, exc)
            return None
        if stop:
            self._handle_stop(user_id, sender)
            return None
        try:
            job = self._convert(request, sender, user_id)
        except Exception as exc:
            self._fail(sender, exc)
            return None
        self.running[job.key] = job
        if user_id:
            self.by_user[user_id] = {job.key}
        return job

    def _advance(self, job: Job) -> bool:
        """One step of a job; False once it has ended."""
        try:
            if not job.gen.finished:
                job.gen.step()
                self.tokens.increment(1)
                job.last_token_ns = time.monotonic_ns()
                job.first_token_ns = job.first_token_ns or job.last_token_ns
        except Exception as exc:
            self._fail(job.sender, exc)
            self._end(job)
            return False
        final = job.gen.finished
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if job.streaming and not job.closed:
            # every output goes out, a stop request's "cancelled" one too
            job.sender.send(self._response(job), flags=flags)
        elif not job.streaming and final and job.key in self.running:
            # a non-streamed request that a stop request or its client cancelled gets none
            job.sender.send(self._response(job), flags=flags)
        if final:
            self._end(job)
        return not final

    def _end(self, job: Job) -> None:
        job.done = True
        self.running.pop(job.key, None)
        self.by_user.pop(job.user_id, None)  # as upstream, even if a newer request took the id
        job.request = None

    def _poll_cancelled(self) -> None:
        """Upstream's ``cancellation_loop``: a request whose client went away is aborted and
        answered with a CANCELLED error; its engine output is then dropped."""
        for key, job in list(self.running.items()):
            if job.request.is_cancelled():
                self._abort(job)
                job.closed = True
                job.sender.send(
                    self.pb.InferenceResponse(
                        error=self.pb.TritonError(
                            "Request cancelled by client", self.pb.TritonError.CANCELLED
                        )
                    ),
                    flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                del self.running[key]

    def _abort(self, job: Job) -> None:
        """Ends a job's generation; its last output is due now, whatever its word delay."""
        job.gen.abort()
        heapq.heappush(self.due, (time.monotonic(), next(self.order), job))

    def _handle_stop(self, user_id: str, sender: Any) -> None:
        pb = self.pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if not user_id:
            message = "A request id must be provided for request cancellation"
            sender.send(pb.InferenceResponse(error=pb.TritonError(message)), flags=final)
            return
        for key in self.by_user.get(user_id, set()):
            job = self.running.pop(key, None)
            if job is not None:
                self._abort(job)
        sender.send(
            pb.InferenceResponse(
                error=pb.TritonError("Request cancelled by client", pb.TritonError.CANCELLED)
            ),
            flags=final,
        )

    def _fail(self, sender: Any, exc: Exception) -> None:
        """Upstream's error response: the text of the exception, INTERNAL, ``["N/A"]``."""
        pb = self.pb
        text_output = pb.Tensor("text_output", np.asarray(["N/A"], dtype=self.output_dtype))
        sender.send(
            pb.InferenceResponse(
                output_tensors=[text_output],
                error=pb.TritonError(f"Error generating request: {exc}"),
            ),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    # -- reading a request -------------------------------------------------------------------

    def _scalar(self, request: Any, name: str) -> Any:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        array = tensor.as_numpy()
        if array.size != 1:
            raise EngineError(f"Expected a scalar tensor for tensor {name}")
        return array.item(0)

    def _string(self, request: Any, name: str) -> str | None:
        value = self._scalar(request, name)
        if isinstance(value, (bytes, np.bytes_)):
            return bytes(value).decode("utf-8")
        return None if value is None else str(value)

    def _convert(self, request: Any, sender: Any, user_id: str) -> Job:
        """Upstream's ``_convert_request`` and the checks before ``generate_async``."""
        tensor = self.pb.get_input_tensor_by_name(request, "text_input")
        if tensor is None:
            raise EngineError("text_input is missing from the request")
        texts = tensor.as_numpy()
        if len(texts.shape) > 1:
            raise EngineError(
                "The current implementation only supports text_input being a 1D tensor."
            )
        prompt = texts[0]
        prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
        # read as upstream (each a scalar); the words do not depend on sampling
        for name in SAMPLING_IGNORED:
            self._scalar(request, f"sampling_param_{name}")
        max_tokens = self._scalar(request, "sampling_param_max_tokens")
        exclude = self._scalar(request, "sampling_param_exclude_input_from_output")
        perf = self._scalar(request, "sampling_param_return_perf_metrics")
        stop_tensor = self.pb.get_input_tensor_by_name(request, "sampling_param_stop")
        stops = []
        if stop_tensor is not None:
            for item in stop_tensor.as_numpy().reshape(-1):
                stops.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        output_config = {
            name: bool(self._scalar(request, name) or False)
            for name in ("return_finish_reason", "return_stop_reason", "return_cumulative_logprob")
        }
        streaming = bool(self._scalar(request, "streaming") or False)
        lora_name = self._lora(request)
        images = self._images(request)
        if streaming and not self.decoupled:
            raise EngineError("Streaming is only supported in decoupled mode.")
        words, fail_after = answer_words(prompt)
        if lora_name is not None:
            words = [f"(lora {lora_name})", *words]
        if images:
            words = [f"({images} images)", *words]
        n_in = len(prompt.split())
        cap = DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
        if cap < 1:
            raise EngineError(f"max_tokens ({cap}) must be greater than 0")
        if n_in + cap > self.max_seq_len:
            raise EngineError(
                f"The sum of prompt length ({n_in}) and query length (0) max_tokens ({cap}) "
                f"should not exceed max_seq_len ({self.max_seq_len})"
            )
        gen = Generation(prompt, words, cap, stops, echo=not exclude, fail_after=fail_after)
        return Job(
            key=next(self.keys),
            user_id=user_id,
            request=request,
            sender=sender,
            streaming=streaming,
            output_config=output_config,
            perf=bool(perf),
            gen=gen,
            delay_s=word_delay_s(prompt, self.default_delay_s),
            kv=self.cache.admit(prompt.split(), min(cap, len(words))),
            arrival_ns=time.monotonic_ns(),
        )

    def _lora(self, request: Any) -> str | None:
        """helpers.py's LoRA rules: the three inputs together, a known checkpoint format, a
        path that exists on this server. No weights are applied: the answer names the
        adapter."""
        lora_id = self._scalar(request, "lora_id")
        name = self._string(request, "lora_name")
        path = self._string(request, "lora_path")
        if lora_id is None and name is None and path is None:
            return None
        if lora_id is None or name is None or path is None:
            raise EngineError("lora_id, lora_name, and lora_path must all be provided together")
        source = self._string(request, "lora_ckpt_source")
        if source is not None and source not in LORA_CKPT_SOURCES:
            raise EngineError(
                f"lora_ckpt_source must be one of {LORA_CKPT_SOURCES}, got {source!r}"
            )
        if not os.path.exists(path):
            raise EngineError(f"lora_path does not exist on the Triton server's filesystem: {path}")
        return name

    def _images(self, request: Any) -> int:
        """How many ``image_url`` entries a multimodal model got (http(s) URLs or data URIs;
        none is fetched); a model without ``multimodal`` ignores them."""
        tensor = self.pb.get_input_tensor_by_name(request, "image_url")
        if tensor is None or not self.multimodal:
            return 0
        urls = [u.decode("utf-8") if isinstance(u, bytes) else str(u) for u in tensor.as_numpy()]
        for url in urls:
            if not url.startswith(("http://", "https://", "data:")):
                raise EngineError(
                    f"image_url must be an http(s):// URL or a data: URI, got {url[:40]!r}"
                )
        return len(urls)

    # -- a response ----------------------------------------------------------------------------

    def _response(self, job: Job) -> Any:
        """Upstream's ``_create_response`` for one output."""
        pb, gen = self.pb, job.gen
        outputs = [
            pb.Tensor(
                "text_output", np.asarray([gen.text.encode("utf-8")], dtype=self.output_dtype)
            )
        ]
        extras = (
            ("return_finish_reason", "finish_reason", gen.finish_reason),
            ("return_stop_reason", "stop_reason", gen.stop_reason),
            # the LLM API has a cumulative logprob only when logprobs are asked, which this
            # model's inputs cannot do
            ("return_cumulative_logprob", "cumulative_logprob", None),
        )
        for flag, name, value in extras:
            if job.output_config[flag]:
                outputs.append(pb.Tensor(name, np.asarray([str(value)], dtype=np.object_)))
        if job.perf:
            kv = job.kv
            looked_up = kv["reused"] + kv["missed"]
            hit_rate = kv["reused"] / looked_up if looked_up else 0.0
            # upstream builds every one of these with the text output's dtype
            for name, value in (
                ("kv_cache_reused_block", kv["reused"]),
                ("kv_cache_hit_rate", hit_rate),
                ("kv_cache_alloc_new_blocks", kv["new"]),
                ("kv_cache_alloc_total_blocks", kv["total"]),
                ("kv_cache_missed_block", kv["missed"]),
                ("arrival_time_ns", job.arrival_ns),
                ("first_scheduled_time_ns", job.arrival_ns),
                ("first_token_time_ns", job.first_token_ns),
                ("last_token_time_ns", job.last_token_ns),
                ("acceptance_rate", 0.0),
                ("total_accepted_draft_tokens", 0),
                ("total_draft_tokens", 0),
            ):
                outputs.append(pb.Tensor(name, np.asarray([value], dtype=self.output_dtype)))
        return pb.InferenceResponse(output_tensors=outputs)
