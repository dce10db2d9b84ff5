"""A run's streamed chunks close the generations they hold however early they are closed:
``GenerationRun.stream`` starts them (awaiting each first chunk) before returning, so
closing what it returned, even before reading a chunk, must stop them at once."""

from __future__ import annotations

import pytest

from gateway.backend import SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.serving import generation
from gateway.state.limits import Meter


@pytest.mark.parametrize("n", [1, 3])
async def test_closing_the_chunks_before_reading_one_stops_every_generation(n: int) -> None:
    fake = FakeBackend()
    fake.token_delay_s = 0.05  # long enough to be still running when closed
    run = await generation.reserve_run(
        fake, "fake-chat", Meter(), ["Hi"], SamplingOptions(max_tokens=200), n=n
    )
    pieces = await run.stream()
    assert len(fake.calls) == n and not any(call.cancelled for call in fake.calls)
    await pieces.aclose()  # never iterated
    assert all(call.cancelled for call in fake.calls)
