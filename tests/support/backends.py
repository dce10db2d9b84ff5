"""Stand-ins for a model server that several test modules use: ``FakeBackend`` made slow,
or given a model without a context length."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gateway.backend import ModelInfo, Segment, TranscriptionOptions
from gateway.backend.fake import TOOLS_TEMPLATE, FakeBackend


@dataclass
class SlowTranscription(FakeBackend):
    """Takes ``delay_s`` before each transcription's first segment; tells when one starts,
    how many ran at once and how many were cancelled."""

    delay_s: float = 1.0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    most: int = 0
    cancelled: int = 0

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        self.started.set()
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            async for segment in super().transcribe(model, audio, options):
                yield segment
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


def long_model(fake: FakeBackend) -> str:
    """Adds a chat model whose config states no context length (only the store bounds its
    input) and returns its name."""
    fake.model_list.append(ModelInfo("fake-long", "chat", True, TOOLS_TEMPLATE))
    return "fake-long"
