"""The layout of the gateway's keys in Redis, and the migration of data written under an
older one (run at start by every replica, and by ``gateway keys``).
"""

from __future__ import annotations

import re

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.state.redis import PREFIX, needs_store

#: The layout of the keys in Redis. 2: everything of one API key carries the key id as a
#: Redis Cluster hash tag (``gw:key:{id}``, ``gw:rl:{id}:requests``, ``gw:usage:{id}``).
LAYOUT = "2"
_LAYOUT_KEY = f"{PREFIX}layout"
_LAYOUT_1 = re.compile(r"^gw:(key|usage|rl):([^{}:]+)(:.*)?$")


@needs_store
async def migrate(redis: Redis) -> int:
    """Renames the data of an API key written before layout 2 (``gw:key:<id>`` and the
    like) to layout 2, keeping expiries; returns how many keys it renamed. Safe to run from
    several replicas at once; once done, it costs one ``GET``."""
    if await redis.get(_LAYOUT_KEY) == LAYOUT:
        return 0
    renamed = 0
    for kind in ("key", "usage", "rl"):
        async for name in redis.scan_iter(match=f"{PREFIX}{kind}:[^{{]*", count=1000):
            found = _LAYOUT_1.match(name)
            if found is None:
                continue
            _, key_id, rest = found.groups()
            try:
                renamed += int(
                    await redis.renamenx(name, f"{PREFIX}{kind}:{{{key_id}}}{rest or ''}")
                )
            except ResponseError:  # another replica renamed it meanwhile
                continue
    await redis.set(_LAYOUT_KEY, LAYOUT)
    return renamed
