"""Decoding uploads (gateway/serving/audio/): only OpenAI's audio formats are opened, one
message for everything else, the samples held once, and the replica's turns at decoding
(``GATEWAY_MAX_DECODES``) held until the audio is transcribed.

Written as the attacker's requests: an FFmpeg playlist naming a file of the replica, an SDP
file that would open UDP sockets, an HLS playlist, a file far longer than it looks."""

from __future__ import annotations

import asyncio
import base64
import gc
import io
import socket
import threading
import time
import tracemalloc
from collections.abc import AsyncGenerator
from pathlib import Path

import av
import numpy as np
import numpy.typing as npt
import pytest

from gateway.backend import Segment, TranscriptionOptions
from gateway.backend.fake import FakeBackend
from gateway.errors import OverloadedError
from gateway.serving.audio import (
    NOT_AUDIO,
    UPLOAD_FORMATS,
    AudioTooLongError,
    DecodeSlots,
    UndecodableAudioError,
    decode_to_pcm,
)
from gateway.serving.protocol import TranscriptionRequest
from tests.support.audio import wav_bytes
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import make_settings, serve
from tests.support.waiting import until

URL = "/v1/audio/transcriptions"
VOICE_MODELS = ["fake-chat", "fake-tts", "fake-stt"]

#: Each upload format: (muxer, codec, sample format, rate) to make one with.
MADE = {
    "flac": ("flac", "flac", "s16", 44_100),
    "m4a": ("ipod", "aac", "fltp", 44_100),
    "mp3": ("mp3", "libmp3lame", "s16p", 44_100),
    "mp4": ("mp4", "aac", "fltp", 48_000),
    "mpeg": ("mpeg", "mp2", "s16", 48_000),  # an MPEG program stream (.mpeg)
    "mpga": ("mp3", "libmp3lame", "s16p", 22_050),  # MPEG audio: an .mp3 by another name
    "ogg": ("ogg", "libopus", "s16", 48_000),
    "wav": ("wav", "pcm_s16le", "s16", 8_000),
    "webm": ("webm", "libopus", "flt", 48_000),
}


