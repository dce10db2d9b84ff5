"""TensorRT-LLM's LLM API Triton model behind the gateway, end to end: the stand-ins
``trtllm_llmapi`` (decoupled, as a ``model.yaml`` with ``decoupled: True`` makes it) and
``trtllm_llmapi_sync`` (upstream's shipped ``decoupled: False``) loaded through the admin API
into the real Triton, as a user adds a model, and called with the official SDK.

Their configs are upstream's (triton_repo/README.md): no parameter tells the gateway what
they are. They report no token counts: the gateway counts them with the tokenizer mounted
for them (bytes, conftest), so every count can be checked exactly, and says so
(``usage.estimated``)."""

from __future__ import annotations

import re
import threading
import time
import urllib.parse

import anthropic
import httpx
import openai
import pytest

from tests.support.generation import generation_stops
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

MODELS = ["trtllm_llmapi", "trtllm_llmapi_sync"]
ANSWER = "The quick brown fox jumps over the lazy dog."


def ask(text: str = "Hi", say: str | None = None, delay_ms: int | None = None) -> list[dict]:
    """A user message; ``say``: what the stand-in answers; ``delay_ms``: per word."""
    if say is not None:
        text += f" [mock:say={urllib.parse.quote(say)}]"
    if delay_ms is not None:
        text += f" [mock:delay_ms={delay_ms}]"
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def sdk(stack: GatewayProcess) -> openai.OpenAI:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        for name in MODELS:
            answer = http.post(f"/admin/models/{name}/load")
            assert answer.status_code == 200, answer.text
    return stack.client()


def test_the_model_is_known_by_its_inputs_alone(sdk: openai.OpenAI) -> None:
    models = {m.id: m.model_extra or {} for m in sdk.models.list()}
    for name in MODELS:
        assert models[name]["profile"] == "llmapi" and models[name]["task"] == "chat"
        assert models[name]["capabilities"]["logprobs"] is False
        assert models[name]["capabilities"]["structured_outputs"] == []
        assert {"max_tokens", "stop", "seed", "temperature"} <= set(models[name]["parameters"])


@pytest.mark.parametrize("model", MODELS)
def test_chat_answers_without_the_prompt_and_counts_usage_itself(
    sdk: openai.OpenAI, model: str
) -> None:
    reply = sdk.chat.completions.create(model=model, messages=ask())
    choice = reply.choices[0]
    assert choice.message.content == ANSWER  # the prompt the model echoes by default is not
    assert choice.finish_reason == "stop"
    usage = reply.usage
    assert usage is not None and (usage.model_extra or {})["estimated"] is True
    # The mounted tokenizer's tokens are bytes: the counts are exact.
    assert usage.completion_tokens == len(ANSWER.encode())
    assert usage.prompt_tokens > len("Hi")


@pytest.mark.parametrize("model", MODELS)
def test_max_tokens_and_stop(sdk: openai.OpenAI, stack: GatewayProcess, model: str) -> None:
    cut = sdk.chat.completions.create(model=model, messages=ask(), max_tokens=3)
    assert cut.choices[0].message.content == "The quick brown"
    assert cut.choices[0].finish_reason == "length"
    stopped = sdk.chat.completions.create(model=model, messages=ask(), stop=["fox"])
    assert stopped.choices[0].message.content == "The quick brown "
    assert stopped.choices[0].finish_reason == "stop"
    claude = anthropic.Anthropic(base_url=stack.base_url, api_key=stack.admin_key, max_retries=0)
    message = claude.messages.create(
        model=model, max_tokens=64, messages=ask(), stop_sequences=["lazy", "fox"]
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "fox")


def test_a_decoupled_deployment_streams_word_by_word_and_the_other_in_one_chunk(
    sdk: openai.OpenAI,
) -> None:
    counts = {}
    for model in MODELS:
        stream = sdk.chat.completions.create(
            model=model, messages=ask(), stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        pieces = [
            c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
        ]
        assert "".join(pieces) == ANSWER
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        counts[model] = len(pieces)
    assert counts["trtllm_llmapi"] == len(ANSWER.split())  # a delta a word
    assert counts["trtllm_llmapi_sync"] == 1


@pytest.mark.parametrize("model", MODELS)
def test_legacy_completions(sdk: openai.OpenAI, model: str) -> None:
    done = sdk.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    assert done.choices[0].text == "The quick brown fox"
    assert done.choices[0].finish_reason == "length"


def test_what_it_cannot_do_is_refused_by_name(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="trtllm_llmapi", messages=ask(), logprobs=True)
    assert refused.value.body["param"] == "logprobs"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="trtllm_llmapi", messages=ask(), response_format={"type": "json_object"}
        )
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]


