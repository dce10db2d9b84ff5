"""The request/response contract of Triton's vLLM backend, shared by the chat models here.

Both chat models in this repository (``smollm2`` and ``mock_chat``) speak exactly the tensors
of Triton's vLLM backend, so the gateway fronts them and a production vLLM Triton the same way.
This module parses those tensors and builds the responses; it never imports a model runtime.

Each ``model.py`` puts this repository's root on ``sys.path`` in ``initialize`` and imports
this module from there, so the repository stays self-contained (no package to install).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from model_io import decoupled_parameters, read_scalar, read_string, send_error, serve_each

__all__ = [
    "ChatRequest",
    "InvalidRequest",
    "SamplingParams",
    "StopText",
    "TokenCounter",
    "decoupled_parameters",
    "make_response",
    "read_request",
    "send_error",
    "serve_each",
]

#: Sampling fields a chat model accepts; anything else in ``sampling_parameters`` is an error,
#: so a typo never silently changes nothing.
KNOWN_SAMPLING_FIELDS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "include_stop_str_in_output",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        # vLLM's structured outputs, as Triton's vLLM backend takes them: a JSON string of
        # StructuredOutputsParams ("guided_decoding" up to Triton 25.11).
        "structured_outputs",
        "guided_decoding",
    }
)

#: The kinds of constraint in vLLM's StructuredOutputsParams.
CONSTRAINT_KINDS = ("json", "json_object", "regex", "choice", "grammar")


class InvalidRequest(ValueError):
    """Bad input from the client; the model answers it with ``TritonError(INVALID_ARG)``."""


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters (vLLM names; ``None`` means the model's default)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    """As vLLM: the text ends with the stop string rather than before it (and nothing is
    held back while it could still become one)."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    """How many alternatives to report per token (besides the sampled one); None: none."""
    constraint: dict[str, Any] | None = None
    """One kind of structured output: ``{"json": schema}``, ``{"json_object": True}``, ..."""

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> SamplingParams:
        if raw is None or raw in (b"", ""):
            return cls()
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"sampling_parameters is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidRequest("sampling_parameters must be a JSON object")
        unknown = sorted(set(data) - KNOWN_SAMPLING_FIELDS)
        if unknown:
            raise InvalidRequest(f"unsupported sampling parameter(s): {', '.join(unknown)}")
        # vLLM sends numbers as strings in some clients; accept both, reject anything else.
        out: dict[str, Any] = {}
        if data.get("max_tokens") is not None:
            out["max_tokens"] = _int(data, "max_tokens", low=1)
        if data.get("temperature") is not None:
            out["temperature"] = _float(data, "temperature", 0.0, 2.0)
        if data.get("top_p") is not None:
            out["top_p"] = _float(data, "top_p", 0.0, 1.0)
            if out["top_p"] == 0.0:
                raise InvalidRequest("top_p must be in (0, 1], got 0")
        if data.get("top_k") is not None:
            out["top_k"] = _int(data, "top_k", low=-1)
        if data.get("seed") is not None:
            out["seed"] = _int(data, "seed", low=-(2**63))
        if data.get("presence_penalty") is not None:
            out["presence_penalty"] = _float(data, "presence_penalty", -2.0, 2.0)
        if data.get("frequency_penalty") is not None:
            out["frequency_penalty"] = _float(data, "frequency_penalty", -2.0, 2.0)
        if data.get("logprobs") is not None:
            out["logprobs"] = _int(data, "logprobs", low=0)
        raw = data.get("structured_outputs", data.get("guided_decoding"))
        if raw is not None:
            out["constraint"] = _constraint(raw)
        stop = data.get("stop")
        if stop is not None:
            if isinstance(stop, str):
                stop = [stop]
            if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
                raise InvalidRequest("stop must be a non-empty string or a list of them")
            out["stop"] = stop
        keep = data.get("include_stop_str_in_output")
        if keep is not None:
            if not isinstance(keep, bool):
                raise InvalidRequest("include_stop_str_in_output must be a boolean")
            out["include_stop_str_in_output"] = keep
        return cls(**out)


def _constraint(raw: Any) -> dict[str, Any]:
    """The structured output asked for: exactly one kind that is set."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequest(f"structured_outputs is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidRequest("structured_outputs must be a JSON object")
    kinds = {k: v for k, v in raw.items() if k in CONSTRAINT_KINDS and v not in (None, False)}
    if len(kinds) != 1:
        raise InvalidRequest(
            f"structured_outputs must set exactly one of {', '.join(CONSTRAINT_KINDS)}"
        )
    kind, value = next(iter(kinds.items()))
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequest(f"structured_outputs.json is not valid JSON: {exc}") from exc
    return {kind: value}


