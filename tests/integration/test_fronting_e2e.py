"""Fronting the Triton models teams already run: the vLLM backend at four releases,
TensorRT-LLM's ensemble and BLS, and hand-written models with their own tensors.

Each stand-in's config reproduces the backend's own (triton_repo/README.md); they are loaded
through the admin API into the real Triton, as a user adds a model, and called with the
official SDK. Their tokens are bytes, so every count can be checked exactly; the gateway
takes their chat template and token counts from a mounted tokenizer (conftest)."""

from __future__ import annotations

import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from tests.support.generation import generated_tokens, generation_stops
from tests.support.shared_stack import LLAMA3_STYLE_TEMPLATE
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

VLLM = ["vllm_r24_05", "vllm_r24_12", "vllm_r25_05", "vllm_r25_11"]
TRTLLM = ["ensemble", "tensorrt_llm_bls", "tensorrt_llm_bls_r24_08"]
OTHERS = ["vllm_r25_11_embed", "seed_llm", "custom_tts", "custom_stt"]
ANSWER = "The quick brown fox jumps over the lazy dog."
HI = [{"role": "user", "content": "Hi"}]


def say(text: str) -> list[dict[str, str]]:
    """A user message that makes the stand-ins answer ``text``."""
    return [{"role": "user", "content": f"[say={urllib.parse.quote(text)}]"}]


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    """The stand-ins' count of the rendered prompt: its bytes (the template, by hand)."""
    rendered = "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in messages
    )
    rendered += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert "messages" in LLAMA3_STYLE_TEMPLATE  # the template the tokenizer carries
    return len(rendered.encode())


@pytest.fixture(scope="module")
def loaded(stack: GatewayProcess) -> GatewayProcess:
    """Every stand-in loaded through the admin API. They stay loaded for the rest of the
    session (unloading 14 models costs about 10 s of the suite; idle, they cost nothing)."""
    names = [*VLLM, *TRTLLM, *OTHERS]
    with (
        httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http,
        ThreadPoolExecutor(len(names)) as pool,
    ):
        # Triton loads (and unloads) them side by side, as several admins would.
        loads = list(pool.map(lambda name: http.post(f"/admin/models/{name}/load"), names))
        assert all(answer.status_code == 200 for answer in loads), [a.text for a in loads]
    return stack


@pytest.fixture(scope="module")
def sdk(loaded: GatewayProcess) -> openai.OpenAI:
    return loaded.client()


def test_models_show_their_profile_release_and_parameters(sdk: openai.OpenAI) -> None:
    models = {m.id: m.model_extra or {} for m in sdk.models.list()}
    assert models["vllm_r24_05"]["profile"] == "vllm"
    assert models["vllm_r24_05"]["backend_release"] == "24.11 or older"
    assert models["vllm_r25_05"]["backend_release"] == "25.01-25.10"
    assert models["vllm_r25_11"]["backend_release"] == "25.11+"
    assert models["ensemble"]["profile"] == "trtllm"
    assert "seed" in models["ensemble"]["parameters"]
    assert models["seed_llm"] == {**models["seed_llm"], "profile": "custom", "task": "chat"}
    assert models["seed_llm"]["parameters"] == ["stop"]
    assert models["vllm_r25_11_embed"]["task"] == "embeddings"
    assert models["custom_tts"]["task"] == "speech"
    # The ensemble's steps serve no OpenAI task: not listed.
    assert "tensorrt_llm" not in models and "preprocessing" not in models


