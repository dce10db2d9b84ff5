"""Speech out: :class:`StreamEncoder` turns 16-bit mono PCM pieces (one per synthesized
sentence) into the bytes of an OpenAI speech ``response_format``, piece by piece, so the
first audio can leave before the whole text is synthesized. Its methods do CPU work: call
them in a thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import numpy.typing as npt

#: OpenAI's ``pcm`` format: raw 24 kHz 16-bit mono little-endian.
PCM_RATE = 24_000


@dataclass(frozen=True)
class AudioFormat:
    content_type: str
    container: str | None  # None: raw samples, no container
    codec: str
    sample_fmt: str
    rate: int | None  # None: keep the input rate
    bit_rate: int | None = None


FORMATS: dict[str, AudioFormat] = {
    "mp3": AudioFormat("audio/mpeg", "mp3", "libmp3lame", "s16p", None, 64_000),
    "opus": AudioFormat("audio/ogg", "ogg", "libopus", "s16", 48_000, 32_000),
    "aac": AudioFormat("audio/aac", "adts", "aac", "fltp", None, 64_000),
    "flac": AudioFormat("audio/flac", "flac", "flac", "s16", None),
    "wav": AudioFormat("audio/wav", "wav", "pcm_s16le", "s16", None),
    "pcm": AudioFormat("audio/pcm", None, "pcm_s16le", "s16", PCM_RATE),
}


class _Sink:
    """A write-only, non-seekable file for the muxer: what it writes is taken in pieces."""

    def __init__(self) -> None:
        self.pending = bytearray()

    def write(self, data: bytes) -> int:
        self.pending += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data


class StreamEncoder:
    """Encodes mono int16 PCM at ``input_rate`` into ``fmt``, incrementally."""

    def __init__(self, fmt: str, input_rate: int) -> None:
        self.format = FORMATS[fmt]
        self.input_rate = input_rate
        out_rate = self.format.rate or input_rate
        self.resampler = av.AudioResampler(
            format=self.format.sample_fmt, layout="mono", rate=out_rate
        )
        self.sink = _Sink()
        self.container: Any = None
        self.stream: Any = None
        self.pts = 0
        if self.format.container is not None:
            # A small I/O buffer, so each sentence's bytes reach the sink at once.
            # Ogg pages are closed every 100 ms instead of every second, for the same reason.
            self.container = av.open(
                self.sink,
                mode="w",
                format=self.format.container,
                buffer_size=1024,
                options={"page_duration": "100000"} if self.format.container == "ogg" else {},
            )
            self.stream = self.container.add_stream(self.format.codec, rate=out_rate)
            self.stream.layout = "mono"
            self.stream.format = self.format.sample_fmt
            if self.format.bit_rate:
                self.stream.bit_rate = self.format.bit_rate

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """Encodes one piece of int16 samples; returns the bytes ready so far."""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = self.input_rate
        frame.pts = self.pts
        self.pts += frame.samples
        return self._write(self.resampler.resample(frame))

    def finish(self) -> bytes:
        """Flushes the resampler, the encoder and the container; returns the last bytes."""
        data = self._write(self.resampler.resample(None))
        if self.container is not None:
            for packet in self.stream.encode(None):
                self.container.mux(packet)
            self.container.close()
        return data + self.sink.take()

    def _write(self, frames: list[Any]) -> bytes:
        if self.container is None:
            return b"".join(bytes(f.to_ndarray().astype("<i2").tobytes()) for f in frames)
        for frame in frames:
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        return self.sink.take()
