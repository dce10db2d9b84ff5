"""G.711 (``audio/pcmu``, ``audio/pcma``): the decoder against ITU-T G.711's tables, the
encoder within its quantisation error, and the streaming writer and reader: audio written in
uneven pieces comes out as one signal would, in time and at the right pitch."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from gateway.serving.g711 import G711_RATE, G711Reader, G711Writer, Law, decode, encode, to_pcm16

LAWS: tuple[Law, ...] = ("pcmu", "pcma")

#: The largest distance between two neighbouring G.711 levels in 16-bit units (the top
#: segment of either law): a sample moved by a rounding near a decision value moves by this.
TOP_STEP = 1024


@pytest.fixture(scope="module")
def audioop() -> ModuleType:
    """Python's own G.711 (deprecated, still in 3.11), the oracle."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module: ModuleType = pytest.importorskip("audioop")
    return module


def _reference(audioop: ModuleType, law: Law) -> tuple[Callable[..., bytes], ...]:
    if law == "pcmu":
        return audioop.lin2ulaw, audioop.ulaw2lin
    return audioop.lin2alaw, audioop.alaw2lin


def _tone(
    rate: int, hz: float = 440.0, seconds: float = 1.0, amplitude: float = 16000.0
) -> npt.NDArray[np.float64]:
    t = np.arange(round(rate * seconds), dtype=np.float64) / rate
    return np.asarray(amplitude * np.sin(2 * np.pi * hz * t), dtype=np.float64)


def _snr_db(signal: npt.NDArray[np.float64], got: npt.NDArray[np.float64]) -> float:
    noise = got - signal
    return float(10 * np.log10(np.mean(signal**2) / np.mean(noise**2)))


def _uneven(data: bytes, unit: int, seed: int = 7) -> Iterator[bytes]:
    """``data`` in pieces of random sizes (whole ``unit``s, a few of them empty)."""
    rng = np.random.default_rng(seed)
    at = 0
    while at < len(data):
        size = int(rng.integers(0, 700)) * unit
        yield data[at : at + size]
        at += size


def _peak_hz(samples: npt.NDArray[np.int16], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64)))
    return float(np.argmax(spectrum) * rate / samples.size)


# The values ITU-T G.711 gives these codes (Table 2a, μ-law; Table 1a, A-law), in 16-bit
# units: μ-law's 14-bit levels times 4, A-law's 13-bit levels times 8.
@pytest.mark.parametrize(
    ("law", "code", "value"),
    [
        ("pcmu", 0xFF, 0),
        ("pcmu", 0x7F, 0),
        ("pcmu", 0x00, -32124),
        ("pcmu", 0x80, 32124),
        ("pcmu", 0xFE, 8),
        ("pcmu", 0x7E, -8),
        ("pcma", 0xD5, 8),
        ("pcma", 0x55, -8),
        ("pcma", 0x2A, -32256),
        ("pcma", 0xAA, 32256),
    ],
)
def test_codes_decode_to_the_standards_values(law: Law, code: int, value: int) -> None:
    assert decode(bytes([code]), law).tolist() == [value]


@pytest.mark.parametrize("law", LAWS)
def test_every_code_decodes_as_the_reference_does(audioop: ModuleType, law: Law) -> None:
    codes = bytes(range(256))
    _, to_linear = _reference(audioop, law)
    expected = np.frombuffer(to_linear(codes, 2), dtype="<i2")
    got = decode(codes, law)
    assert got.dtype == np.int16 and got.size == 256
    np.testing.assert_array_equal(got, expected)
    assert to_pcm16(codes, law) == expected.tobytes()


@pytest.mark.parametrize("law", LAWS)
def test_every_sample_encodes_to_the_reference_code_or_its_neighbour(
    audioop: ModuleType, law: Law
) -> None:
    """Encoders may round differently exactly at a decision value (the standard quantises
    14 or 13 bits, not 16): never by more than one level, never with more than the dropped
    bits' worth of extra error."""
    samples = np.arange(-32768, 32768, dtype=np.int16)
    from_linear, to_linear = _reference(audioop, law)
    codes = encode(samples, law)
    assert len(codes) == samples.size
    got = decode(codes, law).astype(np.int64)
    expected = np.frombuffer(to_linear(from_linear(samples.tobytes(), 2), 2), dtype="<i2")
    levels = np.unique(decode(bytes(range(256)), law))
    apart = np.abs(np.searchsorted(levels, got) - np.searchsorted(levels, expected))
    assert apart.max() <= 1
    dropped = 4 if law == "pcmu" else 8  # 16-bit units below the standard's 14 / 13 bits
    error, reference_error = np.abs(got - samples), np.abs(expected - samples)
    assert (error <= reference_error + dropped).all()
    # Within half a step of the sample, or of the loudest level for a louder sample.
    clipped = np.clip(samples, -levels.max(), levels.max())
    assert np.abs(got - clipped).max() <= TOP_STEP // 2 + dropped


