"""How many decoded files a replica holds: :class:`DecodeSlots`'s turns
(``GATEWAY_MAX_DECODES``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from gateway.errors import OverloadedError
from gateway.serving.audio._decoding import STT_RATE, decode_to_pcm

_P = ParamSpec("_P")
_T = TypeVar("_T")


class DecodeSlots:
    """The replica's turns at decoded audio: at most ``max_decodes`` jobs (an upload, a chat
    request's ``input_audio`` parts) hold decoded samples at once in this process, from
    their decoding (:func:`decode_to_pcm`, in a worker thread) until they give their turn
    back, once the model has transcribed them. Each holds at most its ``max_seconds`` of
    samples (64 KB a second at 16 kHz), so that is the replica's bound on them, whatever
    the number of requests. The others wait their turn in arrival order, at most
    ``max_wait_s`` and at most ``max_waiting`` of them; past either, 503 ``overloaded``
    with ``Retry-After``. Built once per process (the services); every path that decodes
    a client's file goes through it."""

    def __init__(self, max_decodes: int, max_wait_s: float, max_waiting: int) -> None:
        self.max_decodes = max_decodes
        self.max_wait_s = max_wait_s
        self.max_waiting = max_waiting
        self._free = max_decodes
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._hold_s = 1.0
        """Moving average of the time a turn is held, for ``Retry-After``."""

    @property
    def held(self) -> int:
        """Turns held now."""
        return self.max_decodes - self._free

    @property
    def waiting(self) -> int:
        return sum(not turn.done() for turn in self._waiting)

    async def turn(self) -> DecodeSlot:
        """A turn, once it is this caller's (503 ``overloaded`` when it does not come).
        Give it back with :meth:`DecodeSlot.release` (in a ``finally``)."""
        if self._free and not self._waiting:
            self._free -= 1
            return DecodeSlot(self)
        if self.waiting >= self.max_waiting:
            raise self._overloaded("queue_full")
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout(self.max_wait_s):
                await turn
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self._free_one()  # handed a turn as it left: it goes to the next one
            else:
                turn.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(turn)
            if isinstance(exc, TimeoutError):
                raise self._overloaded("wait_timeout") from None
            raise
        return DecodeSlot(self)

    def _given_back(self, held_s: float) -> None:
        self._hold_s += 0.2 * (held_s - self._hold_s)
        self._free_one()

    def _free_one(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _overloaded(self, reason: str) -> OverloadedError:
        waiting = self.waiting
        if reason == "queue_full":
            message = (
                f"The gateway is overloaded: {waiting} audio files are already waiting to "
                "be decoded. Try again later."
            )
        else:
            message = (
                f"The gateway is overloaded: this audio file waited {self.max_wait_s:g} s "
                "to be decoded. Try again later."
            )
        return OverloadedError(message, reason, (waiting + 1) / self.max_decodes * self._hold_s)


class DecodeSlot:
    """One turn of an :class:`DecodeSlots`: one job's decodes (and other CPU work on its
    samples), one after the other. The turn goes back to the decoder once its holder
    released it and its last thread ended: a thread cannot be stopped, and what it holds
    counts until it ends (a client that left in the middle of a decode frees nothing
    earlier)."""

    def __init__(self, decoder: DecodeSlots) -> None:
        self._decoder = decoder
        self._loop = asyncio.get_running_loop()
        self._since = time.monotonic()
        self._threads = 0
        self._released = self._returned = False

    async def decode(
        self, data: bytes, max_seconds: float, rate: int = STT_RATE
    ) -> npt.NDArray[np.float32]:
        """:func:`decode_to_pcm` in a worker thread."""
        return await self.run(decode_to_pcm, data, rate, max_seconds)

    async def run(self, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``work`` (CPU work on the samples of this turn: decoding them, finding speech in
        them) in a worker thread, counted in the turn until it ends."""
        if self._released:
            raise RuntimeError("this decode turn was given back")
        self._threads += 1
        running = asyncio.ensure_future(asyncio.to_thread(work, *args, **kwargs))
        running.add_done_callback(self._ended)
        return await asyncio.shield(running)

    def release(self) -> None:
        """Gives the turn back (from the event loop's thread; once is enough, more are
        nothing)."""
        self._released = True
        self._maybe_return()

    def release_soon(self) -> None:
        """:meth:`release` from any thread (a finalizer's)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.release)

    def _ended(self, running: asyncio.Future[Any]) -> None:
        self._threads -= 1
        self._maybe_return()
        if not running.cancelled():
            running.exception()  # retrieved: one whose caller left is not logged as lost

    def _maybe_return(self) -> None:
        if self._released and not self._threads and not self._returned:
            self._returned = True
            self._decoder._given_back(time.monotonic() - self._since)
