"""Fixtures that run the real stack: Redis (redis-server), Triton (nvidia-pytriton wheel)
with the real models, the gateway under uvicorn, and the official openai client (sending
the admin key unless a test makes a key of its own)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.stack.redis_server import EmbeddedRedis
from tests.redis_server import redis_server
from tests.stack import GatewayProcess

#: GATEWAY_MAX_AUDIO_UPLOAD_MB of the test stack (nginx's cap is one more).
UPLOAD_LIMIT_MB = 4


@pytest.fixture(scope="session")
def redis_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The Redis the stack uses; tests may stop and restart it (its data persists)."""
    server = redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


#: Stand-ins for other backends' models (triton_repo/README.md) that have no chat template
#: of their own: the gateway takes theirs from a tokenizer (GATEWAY_TOKENIZERS).
TOKENIZED_MODELS = (
    "vllm_r24_05",
    "vllm_r24_12",
    "vllm_r25_05",
    "vllm_r25_11",
    "ensemble",
    "tensorrt_llm_bls",
    "tensorrt_llm_bls_r24_08",
    "seed_llm",
    "trtllm_llmapi",
    "trtllm_llmapi_sync",
)
#: A Llama 3-style chat template, as a tokenizer_config.json carries one.
LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def byte_tokenizer(folder: Path) -> Path:
    """A Hugging Face tokenizer whose tokens are single bytes, as the stand-ins count them,
    with the template above: the files an operator mounts on the gateway."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    encoder = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    encoder.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    encoder.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|eot_id|>"},
        "chat_template": LLAMA3_STYLE_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def stack(
    redis_store: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    tokenizer = byte_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    gateway = GatewayProcess(
        models=["smollm2", "mock_chat", "piper_tts", "whisper_stt", "e5_small"],
        redis_url=redis_store.url,
        env={
            # Small, so that the upload-limit tests send a few MB, not 25 (a body takes the
            # upload and its multipart framing; nginx's cap is the larger limit plus 1 MB).
            "GATEWAY_MAX_AUDIO_UPLOAD_MB": str(UPLOAD_LIMIT_MB),
            "GATEWAY_MAX_REQUEST_MB": str(UPLOAD_LIMIT_MB + 1),
            "GATEWAY_TOKENIZERS": json.dumps({m: str(tokenizer) for m in TOKENIZED_MODELS}),
            # test_images_e2e's loopback server, on whatever port it got.
            "GATEWAY_IMAGE_URL_HOSTS": "127.0.0.1:*",
        },
    ).start()
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        code = gateway.stop()
    # Leaving the session must shut the stack down cleanly (SIGTERM -> exit 0).
    assert code == 0, gateway.output()


@pytest.fixture(scope="session")
def client(stack: GatewayProcess) -> openai.OpenAI:
    return stack.client()


@pytest.fixture
def aclient(stack: GatewayProcess) -> openai.AsyncOpenAI:
    return stack.async_client()


def generated_tokens(stack: GatewayProcess, model: str) -> float:
    """Triton's custom metric of tokens the model generated (see triton_repo/README.md)."""
    text = httpx.get(stack.triton_metrics, timeout=5).text
    match = re.search(rf'^model_generated_tokens_total{{model="{model}"}} (\S+)$', text, re.M)
    assert match, f"no token metric for {model} in Triton's /metrics"
    return float(match.group(1))


def generation_stops(
    stack: GatewayProcess, model: str, still_s: float = 0.5, timeout_s: float = 10
) -> float:
    """Waits until ``model``'s generated-token counter has stood still for ``still_s``
    (polled every 0.1 s) and returns it: the model stopped generating. Fails when it keeps
    growing for ``timeout_s`` (a cancelled request the model went on with). The models slowed
    for these tests make a token every 20-40 ms, so a running one never stands still that
    long."""
    deadline = time.monotonic() + timeout_s
    last, since = generated_tokens(stack, model), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = generated_tokens(stack, model)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return now
    raise AssertionError(f"{model} kept generating for {timeout_s} s (at {last} tokens)")
