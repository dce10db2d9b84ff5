"""TensorRT-LLM's Triton models as weightless stand-ins: the rules shared by ``preprocessing``,
``tensorrt_llm``, ``postprocessing`` and the two BLS models.

Read from ``triton-inference-server/tensorrtllm_backend`` (branch r25.05, and r24.08 for the
older BLS): ``all_models/inflight_batcher_llm/*/1/model.py`` for the Python models and
``inflight_batcher_llm/src/{utils.cc,model_instance_state.cc}`` for the C++ ``tensorrt_llm``
backend. Generation is the byte-level engine of :mod:`standin_engine` (token id = byte,
end id :data:`standin_engine.EOS`):

- ``tensorrt_llm`` generates ``request_output_len`` tokens at most; it stops at the end id
  (not part of the output) or right after a stop word (kept: stop words are token
  sequences the engine matches). Streaming responses carry only the new tokens; a
  non-streamed response repeats the prompt unless ``exclude_input_in_output`` (input, else
  the model's parameter). No finish reason, no token counts.
- A request with batch size > 1 becomes one generation per item (responses carry
  ``batch_index``), and ``num_return_sequences`` > 1 one per sequence (``sequence_index``);
  the stand-in runs them one after another. A request with ``stop`` true cancels the
  running request that has its Triton request id.
- LoRA (``lora_task_id``, ``lora_weights``, ``lora_config``): a request carrying a task id
  with weights and config puts the task in the model's LoRA cache; one with the id alone
  needs it there, else it fails ``LoRA task <id> not found in cache. Please send LoRA
  weights with request`` (the executor's ``PeftTaskNotCachedException``). No weights are
  applied: a task's answer starts with ``(task <id>) `` so a test sees it reached the model.
  The BLS stand-in, which generates itself, keeps a cache of its own.
- The BLS models decode with the same rules; with ``accumulate_tokens`` a decoupled BLS
  sends the whole text so far (decoded from all tokens, so a split character shows as
  U+FFFD until it is complete), and it always ends with an empty final response.
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import standin_engine as engine
import standin_vision as vision
from json_example import example
from vllm_contract import TokenCounter

MAX_INPUT_LEN = 4095
"""The engine's ``max_input_len`` (a build option of a real engine)."""
MAX_SEQ_LEN = 4096
"""The engine's ``max_seq_len``: prompt and generated tokens together."""
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")


class RequestValidationError(Exception):
    """The BLS's own validation error (``lib/decode.py``)."""


# -- tokenizer: bytes ---------------------------------------------------------------------------


def to_word_list_format(word_lists: np.ndarray | None, batch_size: int) -> np.ndarray:
    """Stop or bad words as the engine takes them, ``[batch, 2, L]``: the words' token ids
    one after another (row 0, padded with 0) and their end offsets (row 1, padded with -1);
    preprocessing's ``_to_word_list_format`` with the byte tokenizer."""
    if word_lists is None:
        return np.empty([batch_size, 2, 0], dtype="int32")
    flat_ids = []
    offsets = []
    for word_list in word_lists:
        item_ids: list[int] = []
        item_offsets: list[int] = []
        for word in word_list:
            text = word.decode() if isinstance(word, bytes) else str(word)
            ids = engine.tokenize(text)
            if not ids:
                continue
            item_ids += ids
            item_offsets.append(len(ids))
        flat_ids.append(np.array(item_ids))
        offsets.append(np.cumsum(np.array(item_offsets)))
    pad_to = max(1, max(len(ids) for ids in flat_ids))
    for i, (ids, offs) in enumerate(zip(flat_ids, offsets, strict=True)):
        flat_ids[i] = np.pad(ids, (0, pad_to - len(ids)), constant_values=0)
        offsets[i] = np.pad(offs, (0, pad_to - len(offs)), constant_values=-1)
    return np.array([flat_ids, offsets], dtype="int32").transpose((1, 0, 2))


def from_word_list_format(words: np.ndarray) -> list[list[int]]:
    """One item's ``[2, L]`` word list back to token sequences."""
    if words.size == 0:
        return []
    ids, offsets = words[0], words[1]
    out, start = [], 0
    for end in offsets:
        if end < 0:
            break
        out.append([int(t) for t in ids[start:end]])
        start = int(end)
    return out


