"""The input audio buffer and the audio a client sends: base64 pcm16 (24 kHz) or G.711
(8 kHz ``audio/pcmu``, ``audio/pcma``) decoded, resampled to what the VAD and the
transcription model take (16 kHz), kept until a turn is committed, and bounded."""

from __future__ import annotations

import base64
import binascii

import av
import numpy as np
import numpy.typing as npt

from gateway.serving.audio import PCM_RATE, STT_RATE
from gateway.serving.g711 import G711_RATE, G711Reader, Law
from gateway.serving.realtime.items import Bounds
from gateway.serving.realtime.protocol import ClientEventError

Audio = npt.NDArray[np.float32]

#: OpenAI refuses to commit less than 100 ms of audio.
MIN_COMMIT_MS = 100

_PCM_BYTES_PER_S = PCM_RATE * 2
#: Bytes of the client's pcm16 per sample kept (16 kHz): the buffer's size as it was sent.
_PCM_BYTES_PER_KEPT = _PCM_BYTES_PER_S // STT_RATE

#: Base64 characters decoded in one call (a multiple of 4: whole groups of 3 bytes).
_B64_PIECE = 64 * 1024


#: The session's input formats as G.711 laws (``audio/pcm`` is none).
LAWS: dict[str, Law] = {"audio/pcmu": "pcmu", "audio/pcma": "pcma"}


class ClientAudio:
    """The audio a client sends in one format, as the 24 kHz pcm16 the rest takes: G.711
    is decoded and resampled by one stateful reader, so that appends join smoothly."""

    def __init__(self, input_format: str) -> None:
        law = LAWS.get(input_format)
        self.format = input_format
        self._reader = G711Reader(law) if law is not None else None

    def pcm16_bytes(self, base64_chars: int) -> int:
        """How many bytes of 24 kHz pcm16 an append of ``base64_chars`` becomes (at most):
        what the bounds are checked against before anything is decoded, since a G.711
        byte becomes 6 (3 samples of 2 bytes)."""
        sent = base64_chars * 3 // 4
        return sent * _PCM_BYTES_PER_S // G711_RATE if self._reader is not None else sent

    def pcm16(self, value: str, param: str) -> bytes:
        """An append's base64 as 24 kHz pcm16 (CPU work: run it in a thread). The caller
        bounds it first, by :meth:`pcm16_bytes`."""
        data = decode_b64(value, param, whole_samples=self._reader is None)
        if self._reader is None:
            return data
        return b"".join(  # a second of G.711 at a time: bounded intermediates
            self._reader.read(data[start : start + G711_RATE])
            for start in range(0, len(data), G711_RATE)
        )


class InputAudio:
    """The input audio buffer: 24 kHz pcm16 in, 16 kHz float kept (what VAD and the
    transcription model take). Positions count 16 kHz samples of all the audio the session
    was sent, as the VAD's do, so their times agree."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=STT_RATE)
        self._pts = 0
        self.parts: list[Audio] = []
        self.start = 0  # where the buffer starts
        self.size = 0  # samples kept

    def append(self, pcm: bytes) -> Audio:
        """Keeps ``pcm`` and returns it as 16 kHz audio (CPU work: run it in a thread)."""
        samples = np.frombuffer(pcm, dtype="<i2")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = PCM_RATE
        frame.pts = self._pts
        self._pts += samples.size
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        audio = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
        self.parts.append(audio)
        self.size += audio.size
        return audio

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def start_ms(self) -> int:
        return self.start * 1000 // STT_RATE

    @property
    def end_ms(self) -> int:
        return self.end * 1000 // STT_RATE

    @property
    def pcm_bytes(self) -> int:
        """What the buffered audio was as the client sent it."""
        return self.size * _PCM_BYTES_PER_KEPT

    def audio(self, from_ms: int | None = None) -> Audio:
        """A copy of the buffered audio from ``from_ms`` (CPU work for a long buffer)."""
        whole = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)
        skip = max(0, (from_ms or 0) * STT_RATE // 1000 - self.start)
        return whole[skip:]

    def take(self, from_ms: int | None = None) -> Audio:
        """The buffered audio (from ``from_ms``), and the buffer emptied."""
        audio = self.audio(from_ms)
        self.clear()
        return audio

    def clear(self) -> None:
        self.start = self.end
        self.parts = []
        self.size = 0

    def drop_before(self, at_ms: int) -> None:
        """Forgets the audio before ``at_ms``: silence the VAD has judged, which no turn will
        ever include, so a microphone left open does not fill the buffer."""
        drop = min(self.size, at_ms * STT_RATE // 1000 - self.start)
        if drop <= 0:
            return
        self.start += drop
        self.size -= drop
        while drop:
            head = self.parts[0]
            if head.size > drop:
                self.parts[0] = head[drop:]
                break
            self.parts.pop(0)
            drop -= head.size


def decode_b64(value: object, param: str, whole_samples: bool = True) -> bytes:
    """Base64 audio (pcm16 when ``whole_samples``: an even number of bytes), decoded a
    piece at a time: one call on megabytes holds the GIL for tens of milliseconds, which
    would stall the event loop even from a worker thread."""
    text = str(value)
    last = len(text) - _B64_PIECE
    try:
        pieces = []
        for start in range(0, len(text), _B64_PIECE):
            piece = text[start : start + _B64_PIECE]
            if start < last and piece.endswith("="):  # padding only at the very end
                raise ValueError(piece)
            pieces.append(base64.b64decode(piece, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ClientEventError(
            f"{param} is not valid base64.", param=param, code="invalid_audio"
        ) from exc
    data = b"".join(pieces)
    if whole_samples and len(data) % 2:
        raise ClientEventError(
            f"{param} must hold whole 16-bit samples (an even number of bytes).",
            param=param,
            code="invalid_audio",
        )
    return data


def check_seconds(pcm_bytes: int, bounds: Bounds, param: str) -> None:
    """Refuses a turn of more than :attr:`Bounds.audio_seconds` of pcm16."""
    seconds = pcm_bytes / _PCM_BYTES_PER_S
    if seconds > bounds.audio_seconds:
        raise ClientEventError(
            f"The audio would be {seconds:,.1f} seconds long; at most "
            f"{bounds.audio_seconds:g} are taken in one turn (GATEWAY_MAX_AUDIO_SECONDS).",
            param=param,
            code="audio_too_long",
        )


def pcm_to_stt(pcm: bytes) -> Audio:
    buffer = InputAudio()
    buffer.append(pcm)
    return buffer.take()
