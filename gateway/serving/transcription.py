"""Transcription: an uploaded audio file in, text out in the OpenAI response formats.

Uploads (OpenAI's formats: :data:`gateway.serving.audio.UPLOAD_FORMATS`) are decoded with
PyAV to 16 kHz mono PCM by the replica's :class:`~gateway.serving.audio.DecodeSlots` (in a
worker thread, ``GATEWAY_MAX_DECODES`` at a time), then sent to the speech-to-text model,
which answers one segment at a time.

``chunking_strategy`` cuts the audio where voice-activity detection (Silero, see
:mod:`gateway.serving.vad`, in a worker thread) hears speech, and each stretch is
transcribed on its own, its times shifted back into the whole file's; silence between them
is not transcribed. ``auto`` first scales the audio to full loudness for the detector, and
uses OpenAI's ``server_vad`` defaults; a ``server_vad`` object sets them.

``stream=true`` sends each segment as a ``transcript.text.delta`` SSE event as it arrives,
then ``transcript.text.done``, in the requested format: the deltas join into the done
event's ``text``, which is the subtitle document for ``srt`` and ``vtt`` (each delta a cue)
and the plain text otherwise; with ``verbose_json`` each delta also carries its ``segment``
and (``timestamp_granularities[]`` ``word``) its ``words``, and the done event every field
of the ``verbose_json`` body (segments, words, language, duration).

A multilingual model gets no ``language`` unless the client gives one, and detects it;
``verbose_json`` names the language each model reports by its English name, as OpenAI does.
A translation (``/v1/audio/translations``) is the same job with the ``translate`` task, on
a model that declares it translates; its output is English.

``verbose_json`` segments carry every field of OpenAI's (and the SDK's
``TranscriptionSegment``): the model's, where it reports them (Whisper reports all), else
computed where that is honest: ``seek`` 0 (the model heard its audio as one window),
``tokens`` empty, ``temperature`` the one asked for, ``compression_ratio`` of the text by
Whisper's definition (:func:`compression_ratio`). ``avg_logprob`` and ``no_speech_prob`` are
never made up: a model that reports none serves ``verbose_json`` without segments only (400
otherwise), as OpenAI refuses ``verbose_json`` for its models that have none.
"""

from __future__ import annotations

import json
import math
import weakref
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.backend import Backend, ModelInfo, Segment, TranscriptionOptions
from gateway.errors import BackendError, InvalidRequestError
from gateway.serving.audio import (
    STT_RATE,
    AudioTooLongError,
    DecodeSlot,
    DecodeSlots,
    UndecodableAudioError,
)
from gateway.serving.catalog import ModelCatalog, model_takes
from gateway.serving.languages import name_of
from gateway.serving.protocol import ChunkingStrategy, TranscriptionRequest, TranslationRequest
from gateway.serving.sse import event, first_or_close, with_error_event
from gateway.serving.vad import SpeechStarted, TurnDetector, VadSettings
from gateway.state.limits import Meter

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
#: Whisper's mel frames per second, the unit of a segment's ``seek``.
FRAMES_PER_S = 100


@dataclass(frozen=True)
class PreparedTranscription:
    model: str
    audio: npt.NDArray[np.float32]
    options: TranscriptionOptions
    response_format: str
    granularities: frozenset[str]
    spans: tuple[tuple[int, int], ...] | None = None
    """The stretches of speech transcribed, as sample ranges (None: the whole audio)."""
    turn: DecodeSlot | None = field(default=None, repr=False, compare=False)
    """The decoder's turn the samples hold, given back when the job is done (or dropped)."""

    @property
    def duration(self) -> float:
        return self.audio.size / STT_RATE

    @property
    def translation(self) -> bool:
        return self.options.task == "translate"


def _holding(job: PreparedTranscription) -> PreparedTranscription:
    """``job``, whose turn also goes back if the job is dropped unfinished (a stream
    whose client left before it began is never run, so its ``finally`` is not either)."""
    if job.turn is not None:
        weakref.finalize(job, job.turn.release_soon).atexit = False
    return job


def _done_with(job: PreparedTranscription) -> None:
    if job.turn is not None:
        job.turn.release()


