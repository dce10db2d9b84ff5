"""Reads custom_tts's tones back to text (``../standin_tones.py``): tones are found by their
energy, each one's FFT peak is the nearest letter's frequency. Audio without tones gives an
empty transcript.
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
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import standin_tones

        self.tones = standin_tones
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.sample_rate = int(parameters["sample_rate"]["string_value"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            audio = pb_utils.get_input_tensor_by_name(request, "audio_samples").as_numpy()
            text = self.tones.transcribe(audio.reshape(-1), self.sample_rate)
            tensor = pb_utils.Tensor("transcript", np.array([text.encode("utf-8")], np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