def encoded(
    muxer: str, codec: str, sample_fmt: str, rate: int, seconds: float, tone: bool = True
) -> bytes:
    """A 440 Hz stereo tone of ``seconds`` (``tone=False``: mono silence)."""
    out = io.BytesIO()
    layout = "stereo" if tone else "mono"
    with av.open(out, mode="w", format=muxer) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout, stream.format = layout, sample_fmt
        step, pts, total = rate, 0, int(seconds * rate)
        piece = (np.sin(2 * np.pi * 440 * np.arange(step) / rate) * 8000).astype(np.int16)
        if tone:
            piece = np.repeat(piece, 2)
        else:
            piece[:] = 0
        while pts < total:
            n = min(step, total - pts)
            frame = av.AudioFrame.from_ndarray(
                piece[: n * len(piece) // step].reshape(1, -1), format="s16", layout=layout
            )
            frame.sample_rate, frame.pts = rate, pts
            pts += n
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def long_flac(seconds: float) -> bytes:
    """``seconds`` of 16 kHz mono silence as FLAC: 270 KB for 25 minutes."""
    return encoded("flac", "flac", "s16", 16_000, seconds, tone=False)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def sdp(port: int) -> bytes:
    """An SDP session description: FFmpeg's sdp demuxer listens on ``port`` for RTP."""
    return (
        b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 0.0.0.0\nt=0 0\n"
        + f"m=audio {port} RTP/AVP 0\n".encode()
    )


def udp_ports_bound() -> set[int]:
    """The UDP ports some socket of this machine is bound to (/proc/net/udp)."""
    lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    return {int(line.split()[1].split(":")[1], 16) for line in lines}


@pytest.fixture
def replica_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a real recording, as a replica's could."""
    (tmp_path / "secret.wav").write_bytes(
        wav_bytes((np.sin(np.arange(24_000 * 2) / 10) * 8000).astype(np.int16).tobytes())
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def hostile(port: int) -> dict[str, bytes]:
    """Files that are not audio in an upload format, each as an attacker would send it."""
    return {
        "ffconcat naming a file that exists": b"ffconcat version 1.0\nfile secret.wav\n",
        "ffconcat naming a file that does not": b"ffconcat version 1.0\nfile nothing.wav\n",
        "ffconcat with an absolute path": b"ffconcat version 1.0\nfile /etc/hostname\n",
        "SDP": sdp(port),
        "HLS playlist": b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nsecret.wav\n"
        b"#EXT-X-ENDLIST\n",
        "raw AAC (no container of the list)": encoded("adts", "aac", "fltp", 44_100, 1),
        "text": b"this is not audio",
        "nothing": b"",
        "a WAV without a sample": wav_bytes(b""),
    }


@pytest.mark.parametrize("name", sorted(MADE))
def test_each_format_openai_takes_is_decoded_to_16k_mono(name: str) -> None:
    assert set(MADE) == set(UPLOAD_FORMATS)
    samples = decode_to_pcm(encoded(*MADE[name], seconds=1.5))
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.size / 16_000 - 1.5) < 0.1
    assert 0.1 < float(np.abs(samples).max()) < 0.5  # the tone, at its level


def test_anything_else_is_one_message_and_reads_no_file(replica_files: Path) -> None:
    refusals = {}
    for name, data in hostile(free_udp_port()).items():
        with pytest.raises(UndecodableAudioError) as refused:
            decode_to_pcm(data)
        refusals[name] = str(refused.value)
    # Nothing tells a playlist naming a file that exists from one naming a file that does
    # not, nor FFmpeg's words: one message, whatever the file.
    assert set(refusals.values()) == {NOT_AUDIO}, refusals
    assert "secret" not in NOT_AUDIO and "Errno" not in NOT_AUDIO


def test_an_sdp_file_opens_no_socket() -> None:
    port = free_udp_port()
    refused: list[BaseException] = []

    def decode() -> None:
        try:
            decode_to_pcm(sdp(port))
        except UndecodableAudioError as exc:
            refused.append(exc)

    worker = threading.Thread(target=decode)
    worker.start()
    seen: set[int] = set()
    # Watched while the decode runs (FFmpeg's sdp demuxer held the port for 20 s, then
    # timed out) and a moment after.
    deadline = time.monotonic() + 0.3
    while worker.is_alive() or time.monotonic() < deadline:
        seen |= udp_ports_bound() & {port, port + 1}
        time.sleep(0.01)
    worker.join()
    assert refused and not seen


def test_the_samples_are_held_once() -> None:
    """25 minutes of silence in a 270 KB FLAC: what decoding allocates is the samples
    themselves (float32, 64 KB a second), not a list of pieces and a concatenation."""
    data = long_flac(1490)
    assert len(data) < 400_000
    tracemalloc.start()
    try:
        samples = decode_to_pcm(data, max_seconds=1500)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert samples.size == 1490 * 16_000
    assert peak < samples.nbytes * 1.05 + 2**20, (peak, samples.nbytes)


def test_decoding_stops_at_the_limit() -> None:
    with pytest.raises(AudioTooLongError, match="GATEWAY_MAX_AUDIO_SECONDS"):
        decode_to_pcm(long_flac(30), max_seconds=20)
    assert decode_to_pcm(long_flac(20), max_seconds=20).size == 20 * 16_000


async def test_refused_uploads_and_parts_read_the_same_to_the_client(replica_files: Path) -> None:
    fake = FakeBackend()
    async with serve(make_settings(models=VOICE_MODELS), fake) as (_, http, _sdk):
        uploads, parts = set(), set()
        for data in hostile(free_udp_port()).values():
            upload = await http.post(
                URL, data={"model": "fake-stt"}, files={"file": ("a.wav", data)}
            )
            uploads.add(
                assert_openai_error(upload, 400, param="file", code="invalid_audio")["message"]
            )
            if not data:
                continue  # an empty part is refused by the schema first
            part = {"data": base64.b64encode(data).decode(), "format": "wav"}
            content = [{"type": "input_audio", "input_audio": part}]
            chat = await http.post(
                "/v1/chat/completions",
                json=chat_body(messages=[{"role": "user", "content": content}]),
            )
            parts.add(assert_openai_error(chat, 400, code="invalid_audio")["message"])
    assert uploads == {f"Invalid audio file: {NOT_AUDIO}."}
    assert parts == {f"Invalid input audio: {NOT_AUDIO}."}
    assert fake.transcribe_calls == []


# -- turns: GATEWAY_MAX_DECODES -----------------------------------------------------------


async def test_a_third_job_waits_for_a_turn() -> None:
    decoder = DecodeSlots(2, max_wait_s=10, max_waiting=8)
    first, second = await decoder.turn(), await decoder.turn()
    third = asyncio.ensure_future(decoder.turn())
    await asyncio.sleep(0.05)
    assert not third.done() and decoder.waiting == 1
    first.release()
    first.release()  # once is enough: a second release gives back nothing more
    turn = await asyncio.wait_for(third, 5)
    assert decoder.held == 2 and decoder.waiting == 0
    second.release()
    turn.release()
    assert decoder.held == 0


async def test_past_the_wait_or_the_queue_a_job_is_overloaded() -> None:
    decoder = DecodeSlots(2, max_wait_s=0.05, max_waiting=1)
    held = [await decoder.turn(), await decoder.turn()]
    with pytest.raises(OverloadedError) as waited:
        await decoder.turn()
    assert waited.value.status_code == 503 and waited.value.code == "overloaded"
    assert waited.value.reason == "wait_timeout" and "Retry-After" in waited.value.headers
    queued = asyncio.ensure_future(decoder.turn())
    await until(lambda: decoder.waiting == 1, "the second one waits")
    with pytest.raises(OverloadedError) as full:
        await decoder.turn()
    assert full.value.reason == "queue_full"
    with pytest.raises(OverloadedError):
        await queued
    for turn in held:
        turn.release()
    assert decoder.held == 0  # those that left hold nothing
    (await decoder.turn()).release()


async def test_a_caller_that_leaves_mid_decode_holds_its_turn_until_the_thread_ends() -> None:
    running, finish = threading.Event(), threading.Event()

    def slow_decode() -> None:
        running.set()
        finish.wait(10)

    decoder = DecodeSlots(1, max_wait_s=10, max_waiting=8)
    turn = await decoder.turn()
    work = asyncio.ensure_future(turn.run(slow_decode))
    await until(running.is_set, "the decode runs")
    work.cancel()
    turn.release()
    await asyncio.sleep(0.05)
    assert decoder.held == 1  # its thread still decodes: no other decode starts
    finish.set()
    await until(lambda: decoder.held == 0, "the turn comes back when the thread ends")


class HeldStt(FakeBackend):
    """The fake backend, whose transcriptions wait for :attr:`go`."""

    go: asyncio.Event

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        await self.go.wait()
        async for segment in super().transcribe(model, audio, options):
            yield segment


async def test_a_turn_is_held_until_the_audio_is_transcribed() -> None:
    """One turn (GATEWAY_MAX_DECODES=1): while an upload is being transcribed its samples
    are held, and another upload or input_audio part waits, then is told to come back."""
    backend = HeldStt()
    backend.go = asyncio.Event()
    settings = make_settings(models=VOICE_MODELS, max_decodes=1, queue_max_wait_s=0.2)
    tone = encoded(*MADE["wav"], seconds=1)
    files = {"file": ("a.wav", tone)}
    async with serve(settings, backend) as (app, http, _sdk):
        decoder = app.state.services.transcription.decoder
        assert decoder is app.state.services.audio_chat.decoder  # one per replica
        first = asyncio.ensure_future(http.post(URL, data={"model": "fake-stt"}, files=files))
        await until(lambda: decoder.held == 1, "the first upload holds the turn")
        second = await http.post(URL, data={"model": "fake-stt"}, files=files)
        error = assert_openai_error(second, 503, code="overloaded")
        assert second.headers["Retry-After"] and "decoded" in error["message"]
        part = {"data": base64.b64encode(tone).decode(), "format": "wav"}
        content = [{"type": "input_audio", "input_audio": part}]
        chat = await http.post(
            "/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": content}])
        )
        assert_openai_error(chat, 503, code="overloaded")
        backend.go.set()
        assert (await first).status_code == 200
        assert decoder.held == 0
        streamed = await http.post(URL, data={"model": "fake-stt", "stream": "true"}, files=files)
        assert streamed.status_code == 200 and "transcript.text.done" in streamed.text
        assert decoder.held == 0


