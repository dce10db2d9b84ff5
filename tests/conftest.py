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


def _long(item: pytest.Item) -> bool:
    """An integration test (a stack, Triton, a browser), a model's own weights, or a test
    marked ``long``: the groups that take tens of seconds, where a unit module takes a few."""
    return item.nodeid.startswith(("tests/integration/", "tests/models/")) or bool(
        item.get_closest_marker("long")
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group(item)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    # xdist hands the groups out in this order (``make test`` passes
    # --no-loadscope-reorder), each to the next free worker: the long ones first, so the
    # unit modules fill the workers' ends instead of one stack's tests running alone
    # at the end (a module of two tests that starts two Tritons was last, for 15 s).
    ordered = sorted(groups.values(), key=lambda group: (not _long(group[0]), -len(group)))
    items[:] = [item for group in ordered for item in group]
