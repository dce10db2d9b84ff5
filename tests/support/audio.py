"""Audio as the tests make and read it: pcm16 silence and WAV files (24 kHz, OpenAI's
``pcm``), a stereo tone encoded as a user's recording would be, and encoded audio decoded
back to samples."""

from __future__ import annotations

import io
import wave

import av
import numpy as np


def silence(seconds: float, rate: int = 24_000) -> bytes:
    """``seconds`` of pcm16 silence."""
    return bytes(int(rate * seconds) * 2)


def wav_bytes(pcm: bytes, rate: int = 24_000) -> bytes:
    """24 kHz pcm16 (OpenAI's ``pcm``) as a WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def tone_file(seconds: float, fmt: str = "wav", rate: int = 44_100) -> bytes:
    """A stereo tone encoded with PyAV, as a user's recording would be."""
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        codec = {"wav": "pcm_s16le", "mp3": "libmp3lame", "ogg": "libopus"}[fmt]
        stream = container.add_stream(codec, rate=48_000 if fmt == "ogg" else rate)
        stream.layout = "stereo"
        samples = (np.sin(np.arange(int(seconds * stream.rate)) / 10) * 8000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(
            np.stack([samples, samples]).reshape(1, -1), format="s16", layout="stereo"
        )
        frame.sample_rate = stream.rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Samples (mono, float) and rate of encoded audio, decoded back with PyAV."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768, 24_000
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        samples = np.concatenate(frames).astype(np.float32)
        if np.abs(samples).max() > 2:  # integer formats
            samples /= 32768
        return samples, stream.rate
