"""A tone "voice": each letter of ``input_text`` becomes a 100 ms tone (``../standin_tones.py``).

Lowercase ``a``-``z`` and spaces are spoken, other characters are dropped; a text with nothing
to speak is INVALID_ARG.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

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
            raw = pb_utils.get_input_tensor_by_name(request, "input_text").as_numpy().reshape(-1)
            text = raw[0].decode("utf-8", errors="replace") if raw.size else ""
            if not self.tones.speakable(text):
                error = pb_utils.TritonError(
                    "input_text has nothing to speak (only letters a-z and spaces are spoken)",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            waveform = self.tones.synthesize(text, self.sample_rate)
            tensor = pb_utils.Tensor("waveform", waveform)
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