# -- generation -----------------------------------------------------------------------------


@dataclass
class Generation:
    """One executor request: a batch item of a ``tensorrt_llm`` request."""

    prompt_ids: list[int]
    max_new_tokens: int
    end_id: int = engine.EOS
    stop_words: list[list[int]] = field(default_factory=list)
    min_tokens: int = 0
    streaming: bool = False
    exclude_input: bool = False
    guide: tuple[str, str] | None = None
    batch_index: int = 0
    sequence_index: int | None = None
    """Which of ``num_return_sequences`` it is (None: the only one)."""
    lora_task_id: int | None = None
    generated: list[int] = field(default_factory=list)
    seen: str = ""
    """A multimodal request: what it says of its images (the answer, see standin_vision)."""

    def validate(self) -> None:
        """The executor's checks when a request is enqueued."""
        if len(self.prompt_ids) > MAX_INPUT_LEN:
            # Wording recalled from the TensorRT-LLM executor, not checked against a source.
            raise ValueError(
                f"[TensorRT-LLM][ERROR] Assertion failed: Prompt length "
                f"({len(self.prompt_ids)}) exceeds maximum input length ({MAX_INPUT_LEN})."
            )
        if self.max_new_tokens < 1:  # wording not checked against a source either
            raise ValueError(
                "[TensorRT-LLM][ERROR] Assertion failed: maxNewTokens must be greater than 0"
            )
        if self.guide is not None and self.guide[0] not in GUIDE_TYPES:
            raise ValueError(
                f"[TensorRT-LLM][ERROR] guided_decoding_guide_type '{self.guide[0]}' is not "
                f"one of {', '.join(GUIDE_TYPES)}"
            )
        # Prompt + output beyond max_seq_len: the executor shortens the output (a warning).
        self.max_new_tokens = min(self.max_new_tokens, MAX_SEQ_LEN - len(self.prompt_ids))

    def answer(self, said: str) -> str:
        """What the model means to write: guided decoding's value, else the engine's."""
        if self.lora_task_id is not None:
            said = f"(task {self.lora_task_id}) {said}"
        if self.guide is None:
            return said
        kind, guide = self.guide
        if kind == "json_schema":
            return json.dumps(example(json.loads(guide)))
        if kind == "json":
            return json.dumps({"answer": said})
        return said  # regex, EBNF grammars and structural tags are not enforced here

    def tokens(self) -> Iterator[tuple[int | None, bool]]:
        """Yields ``(token, last)`` per step; ``(None, True)`` when the end id ends it (the
        end id is not output). The caller waits and checks cancellation between steps."""
        steered = engine.directives(engine.detokenize(self.prompt_ids))
        model = engine.model_tokens(self.answer(self.seen or steered.answer))
        while True:
            token = next(model)
            if token == self.end_id:
                if len(self.generated) < self.min_tokens:
                    continue  # min_tokens masks the end id
                yield None, True
                return
            self.generated.append(token)
            last = len(self.generated) >= self.max_new_tokens or any(
                self.generated[-len(word) :] == word for word in self.stop_words if word
            )
            yield token, last
            if last:
                return

    def output_ids(self, new: list[int]) -> list[int]:
        """A response's tokens: the new ones when streaming; else everything, the prompt
        first unless it is excluded."""
        if self.streaming:
            return new
        return self.generated if self.exclude_input else self.prompt_ids + self.generated


class LoraCache:
    """The task ids whose weights a model has (the executor's PEFT cache; never full here)."""

    def __init__(self) -> None:
        self.tasks: set[int] = set()
        self.lock = threading.Lock()

    def task(self, task_id: Any, weights: Any, config: Any) -> int | None:
        """The task of one batch item: cached when it brings its weights and config, else
        it must be cached already."""
        if task_id is None:
            return None
        task = int(task_id)
        with self.lock:
            if weights is not None and config is not None:
                self.tasks.add(task)
            elif task not in self.tasks:
                raise ValueError(
                    f"LoRA task {task} not found in cache. Please send LoRA weights with request"
                )
        return task


def delay_of(prompt_ids: list[int]) -> float:
    return engine.directives(engine.detokenize(prompt_ids)).delay_s


