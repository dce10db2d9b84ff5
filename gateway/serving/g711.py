"""G.711, the audio phone networks carry: ``audio/pcmu`` (μ-law) and ``audio/pcma`` (A-law),
8 kHz mono, one byte per sample.

Built on PyAV, FFmpeg's ``pcm_mulaw`` / ``pcm_alaw`` codecs and ``av.AudioResampler``
(already a dependency, as for the other audio formats) rather than hand-written tables: they
do the whole job, and the resampler is the one the rest of the audio path uses. The decoder
gives exactly the values of ITU-T G.711's tables for all 256 codes. The encoder puts its
decision values midway between G.711's levels, on the sample's top 14 (μ-law) or 13 (A-law)
bits, so it differs from the ITU reference encoder only on samples at a decision value, by
one level, within the quantisation error. The resampler keeps its filter's state, so audio
streamed in pieces joins without clicks, and it compensates its own delay (no shift in time).

- :func:`decode` / :func:`encode`: whole buffers, G.711 bytes to and from 8 kHz pcm16.
- :class:`G711Writer`: the speech path's pcm16 (24 kHz) in pieces, G.711 out.
- :class:`G711Reader`: a client's G.711 in pieces, pcm16 at another rate (24 kHz) out.

All of it is CPU work, though light (microseconds for a 20 ms packet): a long buffer belongs
in a worker thread.
"""

from __future__ import annotations

from typing import Literal

import av
import numpy as np
import numpy.typing as npt

Law = Literal["pcmu", "pcma"]

#: G.711's sample rate.
G711_RATE = 8000

_CODECS: dict[str, str] = {"pcmu": "pcm_mulaw", "pcma": "pcm_alaw"}

Samples = npt.NDArray[np.int16]


def _codec(law: Law) -> str:
    try:
        return _CODECS[law]
    except KeyError:
        raise ValueError(f"Unknown G.711 law {law!r}; expected 'pcmu' or 'pcma'.") from None


def _samples(pcm16: bytes) -> Samples:
    """Little-endian pcm16 bytes as samples; an odd length is refused."""
    if len(pcm16) % 2:
        raise ValueError("pcm16 audio must hold whole 16-bit samples (an even number of bytes).")
    return np.frombuffer(pcm16, dtype="<i2").astype(np.int16, copy=False)


def _frame(samples: Samples, rate: int, pts: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = rate
    frame.pts = pts
    return frame


def _context(law: Law, mode: Literal["r", "w"]) -> av.AudioCodecContext:
    return av.Codec(_codec(law), mode).create("audio")


def _encoder(law: Law) -> av.AudioCodecContext:
    ctx = _context(law, "w")
    ctx.sample_rate = G711_RATE
    ctx.layout = "mono"
    ctx.format = "s16"
    return ctx


def decode(data: bytes, law: Law) -> Samples:
    """G.711 bytes to 8 kHz pcm16 samples, one per byte (every byte is a valid code)."""
    ctx = _context(law, "r")
    if not data:
        return np.zeros(0, dtype=np.int16)
    ctx.sample_rate = G711_RATE
    ctx.layout = "mono"
    out = [frame.to_ndarray().reshape(-1) for frame in ctx.decode(av.Packet(data))]
    return np.concatenate(out, dtype=np.int16)


def encode(samples: Samples, law: Law) -> bytes:
    """8 kHz pcm16 samples to G.711 bytes, one per sample."""
    ctx = _encoder(law)
    if not samples.size:
        return b""
    packets = [*ctx.encode(_frame(samples.reshape(-1), G711_RATE, 0)), *ctx.encode(None)]
    return b"".join(bytes(packet) for packet in packets)


def to_pcm16(data: bytes, law: Law) -> bytes:
    """G.711 bytes to 8 kHz pcm16 little-endian bytes (two per G.711 byte)."""
    return decode(data, law).astype("<i2", copy=False).tobytes()


class _Resampler:
    """pcm16 at ``rate_in`` to pcm16 at ``rate_out``, piece by piece, with one filter state
    across the pieces (consecutive timestamps), so they join as one signal would."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        if rate_in <= 0:
            raise ValueError(f"The sample rate must be positive, not {rate_in}.")
        self._rate_in = rate_in
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate_out)
        self._pts = 0

    def push(self, samples: Samples) -> Samples:
        if not samples.size:
            return np.zeros(0, dtype=np.int16)
        frame = _frame(samples, self._rate_in, self._pts)
        self._pts += samples.size
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> Samples:
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> Samples:
        out = [frame.to_ndarray().reshape(-1) for frame in frames]
        if not out:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(out, dtype=np.int16)


class G711Writer:
    """Streaming: 24 kHz pcm16 bytes in (pieces of any even length, as the speech path yields
    them), G.711 8 kHz bytes out; a stateful resampler so the pieces join without clicks.

    The resampler holds back a few milliseconds (its filter's delay): :meth:`flush` gives
    them at the end. One second in gives :data:`G711_RATE` bytes out, give or take a few.
    """

    def __init__(self, law: Law, rate_in: int = 24000) -> None:
        self._encoder = _encoder(law)
        self._resampler = _Resampler(rate_in, G711_RATE)
        self._pts = 0

    def write(self, pcm16: bytes) -> bytes:
        """The G.711 of ``pcm16`` ready so far; ValueError on an odd number of bytes."""
        return self._encode(self._resampler.push(_samples(pcm16)))

    def flush(self) -> bytes:
        """The rest, at the end of the audio; the writer takes no more after it."""
        return self._encode(self._resampler.flush())

    def _encode(self, samples: Samples) -> bytes:
        if not samples.size:
            return b""
        frame = _frame(samples, G711_RATE, self._pts)
        self._pts += samples.size
        return b"".join(bytes(packet) for packet in self._encoder.encode(frame))


class G711Reader:
    """Streaming, the other way: G.711 8 kHz bytes in (pieces of any length, as a client
    appends them), pcm16 little-endian bytes at ``rate_out`` out, with one resampler state
    so the pieces join without clicks. :meth:`flush` gives what the filter held back."""

    def __init__(self, law: Law, rate_out: int = 24000) -> None:
        self._law = law
        _codec(law)  # an unknown law is refused here, not at the first piece
        self._resampler = _Resampler(G711_RATE, rate_out)

    def read(self, data: bytes) -> bytes:
        """The pcm16 of ``data`` ready so far."""
        return self._resampler.push(decode(data, self._law)).astype("<i2").tobytes()

    def flush(self) -> bytes:
        """The rest, at the end of the audio; the reader takes no more after it."""
        return self._resampler.flush().astype("<i2").tobytes()
