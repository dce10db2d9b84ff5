"""Whisper base (multilingual, 99 languages) on faster-whisper (CTranslate2), CPU int8.

The tensors of ``whisper_stt`` plus an optional ``task`` input (``transcribe``, or
``translate`` into English); without a ``language`` the model detects it. Temperature 0
(the default) falls back to hotter decoding where a stretch's text loops or is unlikely,
as OpenAI's does (without it this model repeats itself on synthetic speech). The weights
come from two pip packages and are joined into a cache folder on the first load
(``assemble.py`` beside this file). The behaviour lives in ``whisper_engine.py`` at the
repository root (see ``../../README.md``)."""

from __future__ import annotations

import os
import sys
from typing import Any


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders; this
        # model's own (assemble) sits beside this file, a folder the Python stub puts on
        # sys.path itself. No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import assemble
        import whisper_engine

        weights = str(assemble.model_dir())
        self.whisper = whisper_engine.Whisper(args, weights, default_language=None, fallback=True)

    def execute(self, requests: list[Any]) -> None:
        self.whisper.execute(requests)