def test_a_client_that_leaves_a_stream_stops_the_decoupled_engine(
    sdk: openai.OpenAI, stack: GatewayProcess
) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    stream = sdk.chat.completions.create(
        model="trtllm_llmapi", messages=ask(say=words, delay_ms=30), stream=True, max_tokens=200
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
        if seen >= 3:
            break
    stream.close()
    stopped_at = generation_stops(stack, "trtllm_llmapi")
    assert stopped_at < 100  # far from the 200 words it was asked for


def test_a_request_left_on_the_other_deployment_stops_the_engine(
    stack: GatewayProcess,
) -> None:
    """A non-decoupled model is one plain call: leaving it cancels the call and sends the
    ``stop`` flag with the request's id (``tests/unit/test_llmapi_profile.py`` checks the
    flag and the id); the engine stops."""
    words = " ".join(f"w{i}" for i in range(200))
    body = {
        "model": "trtllm_llmapi_sync",
        "messages": ask(say=words, delay_ms=30),
        "max_tokens": 200,
    }
    started = threading.Event()

    def leave() -> None:
        with httpx.Client(base_url=stack.base_url, headers=stack.headers) as http:
            started.set()
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/chat/completions", json=body, timeout=1.0)

    leaving = threading.Thread(target=leave)
    leaving.start()
    started.wait()
    leaving.join(10)
    time.sleep(0.2)
    stopped_at = generation_stops(stack, "trtllm_llmapi_sync")
    assert stopped_at < 150  # 200 words at 30 ms would take 6 s more


def test_the_engines_kv_cache_hit_rate_and_times_reach_the_metrics(
    sdk: openai.OpenAI, stack: GatewayProcess
) -> None:
    prompt = ask("the same long shared prefix of many words for the cache " * 3)
    for _ in range(2):
        sdk.chat.completions.create(model="trtllm_llmapi", messages=prompt, max_tokens=2)
    metrics = httpx.get(stack.internal_url + "/metrics", timeout=5).text
    count = re.search(
        r'^gateway_engine_kv_cache_hit_ratio_count\{model="trtllm_llmapi"\} (\S+)$', metrics, re.M
    )
    assert count and float(count.group(1)) >= 2
    ttft = re.search(
        r'^gateway_engine_time_to_first_token_seconds_count\{model="trtllm_llmapi"\} (\S+)$',
        metrics,
        re.M,
    )
    assert ttft and float(ttft.group(1)) >= 2
    # The second request reused the first one's prompt blocks.
    above_half = re.search(
        r'^gateway_engine_kv_cache_hit_ratio_bucket\{le="0\.5",model="trtllm_llmapi"\} (\S+)$',
        metrics,
        re.M,
    )
    assert above_half and float(above_half.group(1)) < float(count.group(1))
    # A stream repeats the measurements on every response: one request is one observation.
    stream = sdk.chat.completions.create(model="trtllm_llmapi", messages=ask(), stream=True)
    assert len([c for c in stream if c.choices and c.choices[0].delta.content]) > 1
    again = httpx.get(stack.internal_url + "/metrics", timeout=5).text
    after = re.search(
        r'^gateway_engine_kv_cache_hit_ratio_count\{model="trtllm_llmapi"\} (\S+)$', again, re.M
    )
    assert after and float(after.group(1)) == float(count.group(1)) + 1


@pytest.mark.parametrize("model", MODELS)
def test_a_prompt_the_engine_cannot_fit_is_context_length_exceeded(
    sdk: openai.OpenAI, model: str
) -> None:
    # No context_length in upstream's config: the gateway sends its default max_tokens, and
    # 3,500 words with it pass the engine's max_seq_len of 4,096.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=model, messages=ask("word " * 3500))
    assert refused.value.code == "context_length_exceeded"
