"""Token sampling for one llama.cpp sequence, with structured outputs checked after the draw.

A llama.cpp grammar sampler costs a pass over the whole vocabulary (49,152 tokens for
SmolLM2) on every step, which took constrained decoding to about 0.57x the speed of free
decoding. llama.cpp's own ``common_sampler`` avoids it: draw a token from the unconstrained
distribution, ask the grammar about that one token, and only when it is refused draw again
with the grammar applied to every token. Greedy decoding gives exactly the same tokens
either way (the best allowed token is the best token whenever the best token is allowed);
a seeded draw is llama.cpp's usual approximation.

The sampler chain mirrors the one ``Llama.generate`` builds: penalties, top-k, top-p, then
temperature and a seeded draw, or greedy at temperature 0.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

_CANDIDATE = np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)], align=True)


class TokenSampler:
    def __init__(
        self,
        lib: Any,
        vocab: Any,
        n_vocab: int,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        grammar: Any = None,
    ) -> None:
        self.lib = lib
        self.n_vocab = n_vocab
        self.chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        parts = []
        if presence_penalty or frequency_penalty:
            parts.append(
                lib.llama_sampler_init_penalties(
                    n_vocab, 64, 1.0, frequency_penalty, presence_penalty
                )
            )
        if temperature <= 0:
            parts.append(lib.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                parts.append(lib.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                parts.append(lib.llama_sampler_init_top_p(top_p, 1))
            parts.append(lib.llama_sampler_init_temp(temperature))
            parts.append(lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        for part in parts:
            lib.llama_sampler_chain_add(self.chain, part)  # the chain owns its parts
        self.grammar = (
            lib.llama_sampler_init_grammar(
                vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
            )
            if grammar is not None
            else None
        )
        self.ids = np.arange(n_vocab, dtype=np.intc)
        self.candidates = np.zeros(n_vocab, dtype=_CANDIDATE)
        self.one = (lib.llama_token_data * 1)()
        self.refused = 0  # draws the grammar refused (benchmarks and tests read it)

    def _draw(self, logits: Any, with_grammar: bool) -> int:
        lib = self.lib
        # Every field again: top-k and top-p sort the array in place, so after a draw the
        # ids are no longer in vocabulary order.
        self.candidates["id"] = self.ids
        self.candidates["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        self.candidates["p"] = 0.0
        array = lib.llama_token_data_array(
            data=self.candidates.ctypes.data_as(lib.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        if with_grammar:
            lib.llama_sampler_apply(self.grammar, ctypes.byref(array))
        lib.llama_sampler_apply(self.chain, ctypes.byref(array))
        return int(array.data[array.selected].id)

    def _allowed(self, token: int) -> bool:
        lib = self.lib
        self.one[0].id, self.one[0].logit, self.one[0].p = token, 0.0, 0.0
        array = lib.llama_token_data_array(data=self.one, size=1, selected=-1, sorted=False)
        lib.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return not math.isinf(self.one[0].logit)

    def sample(self, logits: Any) -> int:
        """The next token, from a pointer to this sequence's logits."""
        token = self._draw(logits, with_grammar=False)
        if self.grammar is not None:
            if not self._allowed(token):
                self.refused += 1
                token = self._draw(logits, with_grammar=True)
            self.lib.llama_sampler_accept(self.grammar, token)
        self.lib.llama_sampler_accept(self.chain, token)
        return token

    def close(self) -> None:
        self.lib.llama_sampler_free(self.chain)
        if self.grammar is not None:
            self.lib.llama_sampler_free(self.grammar)
        self.chain = self.grammar = None