def speech_spans(
    audio: npt.NDArray[np.float32], chunking: ChunkingStrategy
) -> tuple[tuple[int, int], ...]:
    """Where ``audio`` holds speech, as sample ranges (CPU work: run it in a thread). Each
    ends where the detector decided the speaker stopped, or at the end of the audio."""
    given = chunking.model_dump(exclude={"type"}, exclude_none=True)
    settings = VadSettings(**given)
    heard = audio
    if chunking.type == "auto":
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        heard = audio / peak if peak > 0 else audio
    spans, start = [], None
    per_ms = STT_RATE // 1000
    for found in TurnDetector(settings).feed(np.ascontiguousarray(heard, dtype=np.float32)):
        if isinstance(found, SpeechStarted):
            start = found.at_ms * per_ms
        elif start is not None:
            end = (found.at_ms + settings.silence_duration_ms) * per_ms
            spans.append((start, min(end, audio.size)))
            start = None
    if start is not None:
        spans.append((start, audio.size))
    return tuple(spans)


def _shifted(segment: Segment, seconds: float) -> Segment:
    """``segment`` of a stretch starting ``seconds`` into the audio, in the audio's times
    (its ``seek`` too: the window's start in the whole audio's frames)."""
    if not seconds:
        return segment
    words = tuple(replace(w, start=w.start + seconds, end=w.end + seconds) for w in segment.words)
    return replace(
        segment,
        start=segment.start + seconds,
        end=segment.end + seconds,
        words=words,
        seek=segment.seek + round(seconds * FRAMES_PER_S),
    )


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _srt_cue(number: int, s: Segment) -> str:
    return f"{number}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"


def _vtt_cue(s: Segment) -> str:
    return f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"


_VTT_HEAD = "WEBVTT\n\n"


def to_srt(segments: list[Segment]) -> str:
    return "".join(_srt_cue(i, s) for i, s in enumerate(segments, start=1))


def to_vtt(segments: list[Segment]) -> str:
    return _VTT_HEAD + "".join(_vtt_cue(s) for s in segments)


def _text(segments: list[Segment]) -> str:
    return "".join(s.text for s in segments).strip()


async def transcript(
    backend: Backend, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
) -> str:
    """The whole text of ``audio`` (16 kHz mono float), as one string."""
    segments = backend.transcribe(model, audio, options)
    async with aclosing(segments):
        return _text([segment async for segment in segments])


def compression_ratio(text: str) -> float:
    """Whisper's compression ratio: the UTF-8 text's length over its zlib-compressed length
    (above 2.4, Whisper takes the text for a loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _segment_json(job: PreparedTranscription, number: int, s: Segment) -> dict[str, Any]:
    """OpenAI's segment: the model's values, the others computed (see the module's
    docstring); the scores only from a model that reports them (checked in ``prepare``)."""
    ratio = s.compression_ratio if s.compression_ratio is not None else compression_ratio(s.text)
    temperature = s.temperature if s.temperature is not None else job.options.temperature
    return {
        "id": number,
        "seek": s.seek,
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": round(temperature, 4),
        "avg_logprob": round(_score(job, s.avg_logprob, "avg_logprob"), 4),
        "compression_ratio": round(ratio, 4),
        "no_speech_prob": round(_score(job, s.no_speech_prob, "no_speech_prob"), 4),
    }


def _score(job: PreparedTranscription, value: float | None, name: str) -> float:
    """A score the model declares; one it then leaves out is the model's error."""
    if value is None:
        raise BackendError(f"Model '{job.model}' declares {name} but sent none")
    return value


def _words_json(s: Segment) -> list[dict[str, Any]]:
    return [{"word": w.word.strip(), "start": w.start, "end": w.end} for w in s.words]


def to_verbose_json(job: PreparedTranscription, segments: list[Segment]) -> dict[str, Any]:
    """OpenAI's ``verbose_json``: ``language`` is the English name of the language the model
    heard (the one given, or the one it detected); a translation's is always ``english``,
    and it has no ``usage`` (OpenAI's translation objects have none)."""
    if job.translation:
        language = "en"
    else:
        language = segments[0].language if segments else (job.options.language or "")
    body: dict[str, Any] = {
        "task": job.options.task,
        "language": name_of(language),
        "duration": round(job.duration, 3),
        "text": _text(segments),
    }
    if not job.translation:
        body["usage"] = {"type": "duration", "seconds": math.ceil(job.duration)}
    if "segment" in job.granularities:
        body["segments"] = [_segment_json(job, i, s) for i, s in enumerate(segments)]
    if "word" in job.granularities:
        body["words"] = [word for s in segments for word in _words_json(s)]
    return body


