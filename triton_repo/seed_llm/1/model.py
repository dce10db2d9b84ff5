"""A hand-written chat model with its own tensors, on the stand-ins' byte-level engine.

Each batch item's ``prompt`` gets the engine's whole answer in ``generated_text`` (there is no
``max_tokens`` input: the model always finishes its answer). A prompt whose tokens and the
answer's do not fit ``context_length`` fails its own request with INVALID_ARG. Generated
tokens (the answer's bytes and the end token) count in ``model_generated_tokens_total``.
``[delay_ms=N]`` makes the batch take N ms per token of its longest answer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import standin_engine
        import vllm_contract

        self.engine = standin_engine
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self.context_length = int(parameters["context_length"]["string_value"])
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])

    def _answer(self, prompt: bytes) -> tuple[bytes, float]:
        """The answer to one prompt and the wait it asks for."""
        text = prompt.decode("utf-8")
        steered = self.engine.directives(text)
        answer = steered.answer.encode("utf-8")
        needed = len(prompt) + len(answer) + 1  # the end token too
        if needed > self.context_length:
            raise ValueError(
                f"prompt of {len(prompt)} tokens and answer of {len(answer) + 1} do not fit "
                f"the context of {self.context_length} tokens"
            )
        self.tokens.increment(len(answer) + 1)
        return answer, steered.delay_s * (len(answer) + 1)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        wait = 0.0
        for request in requests:
            prompts = pb_utils.get_input_tensor_by_name(request, "prompt").as_numpy()
            try:
                answers = []
                for item in prompts.reshape(-1):
                    answer, delay = self._answer(item)
                    answers.append(answer)
                    wait = max(wait, delay)
            except (ValueError, UnicodeDecodeError) as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            output = np.array(answers, dtype=np.object_).reshape(len(answers), 1)
            tensor = pb_utils.Tensor("generated_text", output)
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        time.sleep(wait)
        return responses
