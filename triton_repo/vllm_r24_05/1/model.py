"""Stand-in for a model served by Triton's vLLM backend, release 24.05.

The rules live in ``standin_vllm.py`` at the repository root (see ``../README.md``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import triton_python_backend_utils as pb_utils

RELEASE = "24.05"


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import standin_vllm

        self.model = standin_vllm.VllmStandin(pb_utils, args, RELEASE)

    def execute(self, requests: list[Any]) -> None:
        return self.model.execute(requests)

    def finalize(self) -> None:
        self.model.finalize()
