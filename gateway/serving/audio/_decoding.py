"""Files in: :func:`decode_to_pcm` turns an uploaded file into the samples a
speech-to-text model takes. An upload is hostile until decoded: it is opened with the
demuxers of :data:`UPLOAD_FORMATS` only and no protocol (an FFmpeg playlist would otherwise
read the replica's files, an SDP file open sockets), decoded frame by frame into one buffer
(the samples held once), and stopped past ``GATEWAY_MAX_AUDIO_SECONDS``."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt

#: The sample rate speech-to-text models take.
STT_RATE = 16_000

#: What an uploaded file may be: OpenAI's list for transcriptions (mpga and mpeg are MPEG
#: audio, m4a is mp4).
UPLOAD_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "ogg", "wav", "webm")
NOT_AUDIO = (
    "the file is not audio this gateway decodes (it takes "
    f"{', '.join(UPLOAD_FORMATS)}), or holds no sound"
)
#: FFmpeg's demuxers for them, the only ones an upload is opened with: FFmpeg probes the
#: file and refuses any other (a playlist such as ffconcat or HLS, an SDP session
#: description, an image...) before it reads past the probe. A demuxer matches by any of
#: its names: "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"; "mpeg" is MPEG program streams.
_DEMUXERS = "flac,mp3,mp4,m4a,mpeg,ogg,wav,webm"
_OPEN_OPTIONS = {
    "format_whitelist": _DEMUXERS,
    # No protocol is needed to read a file from memory; none is allowed, so that no
    # demuxer can open another file or a socket (mov's external references, off in FFmpeg
    # by default, or any other).
    "protocol_whitelist": "none",
}
#: The buffer first holds this much audio when the file does not tell its duration, and
#: grows by at least this much (or a quarter).
_GROWTH_S = 30


class UndecodableAudioError(ValueError):
    """The upload is not audio in one of :data:`UPLOAD_FORMATS`, or holds no samples. Its
    message is the same whatever went wrong, so that a client learns nothing of what a
    playlist named or of FFmpeg; ``detail`` (FFmpeg's words) is for the log."""

    def __init__(self, detail: str, message: str | None = None) -> None:
        super().__init__(message or NOT_AUDIO)
        self.detail = detail


class AudioTooLongError(UndecodableAudioError):
    """The audio decodes to more than the gateway takes (``GATEWAY_MAX_AUDIO_SECONDS``)."""

    def __init__(self, max_seconds: float) -> None:
        message = (
            f"the audio is longer than {max_seconds:g} seconds, the most this gateway takes "
            "(GATEWAY_MAX_AUDIO_SECONDS)"
        )
        super().__init__(message, message)


class _Samples:
    """Mono float32 samples written once into one buffer that grows in place (numpy's
    ``resize`` reallocates, and a large buffer is remapped, not copied), up to ``limit``
    samples; the caller gets that buffer, trimmed."""

    def __init__(self, expected: int, limit: int, rate: int) -> None:
        self.limit, self.step = limit, _GROWTH_S * rate
        # Pages the decoder never writes are not resident: a header that claims hours
        # costs address space only.
        self.buffer = np.empty(min(expected or self.step, limit), dtype=np.float32)
        self.size = 0

    def add(self, frame: av.AudioFrame) -> bool:
        """Appends a packed mono float frame; False (nothing added) past ``limit``."""
        end = self.size + frame.samples
        if end > self.limit:
            return False
        if end > self.buffer.size:
            grown = max(end, self.buffer.size + max(self.step, self.buffer.size // 4))
            # No view of the buffer outlives a call: nothing refers to the old memory.
            self.buffer.resize(min(grown, self.limit), refcheck=False)
        plane = np.frombuffer(memoryview(frame.planes[0]), dtype=np.float32, count=frame.samples)
        self.buffer[self.size : end] = plane
        self.size = end
        return True

    def take(self) -> npt.NDArray[np.float32]:
        self.buffer.resize(self.size, refcheck=False)
        return self.buffer

    def clear(self) -> None:
        self.buffer, self.size = np.empty(0, dtype=np.float32), 0


def decode_to_pcm(
    data: bytes, rate: int = STT_RATE, max_seconds: float = 1500.0
) -> npt.NDArray[np.float32]:
    """Decodes an uploaded file (one of :data:`UPLOAD_FORMATS`, its first audio stream)
    into mono float32 samples at ``rate``, frame by frame into one buffer: the samples are
    held once (4 bytes per sample), with no other copy of the whole. CPU work: run it in a
    thread (:class:`DecodeSlots` does).

    Raises :class:`UndecodableAudioError` for anything else (one message, whatever the
    file is), and :class:`AudioTooLongError` as soon as the audio passes ``max_seconds``:
    a small file at a low bitrate can hold hours, gigabytes of samples."""
    limit = int(max_seconds * rate)
    samples = _Samples(0, 0, rate)
    try:
        with av.open(
            io.BytesIO(data),
            mode="r",
            container_options=dict(_OPEN_OPTIONS),
            metadata_errors="ignore",  # tags in another encoding are no reason to refuse
        ) as container:
            if not container.streams.audio:
                raise UndecodableAudioError("the file has no audio stream")
            stream = container.streams.audio[0]
            expected = 0
            if container.duration is not None and container.duration > 0:
                expected = int(container.duration * rate // av.time_base) + rate
            samples = _Samples(expected, limit, rate)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    if not samples.add(out):
                        raise AudioTooLongError(max_seconds)
            for out in resampler.resample(None):
                if not samples.add(out):
                    raise AudioTooLongError(max_seconds)
    # The traceback keeps this frame, and so the buffer, as long as the error is kept (a
    # cycle waits for the collector): a refused file's samples go at once.
    except UndecodableAudioError:
        samples.clear()
        raise
    except (av.FFmpegError, ValueError) as exc:  # PyAV's own refusals are ValueErrors
        samples.clear()
        raise UndecodableAudioError(str(exc)) from exc
    if samples.size == 0:
        raise UndecodableAudioError("the audio is empty")
    return samples.take()
