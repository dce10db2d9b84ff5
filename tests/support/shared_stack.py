"""The stack the integration modules share (``tests/integration/conftest.py``'s ``stack``
starts it once): its models and settings, its upload limit, and the stand-ins of other
backends' models that take their chat template from a byte-level tokenizer made here."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from tests.support.stack import GatewayProcess

#: GATEWAY_MAX_AUDIO_UPLOAD_MB of the test stack (nginx's cap is one more).
UPLOAD_LIMIT_MB = 4
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


def shared_stack(redis_url: str, tokenizer: Path) -> GatewayProcess:
    """The shared stack, not started: every model the integration modules use, on the Redis
    at ``redis_url``, the stand-ins' chat template from ``tokenizer``
    (:func:`byte_tokenizer`'s folder)."""
    return GatewayProcess(
        models=["smollm2", "mock_chat", "piper_tts", "whisper_stt", "e5_small"],
        redis_url=redis_url,
        env={
            # Small, so that the upload-limit tests send a few MB, not 25 (a body takes the
            # upload and its multipart framing; nginx's cap is the larger limit plus 1 MB).
            "GATEWAY_MAX_AUDIO_UPLOAD_MB": str(UPLOAD_LIMIT_MB),
            "GATEWAY_MAX_REQUEST_MB": str(UPLOAD_LIMIT_MB + 1),
            "GATEWAY_TOKENIZERS": json.dumps({m: str(tokenizer) for m in TOKENIZED_MODELS}),
            # test_images_e2e's loopback server, on whatever port it got.
            "GATEWAY_IMAGE_URL_HOSTS": "127.0.0.1:*",
        },
    )
