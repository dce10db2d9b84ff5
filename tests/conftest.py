"""How the suite is spread over pytest-xdist's workers (``make test`` runs them with
``--dist loadgroup``): a module's tests stay on one worker, so a module-scoped fixture (a
stack of its own, a Redis Cluster) is built once; the modules that share a costly
session-scoped fixture are one group, so it is built once, not once per worker:
``tests/integration/conftest.py``'s ``stack`` (the real stack with every model) and
``tests/models/conftest.py``'s ``llm`` (the SmolLM2 weights).

The groups are handed out longest first (see the end of the file): integration and model
modules, and unit modules marked ``pytestmark = pytest.mark.long``, then the other unit
modules, which fill the workers' ends."""

from __future__ import annotations

import functools
import ssl

import pytest

# Every httpx client (and so every openai SDK client) builds an SSL context and reads the CA
# bundle into it, about 20 ms of CPU, though every server of the tests speaks plain HTTP:
# the thousands the suite makes (a stack's readiness polled every 0.25 s, a client per
# call) cost a minute of CPU on 2 cores (py-spy: a third of the test processes' time).
# Contexts made alike are one shared context here (they are not changed after; nothing in
# the tests speaks TLS).
ssl.create_default_context = functools.cache(ssl.create_default_context)

#: Session fixtures worth one worker's whole life, and the group of their users.
SHARED = {"stack": "the-shared-stack", "llm": "the-smollm2-weights"}


def _group(item: pytest.Item) -> str:
    definitions = getattr(item, "_fixtureinfo", None)
    used = definitions.name2fixturedefs if definitions is not None else {}
    for name, group in SHARED.items():
        if name in used and used[name][-1].scope == "session":
            return group
    return item.nodeid.split("::")[0]


def _long(group: list[pytest.Item]) -> bool:
    """Integration tests (a stack, Triton, a browser), a model's own weights, or a test
    marked ``long``: the groups that take many seconds, where a unit module takes one or two."""
    return any(
        item.nodeid.startswith(("tests/integration/", "tests/models/"))
        or item.get_closest_marker("long")
        for item in group
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group(item)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    # xdist hands the groups out in this order, each to the next free worker, when run
    # with --no-loadscope-reorder (as ``make test`` does; without it, xdist orders the
    # groups by their number of tests alone, and a module of two tests that starts two
    # Tritons ran last, alone, for 15 s). The long ones first, the largest first within
    # each kind (the number of tests stands in for the time), so the unit modules fill the
    # workers' ends.
    ordered = sorted(groups.values(), key=lambda group: (not _long(group), -len(group)))
    items[:] = [item for group in ordered for item in group]


def pytest_sessionfinish() -> None:
    """The module stacks left stopping (``GatewayProcess.stop_soon``) are waited for: none
    outlives the worker."""
    from tests.support.stack import wait_stopped  # here: the controller starts no stack

    wait_stopped()
