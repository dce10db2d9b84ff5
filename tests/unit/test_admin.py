"""The admin API's model control (keys and usage: test_auth.py, test_ratelimit.py)."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.backend.fake import FakeBackend
from tests.support.bodies import assert_openai_error, chat_body


async def test_the_repository_lists_every_model_with_its_state(http: httpx.AsyncClient) -> None:
    listed = (await http.get("/admin/models")).json()
    assert listed["object"] == "list"
    states = {m["id"]: (m["state"], m["task"]) for m in listed["data"]}
    assert states == {
        "fake-chat": ("READY", "chat"),
        "fake-plain": ("READY", "chat"),
        "fake-reasoner": ("READY", "chat"),
        "fake-tts": ("READY", "speech"),
        "fake-stt": ("READY", "transcription"),
        "fake-embed": ("READY", "embeddings"),
        "fake-embed-fixed": ("READY", "embeddings"),
        "fake-unloaded": ("", None),
    }


async def test_unload_and_load_are_reflected_in_v1_models_at_once(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI
) -> None:
    unloaded = await http.post("/admin/models/fake-chat/unload")
    assert unloaded.status_code == 200
    assert unloaded.json()["state"] == ""
    assert "fake-chat" not in [m.id for m in (await client.models.list()).data]
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(**chat_body())
    loaded = await http.post("/admin/models/fake-chat/load")
    assert loaded.json() == {
        "id": "fake-chat",
        "object": "model",
        "status": "ready",
        "state": "READY",
        "version": "",
        "reason": "",
        "task": "chat",
    }
    assert "fake-chat" in [m.id for m in (await client.models.list()).data]
    await client.chat.completions.create(**chat_body())


async def test_loading_a_model_not_in_the_repository_is_404(http: httpx.AsyncClient) -> None:
    for action in ("load", "unload"):
        response = await http.post(f"/admin/models/nope/{action}")
        assert_openai_error(response, 404, code="model_not_found")


async def test_triton_down_is_503_for_model_control(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.up = False
    assert_openai_error(await http.get("/admin/models"), 503, code="backend_unavailable")
    assert_openai_error(await http.post("/admin/models/fake-chat/load"), 503)
