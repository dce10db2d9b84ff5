"""Embeddings are admitted like generations: their inputs' tokens reserved under the key's
``tpm`` before any reach the model, and one request's batches sent a few at a time."""

from __future__ import annotations

import asyncio

import httpx

from gateway.backend import Embeddings
from gateway.backend.fake import FakeBackend
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import bearer, make_settings, new_key, serve

EMBED_MODELS = ["fake-chat", "fake-embed"]


async def test_embedding_inputs_are_reserved_under_the_keys_tpm(fake: FakeBackend) -> None:
    async with serve(make_settings(models=EMBED_MODELS), fake) as (_, admin, _sdk):
        key = (await new_key(admin, tpm=100))["key"]
        big = {"model": "fake-embed", "input": ["word " * 100] * 4}  # ~500 tokens
        refused = await admin.post("/v1/embeddings", json=big, headers=bearer(key))
        error = assert_openai_error(refused, 429, type="tokens")
        assert "Request too large" in error["message"]
        assert fake.embed_calls == []  # nothing reached the model
        small = {"model": "fake-embed", "input": ["a few words"]}
        answer = await admin.post("/v1/embeddings", json=small, headers=bearer(key))
        assert answer.status_code == 200, answer.text


class SlowEmbedder(FakeBackend):
    """Counts the embedding batches running at once."""

    running: int = 0
    most: int = 0

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            return await super().embed(model, texts, input_type)
        finally:
            self.running -= 1


async def test_one_request_sends_its_batches_a_few_at_a_time() -> None:
    backend = SlowEmbedder()
    settings = make_settings(models=EMBED_MODELS, max_inflight_per_request=2)
    async with serve(settings, backend) as (_, http, _sdk):
        body = {"model": "fake-embed", "input": [f"text {i}" for i in range(20)]}
        answer: httpx.Response = await http.post("/v1/embeddings", json=body)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["data"]) == 20
    assert len(backend.embed_calls) == 5  # batches of 4 (the model's max_batch_size) ...
    assert backend.most == 2  # ... two at a time
