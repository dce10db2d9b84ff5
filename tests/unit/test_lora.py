"""LoRA adapters: each a model id of its own (``base:adapter``) that runs on its base with the
adapter in the request (vLLM's ``lora_name``, TensorRT-LLM's ``lora_task_id``, a custom
model's ``openai_input_lora``); listed, allowed, counted and echoed under its own id.
End to end on the real stack: tests/integration/test_lora_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.backend import ModelInfo, SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.backend.profiles import ModelConfig, contract_for
from gateway.config import CHATML_TEMPLATE
from gateway.errors import ModelNotFoundError
from gateway.serving.catalog import DefaultModels, ModelCatalog, with_adapters
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import AUTH, make_settings, new_key, sdk, serve
from tests.support.realtime import events_until, message
from tests.support.triton import decoded, spec, text_of, trtllm_ensemble, vllm

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def fake() -> FakeBackend:
    backend = FakeBackend()
    backend.model_list.append(
        ModelInfo("fake-lora", "chat", True, CHATML_TEMPLATE, 2048, adapters=("sql", "support"))
    )
    return backend


# -- profiles: the adapters a config lists and how each backend is told -------------------


def test_vllm_lists_its_adapters_and_sends_lora_name_in_sampling_parameters() -> None:
    contract = contract_for(vllm("25.11", lora_adapters="sql, support,sql"))
    assert contract is not None
    assert contract.info().adapters == ("sql", "support")
    inputs = decoded(contract.generate("Hi", SamplingOptions(lora_name="sql"), stream=True)[0])
    assert json.loads(text_of(inputs["sampling_parameters"][2])[0]) == {"lora_name": "sql"}
    plain = decoded(contract.generate("Hi", SamplingOptions(), stream=True)[0])
    assert "lora_name" not in json.loads(text_of(plain["sampling_parameters"][2])[0])


def test_trtllm_sends_the_task_id_the_operator_gave_the_name() -> None:
    config = trtllm_ensemble()
    config["input"].append(spec("lora_task_id", "TYPE_UINT64", [1]))
    config["parameters"] = {"lora_adapters": {"string_value": "sql=7, support=12, nameless"}}
    contract = contract_for(ModelConfig.from_json("ensemble", config))
    assert contract is not None
    # An adapter without a task id cannot be asked for: not served.
    assert contract.info().adapters == ("sql", "support")
    options = SamplingOptions(max_tokens=4, lora_name="support")
    inputs = decoded(contract.generate("Hi", options, stream=False)[0])
    assert inputs["lora_task_id"] == ("UINT64", [1, 1], (12).to_bytes(8, "little"))
    assert "lora_task_id" not in decoded(
        contract.generate("Hi", SamplingOptions(max_tokens=4), stream=False)[0]
    )


def test_trtllm_without_a_lora_task_id_input_serves_no_adapter() -> None:
    config = trtllm_ensemble()
    config["parameters"] = {"lora_adapters": {"string_value": "sql=7"}}
    contract = contract_for(ModelConfig.from_json("ensemble", config))
    assert contract is not None and contract.info().adapters == ()


def custom_chat(**params: str) -> ModelConfig:
    return ModelConfig.from_json(
        "mine",
        {
            "backend": "python",
            "input": [spec("prompt", "TYPE_STRING", [1]), spec("adapter", "TYPE_STRING", [1])],
            "output": [spec("generated", "TYPE_STRING", [1])],
            "parameters": {
                k: {"string_value": v}
                for k, v in {
                    "openai_task": "chat",
                    "openai_input_prompt": "prompt",
                    **params,
                }.items()
            },
        },
    )


def test_custom_model_takes_the_adapter_in_its_mapped_input() -> None:
    contract = contract_for(custom_chat(lora_adapters="sql", openai_input_lora="adapter"))
    assert contract is not None and contract.info().adapters == ("sql",)
    inputs = decoded(contract.generate("Hi", SamplingOptions(lora_name="sql"), stream=False)[0])
    assert text_of(inputs["adapter"][2]) == ["sql"]
    # Without a mapped input the adapters cannot reach the model: none is offered.
    unmapped = contract_for(custom_chat(lora_adapters="sql"))
    assert unmapped is not None and unmapped.info().adapters == ()


# -- the catalog: adapter ids ---------------------------------------------------------------


def test_adapter_ids_run_on_their_base_and_a_real_model_keeps_its_name() -> None:
    base = ModelInfo("llama", "chat", True, context_length=8192, adapters=("sql", "chat"))
    clash = ModelInfo("llama:chat", "chat", True)
    unloaded = ModelInfo("other", "chat", False, adapters=("sql",))
    listed = with_adapters([base, clash, unloaded], ":")
    assert sorted(listed) == ["llama", "llama:chat", "llama:sql", "other"]
    adapter = listed["llama:sql"]
    assert (adapter.lora_base, adapter.lora_adapter, adapter.runs_on) == ("llama", "sql", "llama")
    assert adapter.context_length == 8192 and adapter.adapters == ()
    assert listed["llama:chat"] is clash and listed["llama"].runs_on == "llama"
    assert "llama@sql" in with_adapters([base], "@")


def test_the_separator_setting_refuses_what_would_break_ids() -> None:
    for bad in ("", "a b", "/", ",", "x" * 9):
        with pytest.raises(ValueError):
            make_settings(lora_separator=bad)
    assert make_settings(lora_separator="@@").lora_separator == "@@"


# -- requests for an adapter id -------------------------------------------------------------


async def test_chat_runs_on_the_base_with_the_adapter_and_echoes_its_id(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    reply = await client.chat.completions.create(model="fake-lora:sql", messages=HI)
    assert reply.model == "fake-lora:sql"
    call = fake.calls[-1]
    assert (call.model, call.options.lora_name) == ("fake-lora", "sql")
    stream = await client.chat.completions.create(
        model="fake-lora:support", messages=HI, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert {c.model for c in chunks} == {"fake-lora:support"}
    assert (fake.calls[-1].model, fake.calls[-1].options.lora_name) == ("fake-lora", "support")
    await client.chat.completions.create(model="fake-lora", messages=HI)
    assert fake.calls[-1].options.lora_name is None


async def test_completions_and_responses_take_an_adapter_id(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    completion = await client.completions.create(model="fake-lora:sql", prompt="Hi", n=2)
    assert completion.model == "fake-lora:sql"
    assert [(c.model, c.options.lora_name) for c in fake.calls[-2:]] == [("fake-lora", "sql")] * 2
    response = await client.responses.create(model="fake-lora:support", input="Hi")
    assert response.model == "fake-lora:support"
    assert (fake.calls[-1].model, fake.calls[-1].options.lora_name) == ("fake-lora", "support")


async def test_an_unknown_adapter_is_model_not_found_and_embeddings_refuse_one(
    http: httpx.AsyncClient,
) -> None:
    body: dict[str, Any] = {"model": "fake-lora:nope", "messages": HI}
    answer = await http.post("/v1/chat/completions", json=body)
    assert_openai_error(answer, 404, code="model_not_found", param="model")
    answer = await http.post("/v1/embeddings", json={"model": "fake-lora:sql", "input": "x"})
    assert_openai_error(answer, 400, code="model_not_supported", param="model")


async def test_models_list_each_adapter_with_its_parent(http: httpx.AsyncClient) -> None:
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert models["fake-lora:sql"]["parent"] == "fake-lora"
    assert models["fake-lora:sql"]["root"] == "fake-lora"
    assert models["fake-lora:sql"]["task"] == "chat"
    assert models["fake-lora"]["parent"] is None and "fake-lora:support" in models
    one = (await http.get("/v1/models/fake-lora:support")).json()
    assert (one["id"], one["parent"]) == ("fake-lora:support", "fake-lora")


async def test_the_separator_is_the_operators(fake: FakeBackend) -> None:
    async with serve(make_settings(lora_separator="~x~"), fake) as (_, _, client):
        reply = await client.chat.completions.create(model="fake-lora~x~sql", messages=HI)
        assert reply.model == "fake-lora~x~sql" and fake.calls[-1].options.lora_name == "sql"
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="fake-lora:sql", messages=HI)


# -- keys, usage, admin ---------------------------------------------------------------------


async def test_a_key_allowed_one_adapter_uses_only_that_adapter(http: httpx.AsyncClient) -> None:
    key = await new_key(http, models=["fake-lora:sql"])
    tenant = sdk(http, key["key"])
    reply = await tenant.chat.completions.create(model="fake-lora:sql", messages=HI)
    assert reply.model == "fake-lora:sql"
    for other in ("fake-lora", "fake-lora:support"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await tenant.chat.completions.create(model=other, messages=HI)
        assert refused.value.code == "model_not_allowed"
    assert [m.id for m in (await tenant.models.list()).data] == ["fake-lora:sql"]
    me = (await http.get("/v1/me", headers={"Authorization": f"Bearer {key['key']}"})).json()
    assert me["models"] == ["fake-lora:sql"]


async def test_allowing_the_base_does_not_allow_its_adapters(http: httpx.AsyncClient) -> None:
    key = await new_key(http, models=["fake-lora"])
    tenant = sdk(http, key["key"])
    await tenant.chat.completions.create(model="fake-lora", messages=HI)
    with pytest.raises(openai.PermissionDeniedError):
        await tenant.chat.completions.create(model="fake-lora:sql", messages=HI)
    assert [m.id for m in (await tenant.models.list()).data] == ["fake-lora"]


async def test_usage_counts_each_adapter_apart_from_its_base(http: httpx.AsyncClient) -> None:
    key = await new_key(http)
    tenant = sdk(http, key["key"])
    await tenant.chat.completions.create(model="fake-lora:sql", messages=HI, max_tokens=2)
    await tenant.chat.completions.create(model="fake-lora:sql", messages=HI, max_tokens=3)
    await tenant.chat.completions.create(model="fake-lora", messages=HI, max_tokens=1)
    with pytest.raises(openai.NotFoundError):  # no such model: not counted under its name
        await tenant.chat.completions.create(model="fake-lora:nope", messages=HI)
    usage = (await http.get(f"/admin/keys/{key['id']}/usage")).json()
    assert usage["requests"] == 4
    assert usage["models"]["fake-lora:sql"]["requests"] == 2
    assert usage["models"]["fake-lora:sql"]["completion_tokens"] == 5
    assert usage["models"]["fake-lora"] == {
        "requests": 1,
        "prompt_tokens": usage["models"]["fake-lora"]["prompt_tokens"],
        "completion_tokens": 1,
    }
    assert set(usage["models"]) == {"fake-lora", "fake-lora:sql"}


async def test_an_adapter_is_not_loaded_or_unloaded_its_base_is(http: httpx.AsyncClient) -> None:
    for action in ("load", "unload"):
        answer = await http.post(f"/admin/models/fake-lora:sql/{action}")
        error = assert_openai_error(answer, 400, code="lora_adapter")
        assert f"{action} 'fake-lora'" in error["message"]


def test_a_realtime_session_answers_with_an_adapter(fake: FakeBackend) -> None:
    app = create_app(make_settings(models=["fake-chat", "fake-tts", "fake-stt"]), backend=fake)
    with (
        TestClient(app) as client,
        client.websocket_connect("/v1/realtime?model=fake-lora:sql", headers=AUTH) as socket,
    ):
        created = events_until(socket, "session.created")[-1]["session"]
        assert created["model"] == "fake-lora:sql"
        socket.send_json(message("Hi"))
        events_until(socket, "conversation.item.done")
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = events_until(socket, "response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert (fake.calls[-1].model, fake.calls[-1].options.lora_name) == ("fake-lora", "sql")


async def test_an_unloaded_base_takes_its_adapters_with_it() -> None:
    backend = FakeBackend(
        model_list=[
            ModelInfo("aaa", "chat", True, adapters=("first",)),
            ModelInfo("zzz", "chat", True),
        ]
    )
    catalog = ModelCatalog(backend, 60.0, ":")
    assert (await catalog.get("aaa:first", "chat")).runs_on == "aaa"
    backend.model_list[0] = ModelInfo("aaa", "chat", False, adapters=("first",))
    assert "aaa:first" not in await catalog.refresh()
    with pytest.raises(ModelNotFoundError):
        await catalog.get("aaa:first", "chat")
    # Realtime and audio chat pick a loaded model, never an adapter, where none is named.
    assert await DefaultModels(catalog, make_settings(models=[])).pick("chat") == "zzz"
