"""The Lua scripts of the state layer, one file each in ``gateway/state/lua/`` (shipped in
the package), read once and registered with redis-py.

A store registers the scripts it runs with :func:`register` (redis-py's
``register_script``: the script runs by ``EVALSHA``, loaded again when Redis lost it) and
calls the result with ``keys=`` and ``args=``. What a script reads and returns is stated at
the top of its file.

A line ``--! include <name>`` in a script is replaced by the script ``<name>``, so scripts
share code without copies (the budget scripts share ``budget_common.lua``; a key's end of
request runs ``limits_finish.lua`` and ``budget_settle.lua`` in one script,
``finish_and_settle.lua``; includes nest). The keyword arguments of :func:`register` (its
constants) replace a bare name in the text (``HISTORY_S``) by its value, where the value is
Python's to decide.
"""

from __future__ import annotations

import functools
import importlib.resources
import re

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

_INCLUDE = re.compile(r"^--! include ([a-z_]+)$", re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of the script ``lua/<name>.lua``, its includes expanded (read once)."""
    text = importlib.resources.files("gateway.state").joinpath("lua", f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda found: source(found[1]).rstrip("\n"), text)


def register(redis: Redis, name: str, **constants: int | str) -> AsyncScript:
    """The script ``name`` registered with ``redis``; each of ``constants`` replaces its
    name in the text (a ``ValueError`` for one the script does not name)."""
    text = source(name)
    for constant, value in constants.items():
        if not re.search(rf"\b{constant}\b", text):
            raise ValueError(f"the script {name!r} does not use {constant}")
        text = re.sub(rf"\b{constant}\b", str(value), text)
    return redis.register_script(text)
