"""The model catalog: cached for ``model_cache_ttl_s``, refreshed at once for unknown names."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import pytest

import gateway.serving.catalog
from gateway.backend import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import REPLY, make_settings, serve

CHAT = "/v1/chat/completions"
NEW_MODEL = ModelInfo("fake-new", "chat", True, CHATML_TEMPLATE)


class Clock:
    """``time`` for gateway.serving.catalog whose monotonic clock a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.time = time.time

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(gateway.serving.catalog, "time", clock)
    return clock


@dataclass
class CountingBackend(FakeBackend):
    """Counts the reads of the model list."""

    reads: int = 0

    async def models(self) -> list[ModelInfo]:
        self.reads += 1
        return await super().models()


async def test_chat_lookups_use_the_cached_list_for_the_ttl(clock: Clock) -> None:
    backend = CountingBackend()
    async with serve(make_settings(model_cache_ttl_s=60), backend) as (_, http, _sdk):
        for _ in range(3):
            assert (await http.post(CHAT, json=chat_body())).status_code == 200
        assert backend.reads == 1
        clock.advance(61)
        assert (await http.post(CHAT, json=chat_body())).status_code == 200
        assert backend.reads == 2


async def test_v1_models_reads_the_backend_every_time() -> None:
    # Another replica may have loaded or unloaded a model a moment ago.
    backend = CountingBackend()
    async with serve(make_settings(model_cache_ttl_s=60), backend) as (_, http, _sdk):
        for _ in range(3):
            assert (await http.get("/v1/models")).status_code == 200
        assert backend.reads == 3


async def test_new_model_is_found_at_once_by_chat_despite_a_long_ttl(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert "fake-new" not in listed

    fake.model_list.append(NEW_MODEL)
    response = await http.post(CHAT, json=chat_body(model="fake-new"))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY
    assert fake.calls[-1].model == "fake-new"
    # The read the chat request forced also updates the list.
    listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert "fake-new" in listed


async def test_new_model_appears_in_the_list_at_once(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    assert (await http.get("/v1/models")).status_code == 200
    fake.model_list.append(NEW_MODEL)
    listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert "fake-new" in listed  # despite the 3,600 s cache TTL of these tests


async def test_new_model_is_found_at_once_by_retrieve(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    assert (await http.get("/v1/models")).status_code == 200
    fake.model_list.append(NEW_MODEL)
    response = await http.get("/v1/models/fake-new")
    assert response.status_code == 200, response.text


async def test_model_loaded_later_is_found_by_chat(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # A model known but not yet loaded, then loaded: chat must not keep the stale "unloaded".
    assert_openai_error(
        await http.post(CHAT, json=chat_body(model="fake-unloaded")), 404, code="model_not_found"
    )
    fake.model_list = [
        ModelInfo("fake-unloaded", "chat", True, CHATML_TEMPLATE)
        if m.name == "fake-unloaded"
        else m
        for m in fake.model_list
    ]
    assert (await http.post(CHAT, json=chat_body(model="fake-unloaded"))).status_code == 200


async def test_removed_model_leaves_the_list_at_once_and_chat_follows_it() -> None:
    fake = FakeBackend()
    async with serve(make_settings(model_cache_ttl_s=30), fake) as (_, http, _sdk):
        assert (await http.post(CHAT, json=chat_body())).status_code == 200
        fake.model_list = [m for m in fake.model_list if m.name != "fake-chat"]
        # Within the TTL, chat still trusts the cache and forwards the request: the backend
        # decides (Triton's adapter reports a model that is not ready as 404).
        assert (await http.post(CHAT, json=chat_body())).status_code == 200
        assert len(fake.calls) == 2

        listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        assert "fake-chat" not in listed
        assert_openai_error(await http.get("/v1/models/fake-chat"), 404, code="model_not_found")
        # The fresh read updated the cache: chat now answers 404 without asking the backend.
        assert_openai_error(await http.post(CHAT, json=chat_body()), 404, code="model_not_found")
        assert len(fake.calls) == 2


async def test_removed_model_is_not_found_once_the_ttl_passed_even_without_a_list_read(
    clock: Clock,
) -> None:
    fake = FakeBackend()
    async with serve(make_settings(model_cache_ttl_s=30), fake) as (_, http, _sdk):
        assert (await http.post(CHAT, json=chat_body())).status_code == 200
        fake.model_list = [m for m in fake.model_list if m.name != "fake-chat"]
        clock.advance(31)
        assert_openai_error(await http.post(CHAT, json=chat_body()), 404, code="model_not_found")


async def test_ttl_zero_reads_the_backend_every_time() -> None:
    backend = CountingBackend()
    async with serve(make_settings(model_cache_ttl_s=0), backend) as (_, http, _sdk):
        await http.get("/v1/models")
        await http.get("/v1/models")
        assert backend.reads == 2


async def test_concurrent_lookups_share_one_read() -> None:
    backend = CountingBackend()
    async with serve(make_settings(), backend) as (_, http, _sdk):
        responses = await asyncio.gather(*(http.post(CHAT, json=chat_body()) for _ in range(10)))
    assert [r.status_code for r in responses] == [200] * 10
    assert backend.reads == 1


@dataclass
class GatedBackend(FakeBackend):
    """Takes its model list at once but answers only when ``gate`` opens: a slow index read."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    read_started: asyncio.Event = field(default_factory=asyncio.Event)

    async def models(self) -> list[ModelInfo]:
        snapshot = await super().models()
        self.read_started.set()
        await self.gate.wait()
        return snapshot


async def test_model_loaded_during_another_read_is_still_found() -> None:
    backend = GatedBackend()
    async with serve(make_settings(), backend) as (_, http, _sdk):
        # A readiness probe reads the model list; Triton is slow to answer.
        probe = asyncio.create_task(http.get("/health/ready"))
        await backend.read_started.wait()
        # Meanwhile a model finishes loading, and a client asks for it.
        backend.model_list.append(NEW_MODEL)
        chat = asyncio.create_task(http.post(CHAT, json=chat_body(model="fake-new")))
        await asyncio.sleep(0.05)  # the chat request now waits for the probe's read
        backend.gate.set()
        await probe
        response = await chat
    # The model was loaded before the request arrived: it must be found.
    assert response.status_code == 200, response.text