def _delta(job: PreparedTranscription, number: int, s: Segment) -> dict[str, Any]:
    """The streamed event of the ``number``-th segment, in the requested format."""
    form = job.response_format
    if form == "srt":
        return {"type": "transcript.text.delta", "delta": _srt_cue(number + 1, s)}
    if form == "vtt":
        head = _VTT_HEAD if number == 0 else ""
        return {"type": "transcript.text.delta", "delta": head + _vtt_cue(s)}
    delta: dict[str, Any] = {"type": "transcript.text.delta", "delta": s.text}
    if form == "verbose_json" and "segment" in job.granularities:
        delta["segment"] = _segment_json(job, number, s)
    if form == "verbose_json" and "word" in job.granularities:
        delta["words"] = _words_json(s)
    return delta


def _done(job: PreparedTranscription, segments: list[Segment]) -> dict[str, Any]:
    """The streamed ``transcript.text.done`` event: the whole transcript in the requested
    format (with ``verbose_json``, its fields but ``usage``, which is counted in tokens in
    this event)."""
    done: dict[str, Any] = {"type": "transcript.text.done"}
    if job.response_format == "srt":
        return done | {"text": to_srt(segments)}
    if job.response_format == "vtt":
        return done | {"text": to_vtt(segments)}
    if job.response_format == "verbose_json":
        body = to_verbose_json(job, segments)
        body.pop("usage")
        return done | body
    return done | {"text": _text(segments)}


def _scores_needed(info: ModelInfo, param: str | None = None) -> None:
    """A 400 for segments from a model that reports no ``avg_logprob`` and
    ``no_speech_prob``, which OpenAI's segments require and the gateway cannot measure."""
    if info.segment_scores:
        return
    raise InvalidRequestError(
        f"The model '{info.name}' reports no segment scores (avg_logprob, no_speech_prob), "
        "which verbose_json segments carry. Use response_format 'json', 'text', 'srt' or "
        "'vtt' (srt and vtt are timed), or verbose_json with "
        "timestamp_granularities[]=word alone.",
        param=param or "response_format",
        code="unsupported_value",
    )