def _item(array: np.ndarray | None, index: int, default: Any = None) -> Any:
    """Item ``index`` of a ``[batch]`` or ``[batch, 1]`` input (reshaped or not)."""
    if array is None:
        return default
    flat = array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, 1)
    return flat[index][0] if flat.shape[1] else default


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# -- the tensorrt_llm model ---------------------------------------------------------------------


class _Stopped:
    """Set when a ``stop`` request names the Triton request id of running generations."""

    def __init__(self) -> None:
        self.value = False


class TensorrtLlmStandin:
    """``tensorrt_llm`` (the C++ TensorRT-LLM backend) on the byte engine."""

    def __init__(self, pb_utils: Any, args: dict[str, Any]) -> None:
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.exclude_input = parameters.get("exclude_input_in_output", "").lower() in ("true", "1")
        self.tokens = TokenCounter(pb_utils, args["model_name"])
        self.running: dict[str, _Stopped] = {}
        """Triton request id -> its generations' stop flag (``mTritonRequestIdToRequestIds``)."""
        self.lock = threading.Lock()
        self.lora = LoraCache()
        self.scheduler = engine.Scheduler(args["model_name"], self._failed)

    def finalize(self) -> None:
        self.scheduler.close()

    def execute(self, requests: list[Any]) -> list[Any] | None:
        responses: list[Any] = []
        for request in requests:
            if self._is_stop_request(request):
                self._stop(request, responses)
                continue
            try:
                generations = self._generations(request)
            except Exception as exc:
                self._reply(request, responses, self.pb.TritonError(str(exc)))
                continue
            if self.decoupled:
                sender = request.get_response_sender()
                stopped = _Stopped()
                request_id = request.request_id()
                if request_id:
                    with self.lock:
                        self.running[request_id] = stopped
                job = self._run(generations, sender, stopped, request_id)
                self.scheduler.submit(job, sender)
            else:  # one generation, no streaming (checked): answer now
                responses.append(self._complete(generations[0]))
        return None if self.decoupled else responses

    def _reply(self, request: Any, responses: list[Any], error: Any = None) -> None:
        """``sendEnqueueResponse``: one final response, empty or with an error."""
        response = self.pb.InferenceResponse(output_tensors=[], error=error)
        if self.decoupled:
            request.get_response_sender().send(
                response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        else:
            responses.append(response)

    def _is_stop_request(self, request: Any) -> bool:
        found = self.pb.get_input_tensor_by_name(request, "stop")
        return found is not None and bool(_item(found.as_numpy(), 0, False))

    def _stop(self, request: Any, responses: list[Any]) -> None:
        """``handleStopRequest``: a request with ``stop`` true cancels the running request
        that has its Triton request id (the BLS cancels this way; a client can too) and is
        answered with an empty response."""
        request_id = request.request_id()
        if not request_id:
            message = "Trying to stop a request but request ID is not provided"
            self._reply(request, responses, self.pb.TritonError(message))
            return
        with self.lock:
            stopped = self.running.get(request_id)
        if stopped is not None:  # none: it may have completed already, not an error
            stopped.value = True
        self._reply(request, responses)

    def _generations(self, request: Any) -> list[Generation]:
        """``createRequestsFromInputTensors``: one executor request per batch item (and per
        returned sequence, for ``num_return_sequences``)."""
        pb = self.pb

        def tensor(name: str) -> np.ndarray | None:
            found = pb.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()

        input_ids = tensor("input_ids")
        if input_ids is None:
            raise ValueError(
                "[TensorRT-LLM][ERROR] input_ids or encoder_input_features is not present in the "
                "request."
            )
        batch = input_ids.shape[0]
        if not self.decoupled and batch > 1:
            raise ValueError(
                "[TensorRT-LLM][ERROR] Batch size > 1 requires the tensorrt_llm backend to be "
                "using decoupled transaction policy"
            )
        lengths, output_len = tensor("input_lengths"), tensor("request_output_len")
        if output_len is None:
            raise ValueError("request_output_len is not present in the request")
        streaming, exclude = tensor("streaming"), tensor("exclude_input_in_output")
        end_id, min_tokens = tensor("end_id"), tensor("min_tokens")
        sequences = tensor("num_return_sequences")
        stop_words, guide_type, guide = (
            tensor("stop_words_list"),
            tensor("guided_decoding_guide_type"),
            tensor("guided_decoding_guide"),
        )
        task_ids, weights, lora_config = (
            tensor("lora_task_id"),
            tensor("lora_weights"),
            tensor("lora_config"),
        )
        table = tensor("prompt_embedding_table")  # a multimodal ensemble's encoded images
        generations = []
        for i in range(batch):
            task = self.lora.task(_item(task_ids, i), weights, lora_config)
            stream = bool(_item(streaming, i, False))
            if stream and not self.decoupled:
                raise ValueError(
                    "[TensorRT-LLM][ERROR] Streaming is only supported if model is deployed "
                    "using decoupled mode."
                )
            length = int(_item(lengths, i, input_ids.shape[1]))
            kind = _item(guide_type, i)
            count = int(_item(sequences, i, 1))
            for sequence in range(max(count, 1)):
                generation = Generation(
                    prompt_ids=[int(t) for t in input_ids[i][:length]],
                    max_new_tokens=int(_item(output_len, i)),
                    end_id=int(_item(end_id, i, engine.EOS)),
                    stop_words=(
                        from_word_list_format(stop_words[i]) if stop_words is not None else []
                    ),
                    min_tokens=int(_item(min_tokens, i, 0)),
                    streaming=stream,
                    exclude_input=bool(_item(exclude, i, self.exclude_input)),
                    guide=None if kind is None else (_text(kind), _text(_item(guide, i, b""))),
                    batch_index=i,
                    sequence_index=sequence if count > 1 else None,
                    lora_task_id=task,
                )
                if table is not None and table[i].size:
                    generation.seen = vision.describe(vision.decode(table[i]))
                generation.validate()
                generations.append(generation)
        return generations

    def _response(self, generation: Generation, ids: list[int], batch: int) -> Any:
        """``fillTritonResponse``: ``output_ids`` [1, beams, len] and ``sequence_length``
        always; ``batch_index`` when the request had several items, ``sequence_index`` when
        it asked for several sequences."""
        pb = self.pb
        tensors = [
            pb.Tensor("output_ids", np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))),
            pb.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32)),
        ]
        if batch > 1:
            tensors.append(
                pb.Tensor("batch_index", np.array([[generation.batch_index]], dtype=np.int32))
            )
        if generation.sequence_index is not None:
            tensors.append(
                pb.Tensor("sequence_index", np.array([[generation.sequence_index]], np.int32))
            )
        return pb.InferenceResponse(output_tensors=tensors)

    def _complete(self, generation: Generation) -> Any:
        """A whole generation at once (a model that is not decoupled)."""
        for token, _ in generation.tokens():
            if token is not None:
                self.tokens.increment(1)
        return self._response(generation, generation.output_ids([]), 1)

    def _run(
        self, generations: list[Generation], sender: Any, stopped: _Stopped, request_id: str
    ) -> Iterator[float]:
        """Generates the request's items one after another; each response goes out as it
        is made, the very last one flagged FINAL."""
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        batch = 1 + max(g.batch_index for g in generations)
        try:
            for number, generation in enumerate(generations):
                delay = delay_of(generation.prompt_ids)
                is_last_item = number == len(generations) - 1
                for token, last in generation.tokens():
                    yield delay
                    if sender.is_cancelled():  # the executor drops it: close the request
                        sender.send(flags=final)
                        return
                    if stopped.value:  # cancelled by a stop request: a final response
                        ids = [] if generation.streaming else generation.output_ids([])
                        sender.send(self._response(generation, ids, batch), flags=final)
                        return
                    if token is not None:
                        self.tokens.increment(1)
                    flags = final if last and is_last_item else 0
                    if generation.streaming:
                        new = [] if token is None else [token]
                        sender.send(self._response(generation, new, batch), flags=flags)
                    elif last:
                        ids = generation.output_ids([])
                        sender.send(self._response(generation, ids, batch), flags=flags)
        finally:
            with self.lock:
                if self.running.get(request_id) is stopped:
                    del self.running[request_id]

    def _failed(self, sender: Any, exc: BaseException) -> None:
        self.pb.Logger.log_error(f"tensorrt_llm stand-in failed: {exc}")
        sender.send(
            self.pb.InferenceResponse(
                error=self.pb.TritonError(
                    f"Executor failed process requestId 0 due to the following error: {exc}"
                )
            ),
            flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )


