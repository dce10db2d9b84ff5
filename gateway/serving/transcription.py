"""Transcription: an uploaded audio file in, text out in the OpenAI response formats.

Uploads are decoded with PyAV (any container/codec FFmpeg knows) to 16 kHz mono PCM in a
worker thread, then sent to the speech-to-text model, which answers one segment at a time.
``stream=true`` sends each segment as a ``transcript.text.delta`` SSE event as it arrives,
then ``transcript.text.done``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.backend import Backend, Segment, TranscriptionOptions
from gateway.errors import InvalidRequestError
from gateway.serving.audio import STT_RATE, UndecodableAudioError, decode_to_pcm
from gateway.serving.catalog import ModelCatalog, model_takes
from gateway.serving.sse import event, first_or_close, with_error_event
from gateway.state.limits import Meter

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
_LANGUAGE_NAMES = {"en": "english"}  # verbose_json names the language, as OpenAI does


@dataclass(frozen=True)
class PreparedTranscription:
    model: str
    audio: npt.NDArray[np.float32]
    options: TranscriptionOptions
    response_format: str
    granularities: frozenset[str]

    @property
    def duration(self) -> float:
        return self.audio.size / STT_RATE


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def to_srt(segments: list[Segment]) -> str:
    return "".join(
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def to_vtt(segments: list[Segment]) -> str:
    cues = "".join(
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n" for s in segments
    )
    return "WEBVTT\n\n" + cues


def _text(segments: list[Segment]) -> str:
    return "".join(s.text for s in segments).strip()


async def transcript(
    backend: Backend, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
) -> str:
    """The whole text of ``audio`` (16 kHz mono float), as one string."""
    segments = backend.transcribe(model, audio, options)
    async with aclosing(segments):
        return _text([segment async for segment in segments])


def to_verbose_json(job: PreparedTranscription, segments: list[Segment]) -> dict[str, Any]:
    language = segments[0].language if segments else (job.options.language or "")
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": _LANGUAGE_NAMES.get(language, language),
        "duration": round(job.duration, 3),
        "text": _text(segments),
        "usage": {"type": "duration", "seconds": math.ceil(job.duration)},
    }
    if "segment" in job.granularities:
        body["segments"] = [
            {
                "id": i,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "temperature": job.options.temperature,
                "avg_logprob": round(s.avg_logprob, 4),
                "no_speech_prob": round(s.no_speech_prob, 4),
            }
            for i, s in enumerate(segments)
        ]
    if "word" in job.granularities:
        body["words"] = [
            {"word": w.word.strip(), "start": w.start, "end": w.end}
            for s in segments
            for w in s.words
        ]
    return body


class TranscriptionService:
    def __init__(
        self, backend: Backend, catalog: ModelCatalog, max_audio_seconds: float = 1500.0
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.max_audio_seconds = max_audio_seconds

    async def prepare(
        self,
        model: str,
        upload: bytes,
        language: str | None,
        prompt: str | None,
        temperature: float,
        response_format: str,
        granularities: list[str],
    ) -> PreparedTranscription:
        info = await self.catalog.get(model, "transcription")
        if language and info.languages and language not in info.languages:
            raise InvalidRequestError(
                f"The model '{model}' does not transcribe language '{language}'; it "
                f"supports: {', '.join(info.languages)}.",
                param="language",
                code="unsupported_language",
            )
        if language and not model_takes(info, "language"):
            language = None
        if prompt and not model_takes(info, "prompt"):
            prompt = None
        if temperature and not model_takes(info, "temperature"):
            temperature = 0.0
        if granularities and response_format != "verbose_json":
            raise InvalidRequestError(
                "timestamp_granularities[] requires response_format 'verbose_json'.",
                param="timestamp_granularities[]",
            )
        try:
            audio = await asyncio.to_thread(decode_to_pcm, upload, STT_RATE, self.max_audio_seconds)
        except UndecodableAudioError as exc:
            raise InvalidRequestError(
                f"Invalid audio file: {exc}.", param="file", code="invalid_audio"
            ) from exc
        # OpenAI's verbose_json has segments unless only words were asked for.
        chosen = frozenset(granularities or ["segment"])
        return PreparedTranscription(
            model=model,
            audio=audio,
            options=TranscriptionOptions(
                language=language or None,
                prompt=prompt or None,
                temperature=temperature,
                word_timestamps="word" in chosen,
                file=upload,
            ),
            response_format=response_format,
            granularities=chosen,
        )

    def _segments(
        self, job: PreparedTranscription, meter: Meter | None
    ) -> AsyncGenerator[Segment, None]:
        if meter is not None:
            meter.audio_seconds_in += job.duration
        return self.backend.transcribe(job.model, job.audio, job.options)

    async def complete(
        self, job: PreparedTranscription, meter: Meter | None = None
    ) -> tuple[str, str]:
        """The whole transcription in the requested format: (body, media type)."""
        async with aclosing(self._segments(job, meter)) as stream:
            segments = [segment async for segment in stream]
        if job.response_format == "text":
            return _text(segments) + "\n", "text/plain; charset=utf-8"
        if job.response_format == "srt":
            return to_srt(segments), "application/x-subrip; charset=utf-8"
        if job.response_format == "vtt":
            return to_vtt(segments), "text/vtt; charset=utf-8"
        if job.response_format == "verbose_json":
            return json.dumps(to_verbose_json(job, segments)), "application/json"
        usage = {"type": "duration", "seconds": math.ceil(job.duration)}
        return json.dumps({"text": _text(segments), "usage": usage}), "application/json"

    async def stream(
        self, job: PreparedTranscription, meter: Meter | None = None
    ) -> AsyncIterator[str]:
        """SSE events; raises (for a real status) if the model fails before its first
        segment."""
        segments = self._segments(job, meter)
        first = await first_or_close(segments)
        return with_error_event(self._events(segments, first), "transcription")

    async def _events(
        self, segments: AsyncGenerator[Segment, None], first: Segment | None
    ) -> AsyncGenerator[str, None]:
        texts: list[str] = []
        async with aclosing(segments):
            segment = first
            while segment is not None:
                texts.append(segment.text)
                yield event({"type": "transcript.text.delta", "delta": segment.text})
                segment = await anext(segments, None)
        yield event({"type": "transcript.text.done", "text": "".join(texts).strip()})
