"""Embeddings (``/v1/embeddings``): texts in, one vector per text out, from a Triton model
with ``openai_task: embeddings``.

The inputs are sent in requests of at most the model's ``max_batch_size`` items, all at once:
Triton's dynamic batcher runs them (and other clients' requests) together. ``dimensions``
shortens the vectors only for a model whose config says it was trained for it
(``matryoshka: true``): the first ``k`` values, renormalized; any other model gets a 400
unless ``dimensions`` is its own size. ``encoding_format: base64`` sends the float32 bytes,
as OpenAI does (the Python SDK asks for it by default and decodes it).

e5-style models embed a search query and a document differently (``query: `` and
``passage: `` prefixes). OpenAI's API has no field for it, so the gateway takes NVIDIA NIM's
extension, ``input_type`` (``query`` or ``passage``), and otherwise uses the model's
default (its config's ``default_input_type``).
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import numpy.typing as npt

from gateway.backend import Backend, Embeddings, ModelInfo
from gateway.backend.tokenizer import estimate_tokens
from gateway.errors import InvalidRequestError
from gateway.serving.catalog import ModelCatalog
from gateway.serving.protocol.embeddings import (
    MAX_INPUTS,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
)
from gateway.state.budgets import prompt_bound
from gateway.state.limits import Meter


def _texts(request: EmbeddingRequest) -> list[str]:
    value = request.input
    if isinstance(value, str):
        value = [value]
    if not value:
        raise InvalidRequestError("input must not be empty.", param="input")
    if not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(
            "This model takes text, not token arrays: send strings.", param="input"
        )
    texts = [str(v) for v in value]
    if len(texts) > MAX_INPUTS:
        raise InvalidRequestError(
            f"input has {len(texts)} items; at most {MAX_INPUTS} per request.", param="input"
        )
    for index, text in enumerate(texts):
        if not text.strip():
            raise InvalidRequestError(
                f"input[{index}] is empty; every input must have text.", param="input"
            )
    return texts


def _input_type(request: EmbeddingRequest, model: ModelInfo) -> str | None:
    if not model.input_types:
        if request.input_type is not None:
            raise InvalidRequestError(
                f"The model '{model.name}' takes no input_type.", param="input_type"
            )
        return None
    if request.input_type is None:
        return model.input_types[0]
    if request.input_type not in model.input_types:
        raise InvalidRequestError(
            f"input_type must be one of {', '.join(model.input_types)}.",
            param="input_type",
            code="invalid_value",
        )
    return request.input_type


def _dimensions(request: EmbeddingRequest, model: ModelInfo) -> int | None:
    """How many values to keep (None: all)."""
    wanted = request.dimensions
    if wanted is None or wanted == model.dimensions:
        return None
    if not model.matryoshka or model.dimensions is None:
        raise InvalidRequestError(
            f"The model '{model.name}' makes {model.dimensions}-dimensional vectors and "
            "cannot shorten them (it was not trained for it); omit dimensions.",
            param="dimensions",
            code="unsupported_parameter",
        )
    if wanted > model.dimensions:
        raise InvalidRequestError(
            f"dimensions must be at most {model.dimensions} for '{model.name}'.",
            param="dimensions",
            code="invalid_value",
        )
    return wanted


class EmbeddingService:
    def __init__(self, backend: Backend, catalog: ModelCatalog, in_flight: int = 16) -> None:
        self.backend = backend
        self.catalog = catalog
        self.in_flight = in_flight
        """Batches of one request sent to Triton at once (``GATEWAY_MAX_INFLIGHT_PER_REQUEST``)."""

    async def embed(self, request: EmbeddingRequest, meter: Meter | None = None) -> EmbeddingList:
        texts = _texts(request)
        model = await self.catalog.get(request.model, "embeddings")
        input_type = _input_type(request, model)
        keep = _dimensions(request, model)
        if meter is not None:  # the inputs' tokens, estimated, under the key's tpm
            await meter.reserve(
                sum(estimate_tokens(t) for t in texts),
                0,
                1,
                False,
                sum(prompt_bound(t) for t in texts),
            )
        size = model.max_batch_size or 1
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        gate = asyncio.Semaphore(self.in_flight)

        async def embedded(batch: list[str]) -> Embeddings:
            async with gate:
                return await self.backend.embed(model.name, batch, input_type)

        try:
            parts = await asyncio.gather(*(embedded(batch) for batch in batches))
        except InvalidRequestError as exc:
            exc.param = exc.param or "input"
            raise
        vectors = np.concatenate([p.vectors for p in parts])
        tokens = sum(sum(p.tokens) for p in parts)
        if keep is not None:
            vectors = vectors[:, :keep]
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
        if meter is not None:
            meter.add_tokens(tokens, 0)
        return EmbeddingList(
            data=_encode(vectors, request.encoding_format),
            model=request.model,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        )


def _encode(vectors: npt.NDArray[np.float32], encoding: str) -> list[Embedding]:
    rows = vectors.astype("<f4", copy=False)
    if encoding == "base64":
        return [
            Embedding(index=i, embedding=base64.b64encode(row.tobytes()).decode("ascii"))
            for i, row in enumerate(rows)
        ]
    return [Embedding(index=i, embedding=row.tolist()) for i, row in enumerate(rows)]
