"""Whisper base (multilingual, 99 languages) on faster-whisper (CTranslate2), CPU int8.

The tensors of ``whisper_stt`` (../../README.md) plus an optional ``task`` input:
``transcribe`` (the default) or ``translate`` (into English, Whisper's own translation).
Without a ``language`` the model detects it from the first 30 seconds, and every segment
reports the language it was transcribed as. Temperature 0 (the default) falls back to
hotter decoding where a stretch's text loops or is unlikely, as OpenAI's does. The weights
come from two pip packages and are joined into a cache folder on the first load
(``assemble.py`` beside this file). Decoupled: one response per segment, then an empty final
response; ``is_cancelled()`` is checked between segments.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

TASKS = ("transcribe", "translate")
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders; this
        # model's own (assemble) sits beside this file, a folder the Python stub puts on
        # sys.path itself. No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import assemble
        import model_io
        from faster_whisper import WhisperModel

        self.io = model_io
        params = model_io.decoupled_parameters(pb_utils, args)
        self.languages = {x.strip() for x in params.get("languages", "").split(",") if x.strip()}
        threads = int(params.get("n_threads", "0")) or (os.cpu_count() or 1)
        self.model = WhisperModel(
            str(assemble.model_dir()), device="cpu", compute_type="int8", cpu_threads=threads
        )

    def execute(self, requests: list[Any]) -> None:
        self.io.serve_each(pb_utils, requests, self._transcribe, "whisper_base")
        return None

    def _transcribe(self, request: Any, sender: Any) -> None:
        audio = pb_utils.get_input_tensor_by_name(request, "audio").as_numpy().reshape(-1)
        if audio.size == 0:
            raise ValueError("audio is empty")
        language = self.io.read_string(pb_utils, request, "language") or None
        if language is not None and self.languages and language not in self.languages:
            raise ValueError(f"language '{language}' is not one this model transcribes")
        task = self.io.read_string(pb_utils, request, "task") or "transcribe"
        if task not in TASKS:
            raise ValueError(f"task must be 'transcribe' or 'translate', got '{task}'")
        temperature_tensor = pb_utils.get_input_tensor_by_name(request, "temperature")
        temperature = (
            float(temperature_tensor.as_numpy().reshape(-1)[0]) if temperature_tensor else 0.0
        )
        if not 0.0 <= temperature <= 1.0:
            raise ValueError(f"temperature must be between 0 and 1, got {temperature}")
        words_tensor = pb_utils.get_input_tensor_by_name(request, "word_timestamps")
        want_words = bool(words_tensor.as_numpy().reshape(-1)[0]) if words_tensor else False
        segments, info = self.model.transcribe(
            np.ascontiguousarray(audio, dtype=np.float32),
            language=language,  # None: detected
            task=task,
            initial_prompt=self.io.read_string(pb_utils, request, "prompt") or None,
            # 0 is OpenAI's "raise the temperature until the thresholds are met": a stretch
            # that decodes into a loop or below the log-probability threshold is decoded
            # again hotter (without it this model repeats itself on synthetic speech).
            temperature=FALLBACK if temperature == 0.0 else temperature,
            word_timestamps=want_words,
        )
        for segment in segments:
            if sender.is_cancelled():
                self.io.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                return
            words = [
                {"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)}
                for w in (segment.words or [])
            ]
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        _bytes("text", segment.text),
                        _float("start", segment.start),
                        _float("end", segment.end),
                        _bytes("words", json.dumps(words)),
                        _float("avg_logprob", segment.avg_logprob),
                        _float("no_speech_prob", segment.no_speech_prob),
                        _bytes("language", info.language),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _bytes(name: str, value: str) -> Any:
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _float(name: str, value: float) -> Any:
    return pb_utils.Tensor(name, np.array([value], dtype=np.float32))