async def test_a_prepared_job_dropped_unfinished_gives_its_turn_back() -> None:
    """A stream whose client left before it began is never run: its job, once dropped,
    gives the turn back all the same."""
    async with serve(make_settings(models=VOICE_MODELS, max_decodes=1)) as (app, _http, _sdk):
        transcriber = app.state.services.transcription
        request = TranscriptionRequest(model="fake-stt", stream=True)
        job = await transcriber.prepare(request, encoded(*MADE["wav"], seconds=1))
        assert transcriber.decoder.held == 1
        del job
        gc.collect()
        await until(lambda: transcriber.decoder.held == 0, "the dropped job's turn comes back")


async def test_eight_long_files_at_once_are_decoded_two_at_a_time() -> None:
    decoder = DecodeSlots(2, max_wait_s=30, max_waiting=8)
    data = long_flac(300)

    async def one() -> int:
        turn = await decoder.turn()
        try:
            return (await turn.decode(data, 1500)).size
        finally:
            turn.release()

    jobs = [asyncio.ensure_future(one()) for _ in range(8)]
    peak = 0
    while not all(job.done() for job in jobs):
        peak = max(peak, decoder.held)
        await asyncio.sleep(0.005)
    assert [job.result() for job in jobs] == [300 * 16_000] * 8
    assert peak == 2


async def test_ffmpegs_words_go_to_the_log_with_the_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serve(make_settings(models=VOICE_MODELS)) as (_, http, _sdk):
        with caplog.at_level("INFO", logger="gateway"):
            refused = await http.post(
                URL, data={"model": "fake-stt"}, files={"file": ("a.wav", b"not audio")}
            )
    error = assert_openai_error(refused, 400, code="invalid_audio")
    assert "Invalid data" not in error["message"]
    logged = [
        r.getMessage() for r in caplog.records if refused.headers["X-Request-ID"] in r.getMessage()
    ]
    assert logged and "Invalid data" in logged[0], logged