@pytest.mark.parametrize("model", [*VLLM, *TRTLLM, "seed_llm"])
@pytest.mark.parametrize("stream", [False, True])
def test_every_profile_answers_whole_without_max_tokens(
    sdk: openai.OpenAI, model: str, stream: bool
) -> None:
    """No max_tokens from the client: the answer is whole (vLLM alone would stop after 16
    tokens; TensorRT-LLM requires one), the prompt is not repeated, the finish is stop."""
    if stream:
        chunks = list(
            sdk.chat.completions.create(
                model=model, messages=HI, stream=True, stream_options={"include_usage": True}
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        reply = sdk.chat.completions.create(model=model, messages=HI)
        text, finish, usage = (
            reply.choices[0].message.content,
            reply.choices[0].finish_reason,
            reply.usage,
        )
    assert (text, finish) == (ANSWER, "stop")
    assert usage is not None
    # Byte tokens: the counts are exact whether the model reported them (vLLM counts its
    # end-of-sequence token too) or the gateway counted them with the model's tokenizer
    # (then usage says they are estimated).
    counted = model in ("vllm_r24_05", *TRTLLM, "seed_llm")
    answer_tokens = len(ANSWER) + (0 if counted else 1)
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens(HI), answer_tokens)
    assert (usage.model_extra or {}).get("estimated", False) is counted


@pytest.mark.parametrize("model", [*VLLM, *TRTLLM])
def test_max_tokens_and_stop_keep_openais_meaning(sdk: openai.OpenAI, model: str) -> None:
    short = sdk.chat.completions.create(model=model, messages=HI, max_tokens=9)
    assert (short.choices[0].message.content, short.choices[0].finish_reason) == (
        "The quick",
        "length",
    )
    # TensorRT-LLM keeps the stop word in its text; the answer never does.
    for stream in (False, True):
        if stream:
            chunks = sdk.chat.completions.create(
                model=model, messages=HI, stop=[" fox"], stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = sdk.chat.completions.create(model=model, messages=HI, stop=[" fox"])
            text = reply.choices[0].message.content or ""
            assert reply.choices[0].finish_reason == "stop"
        assert text == "The quick brown", (model, stream)


@pytest.mark.parametrize("model", [*VLLM, *TRTLLM])
def test_an_anthropic_client_is_told_which_stop_sequence_ended_the_answer(
    loaded: GatewayProcess, model: str
) -> None:
    """vLLM is asked to keep the stop string (include_stop_str_in_output, at every release),
    TensorRT-LLM keeps it anyway: each time the gateway cuts the text itself and names the
    stop sequence it met first."""
    claude = anthropic.Anthropic(base_url=loaded.base_url, api_key=loaded.admin_key, max_retries=0)
    asked: dict = {"model": model, "max_tokens": 64, "messages": HI}
    for stream in (False, True):
        stops = [" lazy", " fox"]
        if stream:
            with claude.messages.stream(**asked, stop_sequences=stops) as events:
                message = events.get_final_message()
        else:
            message = claude.messages.create(**asked, stop_sequences=stops)
        assert message.content[0].text == "The quick brown", (model, stream)  # type: ignore[union-attr]
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " fox")
    whole = claude.messages.create(**asked, stop_sequences=["never said"])
    assert (whole.stop_reason, whole.stop_sequence) == ("end_turn", None)


def test_n_choices_and_seeds_reach_every_release(sdk: openai.OpenAI) -> None:
    for model in ("vllm_r24_12", "ensemble", "tensorrt_llm_bls_r24_08"):
        reply = sdk.chat.completions.create(model=model, messages=HI, n=2, seed=7)
        assert [c.message.content for c in reply.choices] == [ANSWER, ANSWER]


def test_a_value_the_tensor_cannot_hold_is_a_400(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="ensemble", messages=HI, seed=-1)
    assert refused.value.body["param"] == "seed"  # type: ignore[index]


def test_cumulative_bls_text_streams_whole_characters(sdk: openai.OpenAI) -> None:
    """The BLS with accumulate_tokens sends the whole text so far; a character split across
    byte tokens shows as U+FFFD there until it is complete, and is held back."""
    words = "naïve café – déjà vu"
    pieces = [
        c.choices[0].delta.content
        for c in sdk.chat.completions.create(
            model="tensorrt_llm_bls", messages=say(words), stream=True
        )
        if c.choices and c.choices[0].delta.content
    ]
    assert "".join(pieces) == words
    assert len(pieces) > 5 and not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize(
    ("model", "works"),
    [("vllm_r24_12", False), ("vllm_r25_05", True), ("vllm_r25_11", True), ("ensemble", True)],
)
def test_structured_outputs_use_each_releases_key(
    sdk: openai.OpenAI, model: str, works: bool
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    if not works:  # 24.12's vLLM has no guided decoding: refused, not a 500
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(
                model=model,
                messages=HI,
                response_format=response_format,  # type: ignore[arg-type]
            )
        assert refused.value.body["param"] == "response_format"  # type: ignore[index]
        return
    reply = sdk.chat.completions.create(
        model=model,
        messages=HI,
        response_format=response_format,  # type: ignore[arg-type]
    )
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_a_prompt_too_long_is_context_length_exceeded(sdk: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "word " * 1000}]  # 5000 byte tokens, context 4096
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="vllm_r25_11", messages=long, max_tokens=5)
    assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]


def test_a_custom_model_takes_only_what_it_maps(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="seed_llm", messages=HI, temperature=0.3)
    assert refused.value.body["param"] == "temperature"  # type: ignore[index]
    # Legacy completions: the raw prompt, no template.
    completion = sdk.completions.create(model="seed_llm", prompt="Once")
    assert completion.choices[0].text == ANSWER


def test_vllm_embedding_model(sdk: openai.OpenAI) -> None:
    texts = ["a cat sits on the mat", "a cat sat on a mat", "stock prices fell sharply"]
    result = sdk.embeddings.create(model="vllm_r25_11_embed", input=texts)
    vectors = [d.embedding for d in result.data]
    assert len(vectors) == 3 and len(vectors[0]) == 16

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert result.usage.prompt_tokens == sum(len(t.encode()) for t in texts)
    # A generative vLLM model is no embedding model.
    with pytest.raises(openai.BadRequestError):
        sdk.embeddings.create(model="vllm_r25_11", input="hi")


def test_custom_speech_and_transcription_round_trip(sdk: openai.OpenAI) -> None:
    """custom_tts returns FP32 samples at 22,050 Hz; the gateway encodes them as FLAC.
    custom_stt takes FP32 samples at 16 kHz; the gateway decodes the file and resamples."""
    audio = sdk.audio.speech.create(
        model="custom_tts", voice="alloy", input="hello world", response_format="flac"
    ).content
    text = sdk.audio.transcriptions.create(model="custom_stt", file=("hello.flac", audio)).text
    assert text == "hello world"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.audio.speech.create(model="custom_tts", voice="alloy", input="hi", speed=1.5)
    assert refused.value.body["param"] == "speed"  # type: ignore[index]


def test_leaving_a_stream_cancels_a_vllm_request(loaded: GatewayProcess) -> None:
    """vLLM aborts a cancelled request. (A TensorRT-LLM ensemble does not: Triton passes a
    cancellation only to steps not yet started; see docs/fronting-triton.md.)"""
    before = generated_tokens(loaded, "vllm_r25_11")
    body = {
        "model": "vllm_r25_11",
        "stream": True,
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": f"[say={'x' * 2000}] [delay_ms=20]"}],
    }
    with (
        httpx.Client(base_url=loaded.base_url, headers=loaded.headers, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        for n, _ in enumerate(response.iter_lines()):
            if n >= 6:
                break
    assert generation_stops(loaded, "vllm_r25_11") < before + 200
