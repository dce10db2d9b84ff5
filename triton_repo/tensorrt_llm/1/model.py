"""Stand-in for TensorRT-LLM's ``tensorrt_llm`` model (the C++ ``tensorrtllm`` backend, r25.05).

It takes token ids and returns token ids with that backend's rules; the rules live in
``standin_trtllm.py`` at the repository root (see ``../README.md``)."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import standin_trtllm  # noqa: E402
from standin_engine import triton_model  # noqa: E402

TritonPythonModel = triton_model(standin_trtllm.TensorrtLlmStandin)
