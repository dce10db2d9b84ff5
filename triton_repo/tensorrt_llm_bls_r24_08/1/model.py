"""Stand-in for TensorRT-LLM's ``tensorrt_llm_bls`` model, r24.08 branch of tensorrtllm_backend.

Unlike the real BLS it does not call ``preprocessing``/``tensorrt_llm``/``postprocessing``:
it generates with the same byte-level rules directly. The rules live in ``standin_trtllm.py``
at the repository root (see ``../README.md``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import triton_python_backend_utils as pb_utils

RELEASE = "r24.08"


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import standin_trtllm

        self.model = standin_trtllm.BlsStandin(pb_utils, args, RELEASE)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        return self.model.execute(requests)

    def finalize(self) -> None:
        self.model.finalize()
