"""LoRA adapters end to end: ``vllm_lora`` (triton_repo/vllm_lora: Triton's vLLM backend
r25.11 with ``multi_lora.json``) and TensorRT-LLM's ``ensemble`` and ``tensorrt_llm_bls``
(``lora_adapters`` names -> ``lora_task_id``) loaded through the admin API into the real
Triton, their adapters called by their ids (``vllm_lora:sql``) with the official SDK. The
stand-ins start their answer with the adapter (or task) they were given, so each test sees
the adapter reach the model."""

from __future__ import annotations

import queue
import re
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from tritonclient import grpc as triton

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

BASE = "vllm_lora"
ANSWER = "The quick brown fox jumps over the lazy dog."
HI = [{"role": "user", "content": "Hi"}]
TRTLLM = ("ensemble", "tensorrt_llm_bls")


@pytest.fixture(scope="module")
def loaded(stack: GatewayProcess) -> GatewayProcess:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        for name in (BASE, *TRTLLM):
            answer = http.post(f"/admin/models/{name}/load")
            assert answer.status_code == 200, answer.text
    return stack


@pytest.fixture(scope="module")
def sdk(loaded: GatewayProcess) -> openai.OpenAI:
    return loaded.client()


def test_models_list_the_adapters_with_their_base_as_parent(sdk: openai.OpenAI) -> None:
    models = {m.id: m.model_extra or {} for m in sdk.models.list()}
    for adapter in ("sql", "support"):
        shown = models[f"{BASE}:{adapter}"]
        assert (shown["parent"], shown["root"], shown["task"]) == (BASE, BASE, "chat")
    assert models[BASE]["parent"] is None
    assert sdk.models.retrieve(f"{BASE}:sql").id == f"{BASE}:sql"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_with_an_adapter_reaches_the_model_with_it(sdk: openai.OpenAI, stream: bool) -> None:
    if stream:
        chunks = list(sdk.chat.completions.create(model=f"{BASE}:sql", messages=HI, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert {c.model for c in chunks} == {f"{BASE}:sql"}
    else:
        reply = sdk.chat.completions.create(model=f"{BASE}:sql", messages=HI)
        text = reply.choices[0].message.content or ""
        assert reply.model == f"{BASE}:sql"
    assert text == f"(sql) {ANSWER}"
    base = sdk.chat.completions.create(model=BASE, messages=HI)
    assert base.choices[0].message.content == ANSWER


@pytest.mark.parametrize("stream", [False, True])
def test_completions_with_an_adapter(sdk: openai.OpenAI, stream: bool) -> None:
    if stream:
        chunks = list(
            sdk.completions.create(model=f"{BASE}:support", prompt="Hi", max_tokens=64, stream=True)
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert {c.model for c in chunks} == {f"{BASE}:support"}
    else:
        reply = sdk.completions.create(model=f"{BASE}:support", prompt="Hi", max_tokens=64)
        text = reply.choices[0].text
        assert reply.model == f"{BASE}:support"
    assert text == f"(support) {ANSWER}"


def test_responses_with_an_adapter(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model=f"{BASE}:support", input="Hi")
    assert response.model == f"{BASE}:support"
    assert response.output_text == f"(support) {ANSWER}"


def test_unknown_adapters_are_refused(sdk: openai.OpenAI) -> None:
    # Not in lora_adapters: the gateway's 404, as for any unknown model.
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model=f"{BASE}:nope", messages=HI)
    assert unknown.value.code == "model_not_found"
    # Listed by the operator but not in the Triton host's multi_lora.json: the backend
    # refuses it ("LoRA ghost is not supported, ..."), an error of the deployment.
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model=f"{BASE}:ghost", messages=HI)


def test_a_key_for_one_adapter_uses_it_alone_and_usage_shows_its_id(
    loaded: GatewayProcess,
) -> None:
    created = loaded.create_key("tenant-sql", models=[f"{BASE}:sql"])
    tenant = loaded.client(created["key"])
    reply = tenant.chat.completions.create(model=f"{BASE}:sql", messages=HI, max_tokens=5)
    assert reply.choices[0].message.content == "(sql)"
    for other in (BASE, f"{BASE}:support"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            tenant.chat.completions.create(model=other, messages=HI)
        assert refused.value.code == "model_not_allowed"
    assert [m.id for m in tenant.models.list()] == [f"{BASE}:sql"]
    usage = httpx.get(
        f"{loaded.base_url}/admin/keys/{created['id']}/usage", headers=loaded.headers
    ).json()
    assert reply.usage is not None
    counted = {"requests": 1, "prompt_tokens": reply.usage.prompt_tokens, "completion_tokens": 5}
    assert usage["models"] == {f"{BASE}:sql": counted}
    metrics = httpx.get(loaded.internal_url + "/metrics").text
    assert re.search(rf'gateway_requests_total\{{[^}}]*model="{BASE}:sql"', metrics)


def test_the_admin_api_loads_the_base_not_an_adapter(loaded: GatewayProcess) -> None:
    answer = httpx.post(f"{loaded.base_url}/admin/models/{BASE}:sql/unload", headers=loaded.headers)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "lora_adapter"


# -- TensorRT-LLM: lora_task_id ---------------------------------------------------------------


def cache_task(grpc_url: str, model: str, task: int) -> None:
    """What the operator does before a task's first request through the gateway: one request
    straight to Triton with the task's weights and config, which puts it in the engine's
    LoRA cache (the gateway never sends weights)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def tensor(name: str, value: np.ndarray, kind: str) -> triton.InferInput:
        given = triton.InferInput(name, list(value.shape), kind)
        given.set_data_from_numpy(value)
        return given

    inputs = [
        tensor("text_input", np.array([["Hi"]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[4]], dtype=np.int32), "INT32"),
        tensor("lora_task_id", np.array([[task]], dtype=np.uint64), "UINT64"),
        tensor("lora_weights", np.zeros((1, 1, 8), dtype=np.float16), "FP16"),
        tensor("lora_config", np.zeros((1, 1, 3), dtype=np.int32), "INT32"),
    ]
    client = triton.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", TRTLLM)
def test_trtllm_adapters_send_the_operators_task_id(
    loaded: GatewayProcess, sdk: openai.OpenAI, model: str
) -> None:
    models = {m.id: m.model_extra or {} for m in sdk.models.list()}
    assert models[f"{model}:sql"]["parent"] == model and f"{model}:support" in models
    # Task 12 ("support") was never given its weights: the engine refuses it.
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model=f"{model}:support", messages=HI, max_tokens=8)
    cache_task(loaded.triton_grpc, model, 7)
    reply = sdk.chat.completions.create(model=f"{model}:sql", messages=HI, max_tokens=60)
    assert (reply.model, reply.choices[0].message.content) == (f"{model}:sql", f"(task 7) {ANSWER}")
    chunks = list(
        sdk.chat.completions.create(model=f"{model}:sql", messages=HI, max_tokens=60, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"(task 7) {ANSWER}"
