"""smollm2's token sampler (``triton_repo/llama_sampling.py``) on the real SmolLM2 weights,
in process: what it draws must follow the model's logits at every step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton_repo"))
from llama_sampling import TokenSampler  # noqa: E402

PROMPT = b"<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


def decode(llm: Any, steps: int, **sampling: Any) -> list[int]:
    llm.reset()
    sampler = TokenSampler(
        llama_cpp,
        llama_cpp.llama_model_get_vocab(llm.model),
        llm.n_vocab(),
        seed=1,
        **sampling,
    )
    llm.eval(llm.tokenize(PROMPT, add_bos=True, special=True))
    tokens: list[int] = []
    try:
        for _ in range(steps):
            tokens.append(sampler.sample(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)))
            llm.eval([tokens[-1]])
    finally:
        sampler.close()
    return tokens


@pytest.fixture(scope="module")
def greedy(llm: Any) -> list[int]:
    """The greedy decoding of the prompt, 24 tokens."""
    return decode(llm, 24, temperature=0.0, top_k=0, top_p=1.0)


def test_top_k_1_draws_the_greedy_tokens_at_every_step(llm: Any, greedy: list[int]) -> None:
    # top-k 1 leaves one candidate: a seeded draw at any temperature must pick the best
    # token, step after step, exactly as greedy decoding does.
    assert decode(llm, 24, temperature=0.9, top_k=1, top_p=1.0) == greedy


def test_a_tiny_top_p_draws_the_greedy_tokens_at_every_step(llm: Any, greedy: list[int]) -> None:
    assert decode(llm, 24, temperature=0.9, top_k=0, top_p=1e-6) == greedy
