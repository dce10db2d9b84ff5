"""Stand-in for TensorRT-LLM's ``tensorrt_llm_bls`` model (r25.05) in front of a multimodal model.

Unlike the real BLS it does not call ``preprocessing``/``multimodal_encoders``/
``tensorrt_llm``/``postprocessing``: it decodes the image itself and generates with the same
byte-level rules directly. The rules live in ``standin_trtllm.py`` and ``standin_vision.py``
at the repository root (see ``../README.md``)."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import os
import sys
from functools import partial

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import standin_trtllm  # noqa: E402
from standin_engine import triton_model  # noqa: E402

TritonPythonModel = triton_model(partial(standin_trtllm.BlsStandin, release="r25.05"))
