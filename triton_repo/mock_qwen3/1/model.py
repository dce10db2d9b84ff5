"""A weightless reasoning chat model with the vLLM-backend tensors (see its config).

Its behaviour lives in ``mock_words.py`` at the repository root (see ``../README.md``)."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mock_words import MockChat as TritonPythonModel  # noqa: E402, F401