@pytest.mark.parametrize(
    ("law", "sample", "code"),
    [
        ("pcmu", 0, 0xFF),
        ("pcmu", 32767, 0x80),
        ("pcmu", -32768, 0x00),
        ("pcma", 0, 0xD5),
        ("pcma", 32767, 0xAA),
        ("pcma", -32768, 0x2A),
    ],
)
def test_silence_and_full_scale_encode_to_the_standards_codes(
    law: Law, sample: int, code: int
) -> None:
    assert encode(np.array([sample], dtype=np.int16), law) == bytes([code])


@pytest.mark.parametrize("law", LAWS)
def test_a_loud_tone_survives_the_round_trip(law: Law) -> None:
    tone = _tone(G711_RATE)
    codes = encode(tone.astype(np.int16), law)
    assert len(codes) == G711_RATE
    assert _snr_db(tone, decode(codes, law).astype(np.float64)) > 35


@pytest.mark.parametrize("law", LAWS)
def test_nothing_in_nothing_out(law: Law) -> None:
    assert decode(b"", law).size == 0
    assert encode(np.zeros(0, dtype=np.int16), law) == b""
    writer = G711Writer(law)
    assert writer.write(b"") == b""
    assert writer.flush() == b""


@pytest.mark.parametrize("law", LAWS)
def test_speech_written_in_uneven_pieces_comes_out_as_one_tone(law: Law) -> None:
    tone = _tone(24000)
    pcm = tone.astype("<i2").tobytes()
    writer = G711Writer(law)
    pieces = [writer.write(piece) for piece in _uneven(pcm, 2)]
    streamed = b"".join([*pieces, writer.flush()])
    assert abs(len(streamed) - G711_RATE) <= 4  # one byte per 8 kHz sample

    whole_writer = G711Writer(law)
    whole = whole_writer.write(pcm) + whole_writer.flush()
    assert abs(len(whole) - len(streamed)) <= 2
    heard, expected = decode(streamed, law), decode(whole, law)
    common = min(heard.size, expected.size)
    # No clicks at the joins: a resampler restarted per piece is off by tens of thousands.
    assert np.abs(heard[:common].astype(int) - expected[:common]).max() <= TOP_STEP

    assert _peak_hz(heard, G711_RATE) == pytest.approx(440, abs=2)
    # In time with the input (no delay, no gap): the same tone sampled at 8 kHz.
    ideal = _tone(G711_RATE)[: heard.size]
    assert _snr_db(ideal[100:-100], heard[100:-100].astype(np.float64)) > 30


@pytest.mark.parametrize("law", LAWS)
def test_phone_audio_read_in_uneven_pieces_comes_out_as_one_tone(law: Law) -> None:
    codes = encode(_tone(G711_RATE).astype(np.int16), law)
    reader = G711Reader(law, rate_out=24000)
    pieces = [reader.read(piece) for piece in _uneven(codes, 1)]
    pcm = np.frombuffer(b"".join([*pieces, reader.flush()]), dtype="<i2")
    assert abs(pcm.size - 24000) <= 6

    whole_reader = G711Reader(law, rate_out=24000)
    whole = np.frombuffer(whole_reader.read(codes) + whole_reader.flush(), dtype="<i2")
    assert pcm.size == whole.size
    assert np.abs(pcm.astype(int) - whole).max() <= 2
    assert _peak_hz(pcm, 24000) == pytest.approx(440, abs=2)
    ideal = _tone(24000)[: pcm.size]
    assert _snr_db(ideal[300:-300], pcm[300:-300].astype(np.float64)) > 30


def test_half_a_sample_is_refused() -> None:
    writer = G711Writer("pcmu")
    with pytest.raises(ValueError, match="even number of bytes"):
        writer.write(b"\x00\x01\x02")
    assert len(writer.write(b"\x00\x00" * 240)) > 0  # still usable after the refusal


def test_an_unknown_law_is_refused() -> None:
    for build in (
        lambda: decode(b"\x00", "g722"),  # type: ignore[arg-type]
        lambda: encode(np.zeros(1, dtype=np.int16), "ulaw"),  # type: ignore[arg-type]
        lambda: G711Writer("alaw"),  # type: ignore[arg-type]
        lambda: G711Reader("alaw"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match=r"Unknown G\.711 law"):
            build()
