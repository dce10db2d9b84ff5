"""Triton's vLLM backend as a weightless stand-in, at four releases (24.05, 24.12, 25.05, 25.11).

Each ``vllm_r*`` model's ``model.py`` builds :class:`VllmStandin` with its release. The rules
follow ``triton-inference-server/vllm_backend`` ``src/model.py`` (and, at r25.11,
``src/utils/request.py``) on each release branch, and the vLLM engine of the container of that
release (0.4.0.post1, 0.5.5: the "V0" engine; 0.8.4, 0.11.0: "V1"); generation itself is the
byte-level engine of :mod:`standin_engine`:

- ``stream`` defaults to false; a non-streamed answer starts with the prompt unless
  ``exclude_input_in_output`` is true; ``exclude_input_in_output=false`` with ``stream=true``
  is an error.
- Streaming: one response per token carrying the new text (whole characters only; the last
  ``len(longest stop string) - 1`` characters are held back until the end, as vLLM does),
  the last one flagged FINAL (no separate empty final). Not streaming: one FINAL response.
- ``sampling_parameters`` is vLLM's ``SamplingParams`` as JSON (``max_tokens`` defaults to
  16). Up to 24.12 an unknown key fails as ``SamplingParams(**d)`` does; from 25.05 any bad
  key or value ends as ``'NoneType' object has no attribute 'lora_name'`` (the backend logs
  the real cause and goes on with ``None``). Structured outputs: ``guided_decoding`` at
  25.05, ``structured_outputs`` at 25.11, a JSON *string* of vLLM's params.
- Extra outputs (24.12+) only when their ``return_*`` switch is true; ``num_input_tokens``
  is 0-d; ``num_output_tokens`` counts the tokens since the previous response (all of them
  when not streaming, the EOS token included); ``finish_reason`` is ``"None"`` until the end.
- Every error is one FINAL response ``TritonError("Error generating stream: <msg>")``
  (INTERNAL) with ``text_output ["N/A"]``; errors the real backend raises inside ``execute``
  (unparsable ``sampling_parameters``) are raised from ``execute`` here too.
- Context :data:`MAX_MODEL_LEN`: V0 (24.x) answers a longer prompt with empty text and
  finish ``length``; V1 (25.x) refuses it. Generation stops at the context.
- 25.11: a request with ``embedding_request`` is an ``embed`` request; a model whose config
  says ``openai_task: embeddings`` serves only those, the others only ``generate``.
- LoRA (every release here, r24.05+): ``model.json`` in the version folder with
  ``"enable_lora": true`` (string or bool) and ``multi_lora.json`` beside it (adapter name
  -> path) enable it; a stand-in without ``model.json`` has it off (the real backend needs
  the file). ``lora_name`` in ``sampling_parameters`` (or, from 25.01, the request's
  parameters) is checked inside ``execute`` as the backend's ``verify_loras`` does: off ->
  ``LoRA feature is not enabled.``, unknown -> ``LoRA <name> is not supported, we currently
  support [...]``, one FINAL error response. A known adapter's answer starts with
  ``(<name>) `` so a test sees the adapter reached the model (no weights are read).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import standin_engine as engine
import standin_vision as vision
from json_example import example
from vllm_contract import TokenCounter

RELEASES = ("24.05", "24.12", "25.05", "25.11")

MAX_MODEL_LEN = 4096
"""The context of every vLLM stand-in (a stock vLLM model takes it from the model's
config; its Triton config has no parameter for it)."""

RETURN_SWITCHES = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)

# SamplingParams fields of the vLLM in each release's container.
_V0_4_FIELDS = frozenset(
    {
        "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty",
        "temperature", "top_p", "top_k", "min_p", "seed", "use_beam_search",
        "length_penalty", "early_stopping", "stop", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
        "prompt_logprobs", "skip_special_tokens", "spaces_between_special_tokens",
        "logits_processors",
    }
)  # fmt: skip
_V0_5_FIELDS = _V0_4_FIELDS | {"detokenize", "truncate_prompt_tokens"}
_V1_FIELDS = frozenset(
    {
        "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty",
        "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
        "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "detokenize",
        "skip_special_tokens", "spaces_between_special_tokens", "logits_processors",
        "include_stop_str_in_output", "truncate_prompt_tokens", "output_kind",
        "output_text_buffer_length", "logit_bias", "allowed_token_ids", "extra_args",
        "bad_words",
        "lora_name",  # TritonSamplingParams adds it
    }
)  # fmt: skip
FIELDS = {
    "24.05": _V0_4_FIELDS,
    "24.12": _V0_5_FIELDS,
    "25.05": _V1_FIELDS | {"guided_decoding"},
    "25.11": _V1_FIELDS | {"structured_outputs"},
}
CONSTRAINT_KEY = {"25.05": "guided_decoding", "25.11": "structured_outputs"}
"""The ``sampling_parameters`` key of structured outputs (none before 25.01)."""
CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_CONSTRAINT_FIELDS = {
    # GuidedDecodingParams (vLLM 0.8.4) and StructuredOutputsParams (vLLM 0.11.0).
    "25.05": frozenset(
        {*CONSTRAINT_KINDS, "backend", "whitespace_pattern", "structural_tag"}
    ),
    "25.11": frozenset(
        {
            *CONSTRAINT_KINDS, "disable_fallback", "disable_any_whitespace",
            "disable_additional_properties", "whitespace_pattern", "structural_tag",
            "_backend", "_backend_was_auto",
        }
    ),
}  # fmt: skip

# get_sampling_params_dict (24.05, 24.12) coerces these keys before SamplingParams(**d).
_V0_COERCE: dict[str, type] = {
    **dict.fromkeys(("ignore_eos", "skip_special_tokens", "use_beam_search"), bool),
    **dict.fromkeys(
        ("frequency_penalty", "length_penalty", "presence_penalty", "temperature", "top_p"),
        float,
    ),
    **dict.fromkeys(("best_of", "max_tokens", "min_tokens", "n", "top_k"), int),
}
# TritonSamplingParams.from_dict (25.05+) coerces by SamplingParams.__annotations__: int,
# float, bool, str and Optional[int] fields.
_V1_COERCE: dict[str, type] = {
    **dict.fromkeys(
        ("n", "best_of", "top_k", "seed", "max_tokens", "min_tokens", "logprobs",
         "prompt_logprobs", "output_text_buffer_length"),
        int,
    ),
    **dict.fromkeys(
        ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
         "top_p", "min_p"),
        float,
    ),
    **dict.fromkeys(
        ("ignore_eos", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
         "include_stop_str_in_output"),
        bool,
    ),
}  # fmt: skip

_UNSET = object()


@dataclass
class Sampling:
    """The SamplingParams fields that change what the byte engine does."""

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    constraint: dict[str, Any] | None = None
    lora_name: str | None = None


def _sampling(data: dict[str, Any], release: str) -> Sampling:
    """``SamplingParams(**data)`` of the release's vLLM: unknown keys and bad values fail
    with vLLM's messages."""
    unknown = [key for key in data if key not in FIELDS[release]]
    if unknown:
        qualname = "SamplingParams.__init__()" if release < "25.05" else "SamplingParams"
        raise TypeError(f"{qualname} got an unexpected keyword argument '{unknown[0]}'")
    get = data.get
    n = get("n", 1)
    best_of = get("best_of")
    max_tokens = get("max_tokens", 16)
    min_tokens = get("min_tokens", 0)
    temperature = get("temperature", 1.0)
    top_p = get("top_p", 1.0)
    top_k = get("top_k", -1 if release < "25.11" else 0)
    min_p = get("min_p", 0.0)
    logprobs = get("logprobs")
    stop = get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    checks: list[tuple[bool, str]] = [
        (n >= 1, f"n must be at least 1, got {n}."),
        (best_of is None or best_of >= n,
         f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}."),
        (-2.0 <= get("presence_penalty", 0.0) <= 2.0,
         f"presence_penalty must be in [-2, 2], got {get('presence_penalty')}."),
        (-2.0 <= get("frequency_penalty", 0.0) <= 2.0,
         f"frequency_penalty must be in [-2, 2], got {get('frequency_penalty')}."),
        (get("repetition_penalty", 1.0) > 0.0,
         f"repetition_penalty must be greater than zero, got {get('repetition_penalty')}."),
        (temperature >= 0.0, f"temperature must be non-negative, got {temperature}."),
        (0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
        (top_k >= 1 or top_k == -1 or (top_k == 0 and release >= "25.11"),
         f"top_k must be -1 (disable), or at least 1, got {top_k}."),
        (0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}."),
        (max_tokens is None or max_tokens >= 1,
         f"max_tokens must be at least 1, got {max_tokens}."),
        (min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {min_tokens}."),
        (max_tokens is None or min_tokens <= max_tokens,
         f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
         f"got {min_tokens}."),
        (logprobs is None or logprobs >= 0, f"logprobs must be non-negative, got {logprobs}."),
        (all(s for s in stop), "stop cannot contain an empty string."),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    constraint = get(CONSTRAINT_KEY.get(release, ""))
    return Sampling(
        n=int(n),
        max_tokens=None if max_tokens is None else int(max_tokens),
        min_tokens=int(min_tokens),
        stop=[str(s) for s in stop],
        stop_token_ids=[int(t) for t in get("stop_token_ids") or []],
        include_stop_str_in_output=bool(get("include_stop_str_in_output", False)),
        ignore_eos=bool(get("ignore_eos", False)),
        logprobs=None if logprobs is None else int(logprobs),
        constraint=constraint,
        lora_name=get("lora_name"),
    )


def _constraint(value: Any, release: str) -> dict[str, Any] | None:
    """``GuidedDecodingParams(**json.loads(value))`` / ``StructuredOutputsParams(...)``:
    the one kind of constraint that is set, or None."""
    params = json.loads(value)  # a nested object instead of a string fails here, as in vLLM
    unknown = [key for key in params if key not in _CONSTRAINT_FIELDS[release]]
    if unknown:
        raise TypeError(f"__init__() got an unexpected keyword argument '{unknown[0]}'")
    kinds = {k: params[k] for k in CONSTRAINT_KINDS if params.get(k) is not None}
    if len(kinds) > 1:
        raise ValueError(
            "You can only use one kind of guided decoding ('json', 'regex', 'choice', 'grammar')."
        )
    return kinds or None


def parse_sampling(parameters: str, release: str) -> Sampling:
    """Reads ``sampling_parameters`` as the release's backend does."""
    if release < "25.05":
        data = json.loads(parameters)
        for key, kind in _V0_COERCE.items():
            if key in data:
                data[key] = kind(data[key])
        lora_name = data.pop("lora_name", None)  # popped before SamplingParams(**d)
        sampling_v0 = _sampling(data, release)
        sampling_v0.lora_name = lora_name
        return sampling_v0
    try:  # TritonSamplingParams.from_dict: any failure is logged and becomes None
        data = json.loads(parameters)
        for key, value in data.items():
            if key == CONSTRAINT_KEY[release]:
                data[key] = _constraint(value, release)
            elif key in _V1_COERCE:
                data[key] = _V1_COERCE[key](value)
        sampling: Sampling | None = _sampling(data, release)
    except Exception:
        sampling = None
    if sampling is None:
        raise AttributeError("'NoneType' object has no attribute 'lora_name'")
    return sampling


@dataclass
class _Output:
    """One sequence's state, as a vLLM ``CompletionOutput``."""

    token_ids: list[int] = field(default_factory=list)
    data: bytes = b""
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[dict[int, dict[str, Any]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0


@dataclass
class _Sent:
    """What the previous streamed responses carried (the backend's ``prev_lens_*``)."""

    text: int = 0
    tokens: int = 0
    logprobs: int = 0


class VllmStandin:
    """The body of a ``vllm_r*`` model: ``TritonPythonModel`` delegates to it."""

    def __init__(self, pb_utils: Any, args: dict[str, Any], release: str) -> None:
        if release not in RELEASES:
            raise ValueError(f"unknown vLLM backend release {release}")
        self.pb = pb_utils
        self.release = release
        self.v1 = release >= "25.05"
        self.name = args["model_name"]
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise AssertionError(
                "vLLM Triton backend must be configured to use decoupled model transaction policy"
            )
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        # vLLM decides from the architecture whether a model embeds; Triton does not say,
        # so the embedding stand-in is told by the parameter an operator adds for gateways.
        embeds = parameters.get("openai_task") == "embeddings"
        if embeds and release < "25.11":
            raise ValueError("the vLLM backend serves embeddings from release 25.11")
        self.tasks = {"embed"} if embeds else {"generate"}
        # Likewise whether the model is multimodal: the operator's ``vision`` parameter.
        self.vision = parameters.get("vision", "").strip().lower() == "true"
        output = pb_utils.get_output_config_by_name(config, "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        self.tokens = TokenCounter(pb_utils, self.name)
        self.supported_loras: list[str] | None = self._setup_lora(args)
        """The adapters of ``multi_lora.json``; None when LoRA is not enabled."""
        self.scheduler = engine.Scheduler(self.name, self._failed)

    @staticmethod
    def _setup_lora(args: dict[str, Any]) -> list[str] | None:
        """The backend's ``setup_lora``: ``enable_lora`` in ``model.json`` (string or bool)
        turns it on, and ``multi_lora.json`` beside it must then exist."""
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        try:
            with open(os.path.join(model_dir, "model.json")) as file:
                engine_config = json.load(file)
        except FileNotFoundError:
            return None  # the stock stand-ins carry no engine config
        if str(engine_config.get("enable_lora", "")).lower() != "true":
            return None
        path = os.path.join(model_dir, "multi_lora.json")
        try:
            with open(path) as file:
                return list(json.load(file).keys())
        except FileNotFoundError:
            raise FileNotFoundError(f"Triton backend cannot find {path}.") from None

    # -- Triton entry points ------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            lora_error = self._verify_loras(request)  # may raise, as the backend's does
            sender = request.get_response_sender()
            if lora_error is not None:
                text = lora_error if self.release >= "25.11" else "[Error] Unsupported LoRA."
                sender.send(
                    self.pb.InferenceResponse(
                        output_tensors=[self._text_tensor([text])],
                        error=self.pb.TritonError(lora_error),
                    ),
                    flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            self.scheduler.submit(self._infer(request, sender), sender)
        return None

    def finalize(self) -> None:
        self.scheduler.close()

    # -- requests -----------------------------------------------------------------------------

    def _verify_loras(self, request: Any) -> str | None:
        """The backend's ``verify_loras`` (run inside ``execute``): parses the sampling
        parameters once to find ``lora_name``, and says why it is refused (or None)."""
        tensor = self.pb.get_input_tensor_by_name(request, "sampling_parameters")
        if tensor is not None:
            parameters = tensor.as_numpy()[0].decode("utf-8")
        elif self.v1:
            parameters = request.parameters()
        else:
            return None
        if self.v1:
            lora_name = json.loads(parameters).pop("lora_name", None)
        else:
            data = json.loads(parameters)
            for key, kind in _V0_COERCE.items():
                if key in data:
                    data[key] = kind(data[key])
            lora_name = data.pop("lora_name", None)
        if lora_name is None:
            return None
        if self.supported_loras is None:
            return "LoRA feature is not enabled."
        if lora_name not in self.supported_loras:
            return f"LoRA {lora_name} is not supported, we currently support {self.supported_loras}"
        return None

    def _infer(self, request: Any, sender: Any) -> Iterator[float]:
        """One request from start to end (the backend's ``generate``); yields the delay
        before its next step."""
        try:
            task = "generate"
            if self.release >= "25.11":
                has_embedding = self.pb.get_input_tensor_by_name(request, "embedding_request")
                task = "embed" if has_embedding is not None else "generate"
                if task not in self.tasks:
                    raise ValueError(f"Model {self.name} does not support '{task}' request")
            if task == "embed":
                yield 0.0
                self._embed(request, sender)
            else:
                yield from self._generate(request, sender)
        except Exception as exc:
            self._send_error(sender, f"Error generating stream: {exc}")

    def _flag(self, request: Any, name: str) -> bool:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return bool(tensor.as_numpy()[0]) if tensor is not None else False

    def _generate(self, request: Any, sender: Any) -> Iterator[float]:
        pb = self.pb
        text_input = pb.get_input_tensor_by_name(request, "text_input")
        if text_input is None:  # core counts inputs, it lets a request without it through
            raise AttributeError("'NoneType' object has no attribute 'as_numpy'")
        prompt = text_input.as_numpy()[0]
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8")
        stream = self._flag(request, "stream")
        exclude = pb.get_input_tensor_by_name(request, "exclude_input_in_output")
        # Absent: the prompt is prepended unless streaming.
        prepend_input = not bool(exclude.as_numpy()[0]) if exclude is not None else not stream
        if prepend_input and stream:
            raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
        tensor = pb.get_input_tensor_by_name(request, "sampling_parameters")
        if tensor is not None:
            parameters = tensor.as_numpy()[0].decode("utf-8")
        else:
            parameters = request.parameters()
        sampling = parse_sampling(parameters, self.release)
        wanted = (
            {name: self._flag(request, name) for name in RETURN_SWITCHES}
            if self.release >= "24.12"
            else dict.fromkeys(RETURN_SWITCHES, False)
        )

        prompt_ids = engine.tokenize(prompt)
        n_in = len(prompt_ids)
        if self.v1 and n_in == 0:
            raise ValueError("The decoder prompt cannot be empty")
        if self.v1 and n_in > MAX_MODEL_LEN:
            raise ValueError(
                f"The decoder prompt (length {n_in}) is longer than the maximum model length "
                f"of {MAX_MODEL_LEN}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens."
            )
        seen = self._images(request, prompt)
        steered = engine.directives(prompt)
        answer = self._answer(sampling, vision.describe(seen) if seen else steered.answer)
        output = _Output()
        # vLLM holds back as many characters as a stop string could still need.
        buffer = (
            max(len(s) for s in sampling.stop) - 1
            if sampling.stop and not sampling.include_stop_str_in_output
            else 0
        )
        sent = _Sent()
        cancelled = False
        if not self.v1 and n_in > MAX_MODEL_LEN:
            # V0's scheduler ignores the request: no token, finish "length", no error.
            output.finish_reason = "length"
            steps: Iterator[int] = iter(())
        else:
            steps = engine.model_tokens(answer)
        while output.finish_reason is None:
            yield steered.delay_s
            token = next(steps)
            if token == engine.EOS and len(output.token_ids) < sampling.min_tokens:
                token = next(steps)  # min_tokens masks EOS: the model says something else
            self._step(output, token, n_in, sampling)
            if self._cancelled(sender, stream, sent.tokens > 0):
                cancelled = True
                break
            if stream:
                finished = output.finish_reason is not None
                visible = output.text if finished or not buffer else output.text[:-buffer]
                sender.send(
                    self._response(request, [output], visible, sampling, wanted, n_in, sent, ""),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if finished else 0,
                )
        if not output.token_ids and output.finish_reason is not None and stream:
            # The ignored (too long) prompt at 24.x: one final response, empty text.
            sender.send(
                self._response(request, [output], "", sampling, wanted, n_in, sent, ""),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        if cancelled:
            if stream and self.release >= "24.12":
                sender.send(
                    pb.InferenceResponse(
                        error=pb.TritonError("Request was cancelled", pb.TritonError.CANCELLED)
                    ),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            else:
                # The backend aborts and sends nothing; this closes the request in Triton so
                # it is not left open (the client that cancelled never sees it).
                sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if not stream:
            sender.send(
                self._response(
                    request,
                    [output],
                    output.text,
                    sampling,
                    wanted,
                    n_in,
                    _Sent(),
                    prompt if prepend_input else "",
                ),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def _images(self, request: Any, prompt: str) -> list[vision.Seen]:
        """A vision model's ``image`` input, decoded as the backend does (a text model's
        is ignored, as before)."""
        tensor = self.pb.get_input_tensor_by_name(request, "image")
        if not self.vision or tensor is None:
            return []
        seen = vision.vllm_images(list(tensor.as_numpy().reshape(-1)))
        vision.check_placeholders(prompt, seen)
        return seen

    def _answer(self, sampling: Sampling, said: str) -> str:
        """The text the model means to write: a value that fits a structured-output
        constraint, else the ``[say=...]`` text or the engine's sentence."""
        constraint = sampling.constraint
        if sampling.lora_name is not None:
            said = f"({sampling.lora_name}) {said}"
        if not constraint:
            return said
        kind, value = next(iter(constraint.items()))
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            return json.dumps(example(schema))
        if kind == "json_object":
            return json.dumps({"answer": said})
        if kind == "choice" and isinstance(value, list) and value:
            return str(value[0])
        return said  # regex and grammar are accepted but not enforced by this stand-in

    def _step(self, output: _Output, token: int, n_in: int, sampling: Sampling) -> None:
        """Appends one token and applies the release's stop rules (V0's StopChecker or V1's
        check_stop plus detokenizer stop strings)."""
        output.token_ids.append(token)
        self.tokens.increment(1)
        index = len(output.token_ids) - 1
        logprob = -0.01 * (1 + index % 7)
        output.cumulative_logprob += logprob
        if sampling.logprobs is not None:
            output.logprobs.append(self._logprobs(token, logprob, sampling.logprobs))
        before = len(output.text)
        if token != engine.EOS:
            output.data += bytes([token])
            output.text = engine.decode_whole(output.data)
        new_chars = len(output.text) - before
        n_out = len(output.token_ids)
        is_eos = token == engine.EOS and not sampling.ignore_eos
        if self.v1:
            if n_in + n_out >= MAX_MODEL_LEN or (
                sampling.max_tokens is not None and n_out >= sampling.max_tokens
            ):
                output.finish_reason = "length"
            elif is_eos or token in sampling.stop_token_ids:
                output.finish_reason = "stop"
            if n_out > sampling.min_tokens and self._stop_string(output, new_chars, sampling):
                output.finish_reason = "stop"
            return
        if n_out < sampling.min_tokens:
            return
        stopped = is_eos or token in sampling.stop_token_ids
        if stopped or self._stop_string(output, new_chars, sampling):
            output.finish_reason = "stop"
        elif n_in + n_out > MAX_MODEL_LEN or n_out == sampling.max_tokens:
            output.finish_reason = "length"

    @staticmethod
    def _stop_string(output: _Output, new_chars: int, sampling: Sampling) -> bool:
        """vLLM's stop-string check: a stop string that ends in the new characters cuts the
        text before it (after it with ``include_stop_str_in_output``)."""
        if not new_chars:
            return False
        for stop in sampling.stop:
            index = output.text.find(stop, max(0, len(output.text) - new_chars - len(stop) + 1))
            if index == -1:
                continue
            if sampling.include_stop_str_in_output:
                index += len(stop)
            output.text = output.text[:index]
            return True
        return False

    @staticmethod
    def _logprobs(token: int, logprob: float, top: int) -> dict[int, dict[str, Any]]:
        """The sampled token (rank 1) and the ``top - 1`` next likeliest, vLLM's layout."""

        def shown(t: int) -> str:
            return engine.EOS_TEXT if t == engine.EOS else engine.detokenize([t])

        entries = {token: {"logprob": logprob, "rank": 1, "decoded_token": shown(token)}}
        for rank in range(2, top + 1):
            other = (token + rank - 1) % 256
            entries[other] = {
                "logprob": logprob - math.log(rank) - 1.0,
                "rank": rank,
                "decoded_token": shown(other),
            }
        return entries

    def _text_tensor(self, texts: list[str]) -> Any:
        encoded = [t.encode("utf-8") for t in texts]
        return self.pb.Tensor("text_output", np.asarray(encoded, dtype=self.output_dtype))

    def _response(
        self,
        request: Any,
        outputs: list[_Output],
        visible: str,
        sampling: Sampling,
        wanted: dict[str, bool],
        n_in: int,
        sent: _Sent,
        prefix: str,
    ) -> Any:
        """The backend's ``_create_response``: deltas since ``sent`` (which it updates); the
        ``n`` sequences of a request are identical here, so one output stands for all."""
        pb = self.pb
        out = outputs[0]
        n = sampling.n
        tensors = [self._text_tensor([prefix + visible[sent.text :]] * n)]
        sent.text = len(visible)
        if wanted["return_finish_reason"]:
            reason = str(out.finish_reason).encode("utf-8")
            tensors.append(pb.Tensor("finish_reason", np.asarray([reason] * n, dtype=np.object_)))
        if wanted["return_cumulative_logprob"]:
            tensors.append(
                pb.Tensor(
                    "cumulative_logprob",
                    np.asarray([out.cumulative_logprob] * n, dtype=np.float32),
                )
            )
        if wanted["return_logprobs"]:
            if sampling.logprobs is None:
                encoded = b"null"
            else:
                encoded = json.dumps(out.logprobs[sent.logprobs :]).encode("utf-8")
                sent.logprobs = len(out.logprobs)
            tensors.append(pb.Tensor("logprobs", np.asarray([encoded] * n, dtype=np.object_)))
        if wanted["return_num_input_tokens"]:
            tensors.append(pb.Tensor("num_input_tokens", np.asarray(n_in, dtype=np.uint32)))
        if wanted["return_num_output_tokens"]:
            count = len(out.token_ids) - sent.tokens
            tensors.append(pb.Tensor("num_output_tokens", np.asarray([count] * n, dtype=np.uint32)))
        sent.tokens = len(out.token_ids)
        return pb.InferenceResponse(output_tensors=tensors)

    def _cancelled(self, sender: Any, stream: bool, sent_before: bool) -> bool:
        """Where the backend notices a cancelled request: 24.05 asks before every output;
        24.12+ asks after each streamed send (so one more token is made), or before every
        output when not streaming."""
        if stream and self.release >= "24.12" and not sent_before:
            return False
        return bool(sender.is_cancelled())

    # -- embeddings (25.11) -------------------------------------------------------------------

    def _embed(self, request: Any, sender: Any) -> None:
        pb = self.pb
        tensor = pb.get_input_tensor_by_name(request, "embedding_request")
        body = json.loads(tensor.as_numpy()[0].decode("utf-8"))
        prompt = body["input"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            token_ids = [int(t) for t in prompt]
            text = engine.detokenize(token_ids)
        else:
            text = str(prompt)
            token_ids = engine.tokenize(text)
        pooling = body.get("pooling_params", {})
        if "dimensions" in pooling:
            raise ValueError(
                f'Model "{self.name}" does not support matryoshka representation, changing '
                "output dimensions will lead to poor results."
            )
        if not token_ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(token_ids) > MAX_MODEL_LEN:
            raise ValueError(
                f"The decoder prompt (length {len(token_ids)}) is longer than the maximum "
                f"model length of {MAX_MODEL_LEN}. Make sure that `max_model_len` is no "
                "smaller than the number of text tokens."
            )
        if sender.is_cancelled():
            sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        tensors = [self._text_tensor([json.dumps(engine.embed(text))])]
        if self._flag(request, "return_num_input_tokens"):
            tensors.append(
                pb.Tensor("num_input_tokens", np.asarray(len(token_ids), dtype=np.uint32))
            )
        if self._flag(request, "return_num_output_tokens"):
            tensors.append(pb.Tensor("num_output_tokens", np.asarray(0, dtype=np.uint32)))
        sender.send(
            pb.InferenceResponse(output_tensors=tensors),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    # -- errors -------------------------------------------------------------------------------

    def _send_error(self, sender: Any, message: str) -> None:
        self.pb.Logger.log_error(f"[vllm] {message}")
        sender.send(
            self.pb.InferenceResponse(
                output_tensors=[self._text_tensor(["N/A"])],
                error=self.pb.TritonError(message),
            ),
            flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def _failed(self, sender: object, exc: BaseException) -> None:
        self._send_error(sender, f"Error generating stream: {exc}")
