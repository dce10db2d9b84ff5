"""Model profiles: how the gateway talks to each kind of Triton model, read from its config.

Teams run models that were not written for this gateway: the vLLM backend of whatever
release they deployed, TensorRT-LLM ensembles and BLS models, hand-written Python models
with their own tensor names. A profile reads a model's config and says what the model
serves and takes (a :class:`~gateway.backend.base.ModelInfo`), builds each request from
the inputs the model declares, and reads its responses back into the gateway's terms. The
Triton adapter calls it and never names one.

- ``vllm`` (:mod:`.vllm`): ``backend: "vllm"``, or the vLLM backend's inputs; the release
  is read from which inputs the config declares.
- ``trtllm`` (:mod:`.trtllm`): an ensemble with a ``tensorrt_llm`` step, or a model with a
  ``tensorrt_llm_model_name`` parameter (the BLS).
- ``llmapi`` (:mod:`.llmapi`): TensorRT-LLM's LLM API (PyTorch) model, by its
  ``text_input`` and ``sampling_param_*`` inputs.
- ``custom`` (:mod:`.custom`): ``openai_input_*`` / ``openai_output_*`` parameters name the
  tensors; also every model that declares an ``openai_task`` and fits neither of the
  above (the speech, transcription and embedding models of this repository speak its
  default tensor names).

A model with its own tensor names needs no new profile: try the custom mapping first
(``openai_input_*`` / ``openai_output_*`` parameters in its ``config.pbtxt`` name them, see
``docs/fronting-triton.md``). Adding a profile is adding one module that defines a
:class:`~gateway.backend.profiles.base.Contract` subclass (its ``profile`` name and its
``matches`` rule), and adding the class to :data:`PROFILES` below, at the place its rule
must be tried: :func:`contract_for` takes the first profile that matches, in that order.
Tests: ``tests/unit/test_profiles.py``, ``tests/unit/test_registries.py`` (which fails for a
profile left out of the table) and ``tests/integration/test_fronting_e2e.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.custom import CustomContract, DeclaredTask
from gateway.backend.profiles.llmapi import LlmApiContract
from gateway.backend.profiles.model_config import ModelConfig, TensorSpec
from gateway.backend.profiles.trtllm import TrtllmContract
from gateway.backend.profiles.vllm import VllmContract
from gateway.backend.tokenizer import Tokenizer

__all__ = ["PROFILES", "Contract", "ModelConfig", "TensorSpec", "contract_for"]

#: The profiles in the order they are tried; the first whose rule matches a model's config
#: is its profile. The order is deliberate, as several rules can match one config:
#:
#: 1. ``custom`` first: ``openai_input_*`` / ``openai_output_*`` parameters are the
#:    operator saying which tensors to use, and they win over what the tensors look like (a
#:    model with vLLM's input names, mapped, is served by its mapping).
#: 2. ``llmapi``, ``trtllm``, ``vllm``: each recognises its backend's own inputs or steps;
#:    their rules do not overlap on the backends' configs, so among them the order is the
#:    one they were added in.
#: 3. ``DeclaredTask`` last, the fallback: any model that declares an ``openai_task``. It
#:    must follow the backends, since a vLLM-contract model may declare its task too
#:    (``mock_chat``, ``smollm2``, ``vllm_r25_11_embed`` in ``triton_repo/``) and is still
#:    served as vLLM.
PROFILES: Final[tuple[type[Contract], ...]] = (
    CustomContract,
    LlmApiContract,
    TrtllmContract,
    VllmContract,
    DeclaredTask,
)


def contract_for(
    config: ModelConfig,
    configs: Mapping[str, ModelConfig] | None = None,
    tokenizer: Tokenizer | None = None,
) -> Contract | None:
    """The contract of the first profile of :data:`PROFILES` that matches ``config``; None
    for a model that serves no OpenAI task (an ensemble's step, say)."""
    for profile in PROFILES:
        if profile.matches(config, configs or {}):
            return profile(config, tokenizer)
    return None
