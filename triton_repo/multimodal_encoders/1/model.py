"""Stand-in for TensorRT-LLM's ``multimodal_encoders`` model (tensorrtllm_backend r25.05,
``all_models/multimodal``): where the real one runs the vision encoder over
``pixel_values`` and returns the prompt embedding table the engine reads in place of the
image's placeholder tokens, this one returns one row per image holding its size
(``../standin_vision.py``), so that the ``tensorrt_llm`` stand-in can say what it was given.
A request without ``pixel_values`` (no image) gets an empty response, as the real one sends
no table then."""

from __future__ import annotations

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
        import standin_vision

        self.vision = standin_vision

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            found = pb_utils.get_input_tensor_by_name(request, "pixel_values")
            if found is None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[]))
                continue
            pixels = found.as_numpy()  # [batch, images, 3, height, width]
            table = np.stack([self.vision.encode(item) for item in pixels])
            rows = np.full((pixels.shape[0], 1), table.shape[1], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT_PROMPT_EMBEDDING_TABLE", table),
                        pb_utils.Tensor("OUT_PROMPT_VOCAB_SIZE", rows),
                    ]
                )
            )
        return responses
