"""Hostile audio against the real stack (nginx, two replicas, Triton), written as the
attacker's requests: an FFmpeg playlist naming a file in the replica's working directory,
an SDP file that would have the replica listen on UDP ports, and eight small FLACs that
decode to hours, sent at once while the replicas' memory is watched."""

from __future__ import annotations

import base64
import io
import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest

from gateway.config import Settings
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

SECRET = "The vault code is seven seven three."


@pytest.fixture(scope="module")
def replica_pids(stack: GatewayProcess) -> list[int]:
    return [stack.replica_pid(address) for address in stack.replica_addresses()]


@pytest.fixture
def file_of_the_replica(
    stack: GatewayProcess, client: openai.OpenAI, replica_pids: list[int]
) -> Iterator[str]:
    """A recording in the replicas' working directory, named as a playlist would name it."""
    folders = {Path(os.readlink(f"/proc/{pid}/cwd")) for pid in replica_pids}
    assert len(folders) == 1, folders
    name = f"hostile-{uuid.uuid4().hex[:8]}.wav"
    path = folders.pop() / name
    path.write_bytes(
        client.audio.speech.create(
            model="piper_tts", voice="alloy", input=SECRET, response_format="wav"
        ).content
    )
    try:
        yield name
    finally:
        path.unlink()


def refused_upload(client: openai.OpenAI, data: bytes) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model="whisper_stt", file=("speech.wav", data))
    return refused.value


def refused_part(client: openai.OpenAI, data: bytes) -> openai.BadRequestError:
    """``data`` as a chat request's ``input_audio`` part."""
    part = {"data": base64.b64encode(data).decode(), "format": "wav"}
    content = [{"type": "input_audio", "input_audio": part}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="mock_chat",
            messages=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
        )
    return refused.value


def test_a_playlist_upload_reads_no_file_of_the_replica(
    client: openai.OpenAI, file_of_the_replica: str
) -> None:
    messages = set()
    for named in (file_of_the_replica, "missing-" + file_of_the_replica):
        playlist = f"ffconcat version 1.0\nfile {named}\n".encode()
        upload = refused_upload(client, playlist)
        assert (upload.code, upload.param) == ("invalid_audio", "file")
        part = refused_part(client, playlist)
        assert part.code == "invalid_audio"
        messages |= {upload.message, part.message.replace("input audio", "audio file")}
    # The same words whether the file exists or not: no oracle, and nothing of it heard.
    assert len(messages) == 1, messages
    assert "vault" not in messages.pop().lower()


def udp_ports(pid: int) -> set[int]:
    """The UDP ports bound in the replica's network namespace."""
    lines = Path(f"/proc/{pid}/net/udp").read_text().splitlines()[1:]
    return {int(line.split()[1].split(":")[1], 16) for line in lines}


def test_an_sdp_upload_opens_no_socket(client: openai.OpenAI, replica_pids: list[int]) -> None:
    port = 41_234
    while {port, port + 1} & udp_ports(replica_pids[0]):
        port += 2
    sdp = (
        b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 0.0.0.0\nt=0 0\n"
        + f"m=audio {port} RTP/AVP 0\n".encode()
    )
    refused: list[openai.BadRequestError] = []

    def send() -> None:
        refused.append(refused_upload(client, sdp))

    sender = threading.Thread(target=send)
    sender.start()
    seen: set[int] = set()
    # Watched while the request is in flight (FFmpeg's sdp demuxer listened for 20 s
    # before it gave up) and a moment after.
    settle = time.monotonic() + 0.5
    while sender.is_alive() or time.monotonic() < settle:
        for pid in replica_pids:
            seen |= udp_ports(pid) & {port, port + 1}
        time.sleep(0.02)
    sender.join()
    assert refused and refused[0].code == "invalid_audio"
    assert not seen


def silent_flac(seconds: float) -> bytes:
    """``seconds`` of 16 kHz mono silence as FLAC: about 180 bytes a second."""
    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=16_000)
        stream.layout, stream.format = "mono", "s16"
        zeros, pts = np.zeros((1, 16_000), np.int16), 0
        while pts < seconds * 16_000:
            frame = av.AudioFrame.from_ndarray(zeros, format="s16", layout="mono")
            frame.sample_rate, frame.pts = 16_000, pts
            pts += frame.samples
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_eight_long_flacs_at_once_hold_the_replicas_memory_to_their_turns(
    stack: GatewayProcess, replica_pids: list[int]
) -> None:
    """Eight 300 KB FLACs of silence that decode past GATEWAY_MAX_AUDIO_SECONDS (the
    stack's default), at once: each decode fills that many seconds of samples before it is
    refused, and a replica holds GATEWAY_MAX_DECODES of them at a time. Before, eight such
    files grew the two replicas by gigabytes."""
    fields = Settings.model_fields
    max_seconds = fields["max_audio_seconds"].default
    turns = fields["max_decodes"].default
    flac = silent_flac(max_seconds + 100)
    assert len(flac) < 400_000
    # The samples of each turn (float32 at 16 kHz), plus what the requests themselves hold
    # (uploads, parsing, FFmpeg's frames).
    bound = turns * max_seconds * 16_000 * 4 + 64 * 2**20
    baseline = {pid: rss(pid) for pid in replica_pids}
    peak = dict(baseline)
    with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=120) as http:
        sent = [
            pool.submit(
                http.post,
                stack.base_url + "/v1/audio/transcriptions",
                headers=stack.headers,
                data={"model": "whisper_stt"},
                files={"file": ("long.flac", flac)},
            )
            for _ in range(8)
        ]
        while not all(s.done() for s in sent):
            peak = {pid: max(peak[pid], rss(pid)) for pid in replica_pids}
            time.sleep(0.01)
        answers = [s.result() for s in sent]
    assert [a.status_code for a in answers] == [400] * 8, answers[0].text
    assert {a.json()["error"]["code"] for a in answers} == {"audio_too_long"}
    growth = {pid: peak[pid] - baseline[pid] for pid in replica_pids}
    assert max(growth.values()) < bound, (growth, bound)
