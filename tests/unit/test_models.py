"""GET /v1/models and /v1/models/{id}: only loaded models that serve an OpenAI task."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.bodies import assert_openai_error


async def test_list_shows_ready_models_with_a_task(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert sorted(m["id"] for m in body["data"]) == [
        "fake-chat",
        "fake-embed",
        "fake-embed-fixed",
        "fake-plain",
        "fake-reasoner",
        "fake-stt",
        "fake-tts",
    ]


async def test_list_model_objects_have_the_openai_shape(http: httpx.AsyncClient) -> None:
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    chat = models["fake-chat"]
    assert chat["object"] == "model"
    assert chat["owned_by"] == "triton"
    assert isinstance(chat["created"], int) and chat["created"] > 1_600_000_000
    assert chat["task"] == "chat"
    assert chat["context_length"] == 2048
    assert models["fake-tts"]["task"] == "speech"
    assert models["fake-embed"]["task"] == "embeddings"
    assert (models["fake-embed"]["dimensions"], models["fake-embed"]["context_length"]) == (8, 32)


async def test_sdk_lists_the_models(client: openai.AsyncOpenAI) -> None:
    ids = [m.id async for m in client.models.list()]
    assert sorted(ids) == [
        "fake-chat",
        "fake-embed",
        "fake-embed-fixed",
        "fake-plain",
        "fake-reasoner",
        "fake-stt",
        "fake-tts",
    ]


async def test_retrieve_a_model(http: httpx.AsyncClient, client: openai.AsyncOpenAI) -> None:
    response = await http.get("/v1/models/fake-chat")
    assert response.status_code == 200
    assert response.json()["id"] == "fake-chat"
    assert response.json()["object"] == "model"

    model = await client.models.retrieve("fake-chat")
    assert model.id == "fake-chat"
    assert model.object == "model"


@pytest.mark.parametrize("model", ["no-such-model", "fake-unloaded"])
async def test_retrieve_unknown_or_unloaded_model_is_404(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, model: str
) -> None:
    error = assert_openai_error(
        await http.get(f"/v1/models/{model}"),
        404,
        type="invalid_request_error",
        code="model_not_found",
    )
    assert model in error["message"]

    with pytest.raises(openai.NotFoundError) as raised:
        await client.models.retrieve(model)
    assert raised.value.code == "model_not_found"


async def test_model_ids_with_slashes_are_looked_up_whole(http: httpx.AsyncClient) -> None:
    # Model ids like "org/name" are common; the path converter must not split them.
    assert_openai_error(await http.get("/v1/models/org/fake-chat"), 404, code="model_not_found")
