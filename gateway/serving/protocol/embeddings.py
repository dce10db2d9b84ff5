"""``/v1/embeddings``: the request (with NVIDIA NIM's ``input_type``) and the list of
vectors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gateway.serving.protocol.common import Hint, Priority, Strict

#: The most inputs one request may carry (OpenAI's limit).
MAX_INPUTS = 2048


class EmbeddingRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: Hint | None = None
    input_type: str | None = None
    """NVIDIA NIM's extension: ``query`` or ``passage`` for models that tell them apart."""
    priority: Priority | None = None
    """vLLM's scheduling priority (lower first; see ``docs/scheduling.md``)."""


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
