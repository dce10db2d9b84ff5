"""/v1/embeddings through the official SDK against the fake backend (bag-of-words vectors:
texts that share words point the same way) and a real Redis."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from gateway.backend.fake import EMBED_DIMENSIONS, FakeBackend
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import new_key, sdk


async def test_float_and_base64_give_the_same_unit_vectors(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    texts = ["the cat sat", "a dog ran far"]
    sdk_result = await client.embeddings.create(model="fake-embed", input=texts)  # base64
    raw = await http.post(
        "/v1/embeddings", json={"model": "fake-embed", "input": texts, "encoding_format": "float"}
    )
    assert raw.status_code == 200
    body = raw.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    floats = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    decoded = np.array([d.embedding for d in sdk_result.data], dtype=np.float32)
    assert floats.shape == (2, EMBED_DIMENSIONS)
    np.testing.assert_allclose(np.linalg.norm(floats, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(floats, decoded)
    assert sdk_result.usage.prompt_tokens == (3 + 2) + (4 + 2)
    assert sdk_result.usage.total_tokens == sdk_result.usage.prompt_tokens


async def test_base64_is_little_endian_float32(http: httpx.AsyncClient) -> None:
    reply = await http.post(
        "/v1/embeddings",
        json={"model": "fake-embed", "input": "hello", "encoding_format": "base64"},
    )
    vector = np.frombuffer(base64.b64decode(reply.json()["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (EMBED_DIMENSIONS,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


async def test_related_texts_are_closer(client: openai.AsyncOpenAI) -> None:
    result = await client.embeddings.create(
        model="fake-embed",
        input=["red apples grow", "red apples fall", "quantum flux capacitors"],
        encoding_format="float",
    )
    a, b, c = (np.array(d.embedding) for d in result.data)
    assert a @ b > a @ c


async def test_large_inputs_are_split_into_model_sized_batches(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    texts = [f"text number {i}" for i in range(10)]
    result = await client.embeddings.create(model="fake-embed", input=texts)
    assert [d.index for d in result.data] == list(range(10))
    assert [len(call[1]) for call in fake.embed_calls] == [4, 4, 2]  # max_batch_size 4
    one = await client.embeddings.create(model="fake-embed", input=texts[7])
    np.testing.assert_allclose(result.data[7].embedding, one.data[0].embedding, rtol=1e-6)


async def test_input_type_defaults_to_the_models_first_and_is_checked(
    client: openai.AsyncOpenAI, fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    await client.embeddings.create(model="fake-embed", input="x")
    await client.embeddings.create(
        model="fake-embed", input="x", extra_body={"input_type": "passage"}
    )
    assert [call[2] for call in fake.embed_calls] == ["query", "passage"]
    bad = await http.post(
        "/v1/embeddings", json={"model": "fake-embed", "input": "x", "input_type": "nope"}
    )
    assert_openai_error(bad, 400, param="input_type")


async def test_dimensions_truncates_and_renormalizes_on_a_matryoshka_model(
    client: openai.AsyncOpenAI,
) -> None:
    full = await client.embeddings.create(model="fake-embed", input="red apples grow")
    short = await client.embeddings.create(
        model="fake-embed", input="red apples grow", dimensions=3
    )
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (3,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    head = np.array(full.data[0].embedding[:3])
    np.testing.assert_allclose(vector, head / np.linalg.norm(head), rtol=1e-5)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-embed-fixed", "input": "x", "dimensions": 4}, "dimensions"),
        ({"model": "fake-embed", "input": "x", "dimensions": EMBED_DIMENSIONS + 1}, "dimensions"),
        ({"model": "fake-embed", "input": [1, 2, 3]}, "input"),
        ({"model": "fake-embed", "input": [[1, 2], [3]]}, "input"),
        ({"model": "fake-embed", "input": []}, "input"),
        ({"model": "fake-embed", "input": ["ok", "  "]}, "input"),
        ({"model": "fake-embed", "input": ["x"] * 2049}, "input"),
        ({"model": "fake-embed", "input": "word " * 40}, "input"),  # over max_input_tokens
        ({"model": "fake-embed-fixed", "input": "x", "input_type": "query"}, "input_type"),
        ({"model": "fake-embed", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "fake-chat", "input": "x"}, "model"),
    ],
)
async def test_bad_input_is_a_400_naming_the_parameter(
    http: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    assert_openai_error(await http.post("/v1/embeddings", json=body), 400, param=param)


async def test_same_size_dimensions_is_fine_on_any_model(client: openai.AsyncOpenAI) -> None:
    result = await client.embeddings.create(
        model="fake-embed-fixed", input="x", dimensions=EMBED_DIMENSIONS
    )
    assert len(result.data[0].embedding) == EMBED_DIMENSIONS


async def test_tokens_count_against_the_keys_tpm(http: httpx.AsyncClient) -> None:
    created = await new_key(http, tpm=20)
    user = sdk(http, created["key"])
    await user.embeddings.create(model="fake-embed", input=["one two three"] * 4)  # 20 tokens
    with pytest.raises(openai.RateLimitError):
        await user.embeddings.create(model="fake-embed", input="again")
    usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (20, 0)
