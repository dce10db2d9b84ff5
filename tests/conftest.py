"""How the suite is spread over pytest-xdist's workers (``make test`` runs them with
``--dist loadgroup``): a module's tests stay on one worker, so a module-scoped fixture (a
stack of its own, a Redis Cluster) is built once; the modules that share a costly
session-scoped fixture are one group, so it is built once, not once per worker:
``tests/integration/conftest.py``'s ``stack`` (the real stack with every model) and
``tests/models/conftest.py``'s ``llm`` (the SmolLM2 weights)."""

from __future__ import annotations

import pytest

#: Session fixtures worth one worker's whole life, and the group of their users.
SHARED = {"stack": "the-shared-stack", "llm": "the-smollm2-weights"}


def _group(item: pytest.Item) -> str:
    definitions = getattr(item, "_fixtureinfo", None)
    used = definitions.name2fixturedefs if definitions is not None else {}
    for name, group in SHARED.items():
        if name in used and used[name][-1].scope == "session":
            return group
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seen: set[str] = set()
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
        if item.nodeid in seen:
            # schemathesis gives each API operation's test the same node id (the operation
            # is only in the name); xdist schedules by node id and would run one of them.
            item._nodeid = f"{item.nodeid.split('::')[0]}::{item.name}"  # type: ignore[attr-defined]
        seen.add(item.nodeid)
