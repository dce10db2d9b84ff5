"""Whisper on faster-whisper (CTranslate2, CPU int8): ``whisper_stt`` (tiny.en) and
``whisper_base`` (multilingual), each folder's ``model.py`` giving its weights and rules.

Input is 16 kHz mono float32 PCM (the gateway decodes uploads with PyAV), with optional
``language``, ``prompt``, ``temperature``, ``word_timestamps`` and, for a model that
declares it, ``task`` (``transcribe`` or ``translate``: into English, Whisper's own
translation). A model without a default language detects it from the first 30 seconds;
every segment reports the language it was transcribed as. Decoupled: one response per
segment as faster-whisper produces them, then an empty final response; ``is_cancelled()``
is checked between segments.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

TASKS = ("transcribe", "translate")
SAMPLE_RATE = 16_000
#: Whisper's window: the encoder reads 30 s of audio, the speech padded with silence.
WINDOW_S = 30.0
FRAMES_PER_S = 100
#: Speech shorter than this keeps the whole window (a lone short word was lost in a 10 s
#: one), and longer speech keeps this much of the window free.
MIN_WINDOWED_S = 1.5
WINDOW_MARGIN_S = 2.0
#: Temperature 0 as OpenAI means it: a stretch that decodes into a loop or below the
#: log-probability threshold is decoded again hotter.
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class Whisper:
    """One Whisper model. ``default_language``: what an untold request is transcribed as
    (None: detected); ``fallback``: temperature 0 falls back to hotter decoding."""

    def __init__(
        self,
        args: dict[str, Any],
        weights: str,
        default_language: str | None,
        fallback: bool,
    ) -> None:
        import model_io
        from faster_whisper import WhisperModel

        self.io = model_io
        self.name = args["model_name"]
        params = model_io.decoupled_parameters(pb_utils, args)
        listed = params.get("languages", default_language or "")
        self.languages = [x.strip() for x in listed.split(",") if x.strip()]
        self.default_language = default_language
        self.fallback = fallback
        threads = int(params.get("n_threads", "0")) or (os.cpu_count() or 1)
        self.window_s = float(params.get("encoder_window_s", str(WINDOW_S)))
        if not 0 < self.window_s <= WINDOW_S:
            raise ValueError(f"encoder_window_s must be in (0, {WINDOW_S}]")

        class Windowed(WhisperModel):  # type: ignore[misc]
            """Encodes ``frames`` mel frames instead of Whisper's 3,000 (30 s) when set."""

            frames: int | None = None

            def encode(self, features: Any) -> Any:
                if self.frames is not None and features.shape[-1] > self.frames:
                    features = features[..., : self.frames]
                return super().encode(features)

        self.model = Windowed(weights, device="cpu", compute_type="int8", cpu_threads=threads)

    def execute(self, requests: list[Any]) -> None:
        self.io.serve_each(pb_utils, requests, self._transcribe, self.name)

    def _transcribe(self, request: Any, sender: Any) -> None:
        audio = pb_utils.get_input_tensor_by_name(request, "audio").as_numpy().reshape(-1)
        if audio.size == 0:
            raise ValueError("audio is empty")
        language = self.io.read_string(pb_utils, request, "language") or None
        if language is not None and self.languages and language not in self.languages:
            listed = f": {', '.join(self.languages)}" if len(self.languages) <= 10 else ""
            raise ValueError(f"language '{language}' is not one this model transcribes{listed}")
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
        # Short speech in a shorter window: the encoder's cost follows the window, not the
        # speech (see encoder_window_s in README.md).
        seconds = audio.size / SAMPLE_RATE
        windowed = MIN_WINDOWED_S <= seconds <= self.window_s - WINDOW_MARGIN_S
        self.model.frames = int(self.window_s * FRAMES_PER_S) if windowed else None
        segments, info = self.model.transcribe(
            np.ascontiguousarray(audio, dtype=np.float32),
            language=language or self.default_language,  # None: detected
            task=task,
            initial_prompt=self.io.read_string(pb_utils, request, "prompt") or None,
            temperature=FALLBACK if self.fallback and temperature == 0.0 else temperature,
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
                        # The rest of Whisper's segment, as OpenAI's verbose_json has it.
                        _int("seek", [segment.seek]),
                        _int("tokens", segment.tokens),
                        _float(
                            "decode_temperature",
                            temperature if segment.temperature is None else segment.temperature,
                        ),
                        _float("compression_ratio", segment.compression_ratio),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _bytes(name: str, value: str) -> Any:
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _float(name: str, value: float) -> Any:
    return pb_utils.Tensor(name, np.array([value], dtype=np.float32))


def _int(name: str, values: list[int]) -> Any:
    return pb_utils.Tensor(name, np.array(values, dtype=np.int32))
