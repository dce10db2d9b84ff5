"""A tone alphabet shared by ``custom_tts`` and ``custom_stt``, so speech round-trips exactly.

``custom_tts`` "speaks" a text as tones: lowercase, keep ``a``-``z`` and spaces, and play
each character as a 100 ms sine (amplitude 0.5) at its own frequency, then 30 ms of silence.
``custom_stt`` finds the tones by their energy, measures each one's frequency with an FFT
and takes the nearest character. Frequencies are 60 Hz apart, far more than resampling or a
lossy codec moves them, and all below 4 kHz, so 8 kHz audio still carries them.
"""

from __future__ import annotations

import string

import numpy as np

TONE_S = 0.100
GAP_S = 0.030
AMPLITUDE = 0.5
RAMP_S = 0.005
"""Each tone fades in and out over this long (no clicks at its edges)."""

FREQUENCIES: dict[str, float] = {
    " ": 380.0,
    **{letter: 500.0 + 60.0 * i for i, letter in enumerate(string.ascii_lowercase)},
}


def speakable(text: str) -> str:
    """What ``custom_tts`` speaks of a text: lowercase letters and spaces, other characters
    dropped, runs of spaces made one."""
    kept = "".join(c for c in text.lower() if c in FREQUENCIES)
    return " ".join(kept.split())


def synthesize(text: str, sample_rate: int) -> np.ndarray:
    """The tones of ``speakable(text)`` as float32 mono samples."""
    tone_n = round(TONE_S * sample_rate)
    gap = np.zeros(round(GAP_S * sample_rate), dtype=np.float32)
    t = np.arange(tone_n) / sample_rate
    ramp_n = max(1, round(RAMP_S * sample_rate))
    envelope = np.ones(tone_n)
    fade = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp_n) / ramp_n)
    envelope[:ramp_n], envelope[-ramp_n:] = fade, fade[::-1]
    pieces = []
    for char in speakable(text):
        tone = AMPLITUDE * envelope * np.sin(2 * np.pi * FREQUENCIES[char] * t)
        pieces += [tone.astype(np.float32), gap]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def segments(samples: np.ndarray, sample_rate: int) -> list[tuple[int, int]]:
    """``(start, end)`` sample ranges of the tones: runs of 5 ms frames whose RMS exceeds a
    fifth of the loudest frame's, bridged over dips under 10 ms, at least 40 ms long."""
    frame = max(1, round(0.005 * sample_rate))
    n = len(samples) // frame
    if n == 0:
        return []
    rms = np.sqrt(np.mean(samples[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1))
    if rms.max() < 1e-3:
        return []
    active = rms > 0.2 * rms.max()
    runs: list[list[int]] = []
    for i, on in enumerate(active):
        if not on:
            continue
        if runs and i - runs[-1][1] <= 2:  # a dip of one frame inside a tone
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a * frame, b * frame) for a, b in runs if (b - a) * frame >= 0.040 * sample_rate]


def transcribe(samples: np.ndarray, sample_rate: int) -> str:
    """Reads tones back to text."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    letters = list(FREQUENCIES)
    frequencies = np.array([FREQUENCIES[c] for c in letters])
    text = []
    for start, end in segments(samples, sample_rate):
        margin = (end - start) // 5  # the steady middle of the tone
        piece = samples[start + margin : end - margin]
        size = 1 << max(14, int(np.ceil(np.log2(len(piece) * 4))))
        spectrum = np.abs(np.fft.rfft(piece * np.hanning(len(piece)), n=size))
        peak = float(np.argmax(spectrum)) * sample_rate / size
        text.append(letters[int(np.argmin(np.abs(frequencies - peak)))])
    return " ".join("".join(text).split())
