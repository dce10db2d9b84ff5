"""Tool-call parsers: they read the calls a model writes into its text, as it streams.

A chat model's config names its format (``tool_call_parser: hermes``, vLLM's names), and
:data:`PARSERS` maps that name to a :class:`~.base.ToolParser` class: ``hermes``
(:mod:`.hermes`). The parsers of :mod:`.forced` are not in the table: no config names them,
the tools module uses them for the calls it forces. How a parser works (``feed``,
``finish``, ``max_calls``) is in :mod:`.base`; :mod:`.call_reader` reads a call written as
a JSON object.

Adding a format is adding one module here with a ``ToolParser`` subclass, and adding it to
:data:`PARSERS` under the name vLLM gives it (tests: ``tests/unit/test_tool_parsers.py``;
``tests/unit/test_registries.py`` fails for a parser left out of the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.serving.tool_parsers.base import (
    ParsedCall,
    ParserDelta,
    ToolCallDelta,
    ToolParser,
    assemble,
    new_call_id,
)
from gateway.serving.tool_parsers.call_reader import CallReader
from gateway.serving.tool_parsers.hermes import HermesParser

__all__ = [
    "PARSERS",
    "CallReader",
    "ParsedCall",
    "ParserDelta",
    "ToolCallDelta",
    "ToolParser",
    "assemble",
    "get_parser",
    "new_call_id",
    "parser_names",
]

#: The formats a model's ``tool_call_parser`` may name, by that name.
PARSERS: Final[Mapping[str, type[ToolParser]]] = {
    "hermes": HermesParser,
}


def get_parser(name: str) -> type[ToolParser] | None:
    """The parser a config names, None for a name not in :data:`PARSERS`."""
    return PARSERS.get(name)


def parser_names() -> list[str]:
    """The names a config may give, sorted (for the error that lists them)."""
    return sorted(PARSERS)