class TranscriptionService:
    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        decoder: DecodeSlots,
        max_audio_seconds: float = 1500.0,
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.decoder = decoder
        self.max_audio_seconds = max_audio_seconds

    async def prepare(self, request: TranscriptionRequest, upload: bytes) -> PreparedTranscription:
        problem = request.unsupported()
        if problem is not None:
            param, message = problem
            raise InvalidRequestError(message, param=param, code="unsupported_parameter")
        model, language, prompt = request.model, request.language, request.prompt
        temperature, response_format = request.temperature, request.response_format
        granularities = request.timestamp_granularities or []
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
        # OpenAI's verbose_json has segments unless only words were asked for.
        chosen = frozenset(granularities or ["segment"])
        if response_format == "verbose_json" and "segment" in chosen:
            _scores_needed(info, "timestamp_granularities[]" if granularities else None)
        turn = await self.decoder.turn()
        try:
            audio = await self._decode(turn, upload)
            spans = None
            if request.chunking_strategy is not None:
                spans = await turn.run(speech_spans, audio, request.chunking_strategy)
        except BaseException:
            turn.release()
            raise
        return _holding(
            PreparedTranscription(
                model=model,
                audio=audio,
                options=TranscriptionOptions(
                    language=language or None,
                    prompt=prompt or None,
                    temperature=temperature,
                    word_timestamps="word" in chosen,
                    # A model that takes the encoded file gets each stretch as WAV instead.
                    file=upload if request.chunking_strategy is None else None,
                ),
                response_format=response_format,
                granularities=chosen,
                spans=spans,
                turn=turn,
            )
        )

    async def prepare_translation(
        self, request: TranslationRequest, upload: bytes
    ) -> PreparedTranscription:
        """A translation into English: a transcription job with the ``translate`` task, on
        a model that translates (400 naming ``model`` otherwise)."""
        model, prompt, temperature = request.model, request.prompt, request.temperature
        info = await self.catalog.get(model, "transcription")
        if not info.translates:
            raise InvalidRequestError(
                f"The model '{model}' does not translate speech (it only transcribes; its "
                "Triton config does not declare translates). Use /v1/audio/transcriptions, "
                "or a model that translates.",
                param="model",
                code="model_not_supported",
            )
        if prompt and not model_takes(info, "prompt"):
            prompt = None
        if temperature and not model_takes(info, "temperature"):
            temperature = 0.0
        if request.response_format == "verbose_json":
            _scores_needed(info)
        turn = await self.decoder.turn()
        try:
            audio = await self._decode(turn, upload)
        except BaseException:
            turn.release()
            raise
        options = TranscriptionOptions(
            prompt=prompt or None, temperature=temperature, file=upload, task="translate"
        )
        return _holding(
            PreparedTranscription(
                model=model,
                audio=audio,
                options=options,
                response_format=request.response_format,
                granularities=frozenset({"segment"}),
                turn=turn,
            )
        )

    async def _decode(self, turn: DecodeSlot, upload: bytes) -> npt.NDArray[np.float32]:
        """The upload as 16 kHz mono samples (in a worker thread); 400 naming ``file``."""
        try:
            return await turn.decode(upload, self.max_audio_seconds)
        except UndecodableAudioError as exc:
            code = "audio_too_long" if isinstance(exc, AudioTooLongError) else "invalid_audio"
            raise InvalidRequestError(
                f"Invalid audio file: {exc}.", param="file", code=code, detail=exc.detail
            ) from exc

    def _segments(
        self, job: PreparedTranscription, meter: Meter | None
    ) -> AsyncGenerator[Segment, None]:
        if meter is not None:
            meter.audio_seconds_in += job.duration
        if job.spans is None:
            return self.backend.transcribe(job.model, job.audio, job.options)
        return self._stretches(job, job.spans)

    async def _stretches(
        self, job: PreparedTranscription, spans: tuple[tuple[int, int], ...]
    ) -> AsyncGenerator[Segment, None]:
        """The segments of each stretch of speech, one stretch after the other."""
        for start, end in spans:
            segments = self.backend.transcribe(job.model, job.audio[start:end], job.options)
            async with aclosing(segments):
                async for segment in segments:
                    yield _shifted(segment, start / STT_RATE)

    async def complete(
        self, job: PreparedTranscription, meter: Meter | None = None
    ) -> tuple[str, str]:
        """The whole transcription in the requested format: (body, media type). Gives
        the job's decoder turn back."""
        try:
            if meter is not None:  # 429 budget_exceeded when its price does not fit a budget
                await meter.check_budget(job.duration)
            async with aclosing(self._segments(job, meter)) as stream:
                segments = [segment async for segment in stream]
        finally:
            _done_with(job)
        if job.response_format == "text":
            return _text(segments) + "\n", "text/plain; charset=utf-8"
        if job.response_format == "srt":
            return to_srt(segments), "application/x-subrip; charset=utf-8"
        if job.response_format == "vtt":
            return to_vtt(segments), "text/vtt; charset=utf-8"
        if job.response_format == "verbose_json":
            return json.dumps(to_verbose_json(job, segments)), "application/json"
        if job.translation:
            return json.dumps({"text": _text(segments)}), "application/json"
        usage = {"type": "duration", "seconds": math.ceil(job.duration)}
        return json.dumps({"text": _text(segments), "usage": usage}), "application/json"

    async def stream(
        self, job: PreparedTranscription, meter: Meter | None = None
    ) -> AsyncIterator[str]:
        """SSE events; raises (for a real status) if the model fails before its first
        segment. The job's decoder turn is given back when the events end (or fail)."""
        try:
            if meter is not None:
                await meter.check_budget(job.duration)
            segments = self._segments(job, meter)
            first = await first_or_close(segments)
        except BaseException:
            _done_with(job)
            raise
        return with_error_event(self._events(job, segments, first), "transcription")

    async def _events(
        self,
        job: PreparedTranscription,
        segments: AsyncGenerator[Segment, None],
        first: Segment | None,
    ) -> AsyncGenerator[str, None]:
        told: list[Segment] = []
        try:
            async with aclosing(segments):
                segment = first
                while segment is not None:
                    yield event(_delta(job, len(told), segment))
                    told.append(segment)
                    segment = await anext(segments, None)
        finally:
            _done_with(job)
        yield event(_done(job, told))
