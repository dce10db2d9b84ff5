"""Reasoning parsers: they split a reasoning model's text into its reasoning and its answer,
as it streams.

A chat model's config names its format (``reasoning_parser: deepseek_r1``, vLLM's names),
and :data:`PARSERS` maps that name to a :class:`~.base.ReasoningParser` class:
``deepseek_r1`` and ``qwen3`` (:mod:`.think`). How a parser works (``feed``, ``finish``,
``content_at``) is in :mod:`.base`.

Adding a format is adding one module here with a ``ReasoningParser`` subclass (its ``end``
marker, ``_step``, ``finish``), and adding it to :data:`PARSERS` under the name vLLM gives
it (tests: ``tests/unit/test_reasoning.py``; ``tests/unit/test_registries.py``
fails for a parser left out of the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.serving.reasoning_parsers.base import (
    ReasoningDelta,
    ReasoningParser,
    ReasoningTokens,
    split,
)
from gateway.serving.reasoning_parsers.think import DeepSeekR1, Qwen3

__all__ = [
    "PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningTokens",
    "get_parser",
    "parser_names",
    "split",
]

#: The formats a model's ``reasoning_parser`` may name, by that name.
PARSERS: Final[Mapping[str, type[ReasoningParser]]] = {
    "deepseek_r1": DeepSeekR1,
    "qwen3": Qwen3,
}


def get_parser(name: str) -> type[ReasoningParser] | None:
    """The parser a config names, None for a name not in :data:`PARSERS`."""
    return PARSERS.get(name)


def parser_names() -> list[str]:
    """The names a config may give, sorted (for the error that lists them)."""
    return sorted(PARSERS)
