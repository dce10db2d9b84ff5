"""Stand-in for TensorRT-LLM's ``postprocessing`` model (tensorrtllm_backend r25.05).

Decodes each sequence's tokens (``TOKENS_BATCH[:SEQUENCE_LENGTH]``) on their own, as the real
one's ``tokenizer.batch_decode(..., skip_special_tokens=True)`` does, with the stand-ins' byte
tokenizer: a character split between two responses comes out as U+FFFD. ``OUTPUT`` is 1-D, one
string per sequence of the request (batch x beams), as upstream builds it.
"""

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
        import standin_engine

        self.engine = standin_engine

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            texts = [
                self.engine.detokenize(beam[: lengths[b][k]].tolist()).encode("utf-8")
                for b, beams in enumerate(tokens)
                for k, beam in enumerate(beams)
            ]
            output = pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