# -- the BLS models -------------------------------------------------------------------------


@dataclass
class _StopState:
    """The r25.05 BLS's ``StopWordsState``."""

    stopped: bool = False
    prefix: str = ""


class BlsStandin:
    """``tensorrt_llm_bls`` at r25.05 or r24.08.

    The real BLS calls ``preprocessing``, ``tensorrt_llm`` and ``postprocessing`` in turn;
    this stand-in generates with the same rules directly (:class:`Generation`), so it needs
    no other model and shows the BLS's own rules: ``accumulate_tokens``, the empty final
    response, the ``max_tokens`` validation and errors sent as Python tracebacks. Like the
    ``tensorrt_llm`` stand-in, it reads ``exclude_input_in_output`` as false by default.
    """

    def __init__(self, pb_utils: Any, args: dict[str, Any], release: str) -> None:
        self.pb = pb_utils
        self.release = release
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        raw = params.get("accumulate_tokens", {}).get("string_value", "")
        if release >= "r25.05" and raw.startswith("${"):
            raw = ""  # get_valid_param_value: an unfilled template value counts as unset
        self.accumulate = raw.lower() in ("true", "yes", "1", "t")
        # The BLS calls its multimodal encoder (and so reads images) only when it names one.
        encoder = params.get("multimodal_encoders_name", {}).get("string_value", "")
        self.multimodal = bool(encoder) and not encoder.startswith("${")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.tokens = TokenCounter(pb_utils, args["model_name"])
        self.lora = LoraCache()
        """The cache of the ``tensorrt_llm`` model the real BLS would call."""
        self.scheduler = engine.Scheduler(args["model_name"], self._failed)

    def finalize(self) -> None:
        self.scheduler.close()

    def execute(self, requests: list[Any]) -> list[Any] | None:
        responses = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                generations = self._convert(request)
            except Exception:
                self._send_traceback(sender, responses)
                continue
            if self.decoupled:
                self.scheduler.submit(self._run(generations, sender, request), sender)
            else:  # one response: the BLS makes one non-streamed call
                try:
                    if any(g.streaming for g in generations) or len(generations) > 1:
                        raise RuntimeError(
                            "Streaming is only supported if model is deployed using decoupled mode."
                        )
                    out = [item for item, _ in self._responses(generations, request, None)]
                    responses.append(out[-1])
                except Exception:
                    self._send_traceback(None, responses)
        return None if self.decoupled else responses

    def _convert(self, request: Any) -> list[Generation]:
        """``convert_triton_request`` + ``Request.validate`` + what preprocessing does."""
        pb = self.pb

        def tensor(name: str) -> np.ndarray | None:
            found = pb.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()

        text_input, max_tokens = tensor("text_input"), tensor("max_tokens")
        if text_input is None or text_input.size == 0:
            raise RequestValidationError("text_input is required")
        if max_tokens is None or max_tokens.size == 0 or max_tokens.flatten()[0] <= 0:
            raise RequestValidationError("max_tokens must be a single value > 0")
        min_name = "min_tokens" if self.release >= "r25.05" else "min_length"
        stream, exclude = tensor("stream"), tensor("exclude_input_in_output")
        end_id, min_tokens, stop_words = tensor("end_id"), tensor(min_name), tensor("stop_words")
        guide_type, guide = tensor("guided_decoding_guide_type"), tensor("guided_decoding_guide")
        urls = tensor("image_url_input") if self.multimodal else None
        stop_ids = to_word_list_format(stop_words, text_input.shape[0])
        task_ids, weights, lora_config = (
            tensor("lora_task_id"),
            tensor("lora_weights"),
            tensor("lora_config"),
        )
        generations = []
        for i in range(text_input.shape[0]):
            kind = _item(guide_type, i)
            try:
                task = self.lora.task(_item(task_ids, i), weights, lora_config)
            except ValueError as exc:  # tensorrt_llm's error, re-raised by the BLS
                raise RuntimeError(str(exc)) from None
            generation = Generation(
                prompt_ids=engine.tokenize(_text(text_input[i][0])),
                max_new_tokens=int(_item(max_tokens, i)),
                end_id=int(_item(end_id, i, engine.EOS)),
                stop_words=from_word_list_format(stop_ids[i]),
                min_tokens=int(_item(min_tokens, i, 0)),
                streaming=bool(_item(stream, i, False)),
                exclude_input=bool(_item(exclude, i, False)),
                guide=None if kind is None else (_text(kind), _text(_item(guide, i, b""))),
                batch_index=i,
                lora_task_id=task,
            )
            if urls is not None:  # [batch, 1]: one image URL per item
                seen = vision.url_images(list(urls[i].reshape(-1)))
                vision.check_placeholders(_text(text_input[i][0]), seen)
                generation.seen = vision.describe(seen)
            try:
                generation.validate()
            except ValueError as exc:  # tensorrt_llm's error, re-raised by the BLS
                raise RuntimeError(str(exc)) from None
            generations.append(generation)
        return generations

    def _responses(
        self, generations: list[Generation], request: Any, cancel: Any
    ) -> Iterator[tuple[Any, float]]:
        """The BLS's responses with the wait before each; ``cancel`` (a sender) is asked
        between tokens."""
        pb = self.pb
        batch = len(generations)
        stop_state: dict[int, _StopState] = {}
        for generation in generations:
            delay = delay_of(generation.prompt_ids) if cancel is not None else 0.0
            sent: list[int] = []
            for token, last in generation.tokens():
                if cancel is not None and cancel.is_cancelled():
                    return
                if token is not None:
                    self.tokens.increment(1)
                if generation.streaming:
                    new = [] if token is None else [token]
                elif not last:
                    continue
                else:
                    new = generation.output_ids([])
                sent += new
                if generation.streaming and self.accumulate and self.decoupled:
                    text = engine.detokenize(sent)  # decoded again from all tokens so far
                else:
                    text = engine.detokenize(new)
                text = self._check_stop_words(generation, request, text, stop_state)
                tensors = [pb.Tensor("text_output", np.array([text.encode("utf-8")], np.object_))]
                if batch > 1:
                    tensors.append(
                        pb.Tensor("batch_index", np.array([[generation.batch_index]], np.int32))
                    )
                yield pb.InferenceResponse(output_tensors=tensors), delay

    def _check_stop_words(
        self, generation: Generation, request: Any, text: str, state: dict[int, _StopState]
    ) -> str:
        """The r25.05 BLS's ``check_stop_words`` (r24.08 has none): a non-streamed text is
        cut after the first stop word past the prompt (kept); when streaming, the responses
        after a stop word has come out are blanked."""
        if self.release < "r25.05":
            return text
        found = self.pb.get_input_tensor_by_name(request, "stop_words")
        if found is None:
            return text
        words = [_text(w) for w in found.as_numpy()[generation.batch_index]]
        item = state.setdefault(generation.batch_index, _StopState())
        if generation.streaming:
            if item.stopped:
                return ""
            for word in words:
                if not word:
                    continue
                if word.startswith(item.prefix + text):
                    item.prefix += text
                    if word == item.prefix:
                        item.stopped = True
                        break
                else:
                    item.prefix = ""
            return text
        start = 0 if generation.exclude_input else len(engine.detokenize(generation.prompt_ids))
        for word in words:
            index = text.find(word, start) if word else -1
            if index != -1:
                return text[: index + len(word)]
        return text

    def _run(self, generations: list[Generation], sender: Any, request: Any) -> Iterator[float]:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            for response, delay in self._responses(generations, request, cancel=sender):
                yield delay
                sender.send(response)
        except Exception:
            self._send_traceback(sender, [])
            return
        sender.send(flags=final)  # the decoupled BLS always ends with an empty final

    def _send_traceback(self, sender: Any, responses: list[Any]) -> None:
        """The BLS sends ``TritonError(traceback.format_exc())``, then (decoupled) an empty
        final response."""
        message = traceback.format_exc()
        self.pb.Logger.log_error(message)
        error = self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message))
        if sender is None:
            responses.append(error)
            return
        sender.send(error)
        sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _failed(self, sender: Any, exc: BaseException) -> None:
        sender.send(self.pb.InferenceResponse(error=self.pb.TritonError(repr(exc))))
        sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
