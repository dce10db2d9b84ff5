"""The SmolLM2 weights, loaded once for the tests that call llama.cpp on them in process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.smollm2 import weights_path


@pytest.fixture(scope="session")
def llm() -> Iterator[Any]:
    """smollm2's weights with a context of 512 tokens (``llm.model`` is what a batch engine
    builds its own contexts on)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model = llama_cpp.Llama(model_path=weights_path(), n_ctx=512, n_batch=64, verbose=False)
    yield model
    model.close()
