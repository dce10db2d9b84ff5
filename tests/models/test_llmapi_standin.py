"""The LLM API stand-in's engine (``triton_repo/standin_llmapi.py``), in process: the text
the LLM API returns (the prompt echoed, cumulative, cut at a stop string), its finish
reasons, and the KV-cache block reuse behind ``kv_cache_hit_rate``. Served by the real
Triton, the same rules are exercised by the gateway's integration tests."""

from __future__ import annotations

import itertools
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton_repo"))
# mock_words imports Triton's stub module at the top; the engine needs none of it.
sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("pb_utils_absent"))
from standin_llmapi import (  # noqa: E402
    BLOCK_WORDS,
    DEFAULT_MAX_TOKENS,
    Generation,
    PrefixCache,
    answer_words,
)


def run(gen: Generation) -> list[str]:
    """Every output's text, as a stream would send them."""
    texts = []
    while not gen.finished:
        gen.step()
        texts.append(gen.text)
    return texts


def test_the_prompt_is_echoed_and_the_text_is_cumulative() -> None:
    words, _ = answer_words("Hello there")
    texts = run(Generation("Hello there", words, DEFAULT_MAX_TOKENS))
    assert texts[0] == "Hello thereThe"
    assert texts[-1] == "Hello thereThe quick brown fox jumps over the lazy dog."
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))


def test_without_the_echo_the_text_is_the_answer_alone() -> None:
    gen = Generation("Hi", answer_words("Hi")[0], DEFAULT_MAX_TOKENS, echo=False)
    run(gen)
    assert gen.text == "The quick brown fox jumps over the lazy dog."
    assert (gen.finish_reason, gen.stop_reason) == ("stop", None)


def test_max_tokens_caps_the_words_and_the_default_is_the_llm_apis() -> None:
    gen = Generation("Hi", answer_words("Hi")[0], 3, echo=False)
    run(gen)
    assert (gen.text, gen.finish_reason) == ("The quick brown", "length")
    long = Generation("[mock:words=100]", answer_words("[mock:words=100]")[0], DEFAULT_MAX_TOKENS)
    assert len(run(long)) == DEFAULT_MAX_TOKENS == 32
    assert long.finish_reason == "length"


def test_a_stop_string_ends_the_text_before_it_and_a_stream_may_have_shown_its_start() -> None:
    gen = Generation("Hi", answer_words("Hi")[0], 32, ["lazy dog"], echo=False)
    texts = run(gen)
    assert texts[-2] == "The quick brown fox jumps over the lazy"
    assert (gen.text, gen.finish_reason, gen.stop_reason) == (
        "The quick brown fox jumps over the ",
        "stop",
        "lazy dog",
    )
    first = Generation("Hi", answer_words("Hi")[0], 32, ["over", "fox"], echo=False)
    run(first)
    assert (first.text, first.stop_reason) == ("The quick brown ", "fox")


def test_an_aborted_generation_ends_cancelled_with_its_text_so_far() -> None:
    gen = Generation("Hi", answer_words("Hi")[0], 32, echo=False)
    gen.step()
    gen.abort()
    assert (gen.finished, gen.finish_reason, gen.text) == (True, "cancelled", "The")


def test_directives_are_mock_chats() -> None:
    assert answer_words("x [mock:say=Hello%20world] y") == (["Hello", "world"], None)
    assert answer_words("[mock:fail_after=2]")[1] == 2
    assert len(answer_words("[mock:words=12]")[0]) == 12


def test_a_prompt_prefix_seen_before_reuses_its_blocks() -> None:
    cache = PrefixCache()
    prompt = [f"w{i}" for i in range(3 * BLOCK_WORDS + 1)]
    first = cache.admit(prompt, 9)
    assert (first["reused"], first["missed"]) == (0, 4)
    again = cache.admit(prompt[: 2 * BLOCK_WORDS] + ["other"] * BLOCK_WORDS, 9)
    assert (again["reused"], again["missed"]) == (2, 1)
    assert again["total"] == first["new"] + again["new"]
    short = cache.admit(["a", "b"], 9)
    assert (short["reused"], short["missed"]) == (0, 1)
