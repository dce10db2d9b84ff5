"""Stand-in for a vision model served by Triton's vLLM backend, release 25.11.

The rules live in ``standin_vllm.py`` and ``standin_vision.py`` at the repository root (see
``../README.md``)."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import os
import sys
from functools import partial

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import standin_vllm  # noqa: E402
from standin_engine import triton_model  # noqa: E402

TritonPythonModel = triton_model(partial(standin_vllm.VllmStandin, release="25.11"))
