"""LoRA adapters end to end: ``vllm_lora`` (triton_repo/vllm_lora: Triton's vLLM backend
r25.11 with ``multi_lora.json``) loaded through the admin API into the real Triton, its
adapters called by their ids (``vllm_lora:sql``) with the official SDK. The stand-in starts
its answer with the adapter it was given, so each test sees the adapter reach the model."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.stack import GatewayProcess

pytestmark = pytest.mark.integration

BASE = "vllm_lora"
ANSWER = "The quick brown fox jumps over the lazy dog."
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def loaded(stack: GatewayProcess) -> GatewayProcess:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        answer = http.post(f"/admin/models/{BASE}/load")
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
