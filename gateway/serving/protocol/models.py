"""``/v1/models``: a model and what it can do."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
)


class ModelCapabilities(BaseModel):
    """What a model can do beyond plain text (an extension of the OpenAI model object)."""

    tool_calling: bool = False
    """Tools with ``tool_choice`` ``auto`` (a tool-call parser reads its text)."""
    forced_tool_calls: bool = False
    """``tool_choice`` ``required`` or a named function (constrained decoding)."""
    structured_outputs: list[str] = []
    """The ``response_format`` types it enforces: ``json_object``, ``json_schema``."""
    logprobs: bool = False
    max_logprobs: int = 0
    reasoning: str | None = None
    """Its reasoning parser (``deepseek_r1``, ``qwen3``): its reasoning comes apart from its
    answer, as ``reasoning_content``; None for a model that does not reason."""
    images: bool = False
    """It sees images (``image_url`` parts, Responses ``input_image``); other models
    refuse them."""
    max_images: int | None = None
    """The most images one request may carry to it (None: ``GATEWAY_MAX_IMAGES`` alone)."""


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "triton"
    task: str | None = None
    """The OpenAI capability this model serves (``chat``, ...): an extension field."""
    context_length: int | None = None
    capabilities: ModelCapabilities | None = None
    """Chat models: tool calling, structured outputs, log probabilities."""
    dimensions: int | None = None
    """Embedding models: the length of their vectors."""
    voices: list[str] | None = None
    """Speech models: their own voice names (OpenAI's names map onto the first)."""
    profile: str | None = None
    """How the gateway talks to it: ``vllm``, ``trtllm`` or ``custom`` (extension)."""
    backend_release: str | None = None
    """The release of its backend, as read from its config (vLLM, TensorRT-LLM)."""
    parameters: list[str] | None = None
    """The OpenAI request parameters it honours; others are refused with a 400, except
    those in ``ignored_parameters`` (accepted, not honoured)."""
    ignored_parameters: list[str] | None = None
    chat_template: bool | None = None
    """Chat models: whether it has a chat template (without one, only /v1/completions)."""
    root: str | None = None
    """The Triton model that serves it (vLLM's field, where vLLM shows the weights' path)."""
    parent: str | None = None
    """A LoRA adapter: the id of its base model (vLLM's field); null for a base model."""
    languages: list[str] | None = None
    """Transcription models: the language codes they take (empty: any)."""
    translates: bool | None = None
    """Transcription models: whether ``/v1/audio/translations`` takes them."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