def _int(data: dict[str, Any], name: str, low: int) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidRequest(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be an integer, got {value!r}") from exc
    if number < low:
        raise InvalidRequest(f"{name} must be >= {low}, got {number}")
    return number


def _float(data: dict[str, Any], name: str, low: float, high: float) -> float:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidRequest(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be a number, got {value!r}") from exc
    if math.isnan(number) or not low <= number <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value!r}")
    return number


@dataclass(frozen=True)
class ChatRequest:
    """One decoded request: the rendered prompt, its options and which extra outputs to send."""

    prompt: str
    stream: bool
    params: SamplingParams
    exclude_input: bool
    want_finish_reason: bool
    want_input_tokens: bool
    want_output_tokens: bool
    want_logprobs: bool = False


def read_request(pb_utils: Any, request: Any) -> ChatRequest:
    """Decodes a vLLM-contract request; raises :class:`InvalidRequest` on bad input."""

    def flag(name: str, default: bool = False) -> bool:
        value = read_scalar(pb_utils, request, name)
        return default if value is None else bool(value)

    try:
        prompt = read_string(pb_utils, request, "text_input")
        sampling = read_scalar(pb_utils, request, "sampling_parameters")
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    if not prompt:
        raise InvalidRequest("input 'text_input' is required and must not be empty")
    return ChatRequest(
        prompt=prompt,
        stream=flag("stream"),  # false when absent, as the vLLM backend reads it
        params=SamplingParams.from_json(sampling),
        exclude_input=flag("exclude_input_in_output", False),
        want_finish_reason=flag("return_finish_reason"),
        want_input_tokens=flag("return_num_input_tokens"),
        want_output_tokens=flag("return_num_output_tokens"),
        want_logprobs=flag("return_logprobs"),
    )


def make_response(
    pb_utils: Any,
    request: ChatRequest,
    text: str,
    finish_reason: str | None,
    num_input_tokens: int,
    num_output_tokens: int,
    logprobs: list[dict[str, dict[str, Any]]] | None = None,
) -> Any:
    """Builds one response. ``num_output_tokens`` counts the tokens since the previous response
    (vLLM's meaning); ``finish_reason`` is ``None`` until the last response. ``logprobs`` has
    one entry per token since the previous response, as vLLM's backend sends them: token id ->
    ``{"logprob", "rank", "decoded_token"}``, the sampled token first."""
    tensors = [
        pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
    ]
    if request.want_finish_reason:
        reason = (finish_reason or "None").encode("utf-8")
        tensors.append(pb_utils.Tensor("finish_reason", np.array([reason], dtype=np.object_)))
    if request.want_input_tokens:
        tensors.append(
            pb_utils.Tensor("num_input_tokens", np.array([num_input_tokens], dtype=np.uint32))
        )
    if request.want_output_tokens:
        tensors.append(
            pb_utils.Tensor("num_output_tokens", np.array([num_output_tokens], dtype=np.uint32))
        )
    if request.want_logprobs:
        encoded = json.dumps(logprobs if request.params.logprobs is not None else None)
        tensors.append(
            pb_utils.Tensor("logprobs", np.array([encoded.encode("utf-8")], dtype=np.object_))
        )
    return pb_utils.InferenceResponse(output_tensors=tensors)


class StopText:
    """Generated text as it grows: bytes decoded once they form whole characters, cut
    before the first stop string, and passed on except for a tail that could still become
    a stop string (as engines hold it back). ``keep`` (vLLM's ``include_stop_str_in_output``):
    cut after it instead, and hold nothing back."""

    def __init__(self, stops: list[str], keep: bool = False) -> None:
        self.stops = stops
        self.keep = keep
        self.raw = b""
        self.text = ""
        self.sent = 0

    def add(self, piece: bytes | str) -> bool:
        """Adds a token's bytes (or text); True when a stop string has appeared (the text
        is then cut before it)."""
        self.raw += piece.encode("utf-8") if isinstance(piece, str) else piece
        try:
            self.text = self.raw.decode("utf-8")
        except UnicodeDecodeError as exc:  # a character split across tokens: wait for it
            self.text = self.raw[: exc.start].decode("utf-8")
        found = [(self.text.find(s), s) for s in self.stops if s in self.text]
        if found:
            cut, stop = min(found, key=lambda f: f[0])
            self.text = self.text[: cut + len(stop) if self.keep else cut]
            return True
        return False

    def ready(self) -> str:
        """New text that can be sent now."""
        safe = len(self.text) - (0 if self.keep else stop_prefix_len(self.text, self.stops))
        piece = self.text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return piece

    def rest(self) -> str:
        """Everything not sent yet (at the end, the held-back tail too)."""
        piece = self.text[self.sent :]
        self.sent = len(self.text)
        return piece


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class TokenCounter:
    """A Triton custom metric counting generated tokens, exposed on Triton's /metrics as
    ``model_generated_tokens_total{model=...}``.

    Operators see generation throughput per model; tests use it to prove that a cancelled
    request stops generating. Triton requires the family to outlive its metric, so this
    object keeps both."""

    def __init__(self, pb_utils: Any, model_name: str) -> None:
        self.family = pb_utils.MetricFamily(
            name="model_generated_tokens_total",
            description="Tokens generated by the chat models of this repository",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metric = self.family.Metric(labels={"model": model_name})

    def increment(self, tokens: int = 1) -> None:
        self.metric.increment(tokens)
