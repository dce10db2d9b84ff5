"""Stand-in for TensorRT-LLM's LLM API model (``all_models/llmapi/tensorrt_llm``); its
decoupling comes from ``model.yaml`` beside this file. The rules live in
``standin_llmapi.py`` at the repository root (see ``../README.md``)."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from standin_llmapi import LlmApiStandin  # noqa: E402


class TritonPythonModel(LlmApiStandin):
    model_dir = os.path.dirname(os.path.abspath(__file__))
