"""Issue 36's audio fields: every field of the SDK's ``verbose_json`` segment (the model's,
or computed where that is honest, never a made-up score), and speech ``instructions``
through the custom mapping (the real stack: tests/integration/test_transcription_e2e.py
and test_agents_voice_e2e.py)."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import openai
from openai.types.audio import TranscriptionSegment, TranscriptionVerbose, TranslationVerbose
from tritonclient.grpc import service_pb2

from gateway.backend import Segment
from gateway.backend import grpc_streams as streams
from gateway.backend.fake import FakeBackend
from gateway.serving.transcription import _shifted, compression_ratio
from tests.support.audio import tone_file
from tests.support.bodies import assert_openai_error
from tests.support.triton import audio_model, decoded, spec, text_of

URL = "/v1/audio/transcriptions"
#: The SDK's segment fields and their types, as openai-python 3.57 declares them.
SEGMENT_TYPES = {
    "id": int,
    "seek": int,
    "start": float,
    "end": float,
    "text": str,
    "tokens": list,
    "temperature": float,
    "avg_logprob": float,
    "compression_ratio": float,
    "no_speech_prob": float,
}


def test_the_sdk_requires_exactly_the_fields_checked_here() -> None:
    required = {n for n, f in TranscriptionSegment.model_fields.items() if f.is_required()}
    assert required == set(SEGMENT_TYPES)


def typed(segment: dict[str, Any]) -> None:
    """Each field of ``segment`` has the SDK's type (JSON numbers: an int is no float)."""
    for name, kind in SEGMENT_TYPES.items():
        value = segment[name]
        assert isinstance(value, (int, float) if kind is float else kind), (name, value)
        assert not isinstance(value, bool), name
    assert all(isinstance(t, int) for t in segment["tokens"])


async def verbose(http: httpx.AsyncClient, model: str = "fake-stt", **fields: str) -> Any:
    data = {"model": model, "response_format": "verbose_json", **fields}
    return await http.post(URL, data=data, files={"file": ("a.wav", tone_file(2.0))})


async def test_verbose_json_segments_carry_every_sdk_field(http: httpx.AsyncClient) -> None:
    body = (await verbose(http, temperature="0.4")).json()
    TranscriptionVerbose.model_validate(body)  # raises on a missing or mistyped field
    assert len(body["segments"]) == 2
    for segment in body["segments"]:
        typed(segment)
        TranscriptionSegment.model_validate(segment)
    first = body["segments"][0]
    # From the model: its tokens, window and scores.
    assert first["tokens"] == list(b" Segment 1 says hello.")
    assert (first["seek"], first["avg_logprob"], first["no_speech_prob"]) == (0, -0.2, 0.01)
    assert first["temperature"] == 0.4
    # Computed: the fake reports no compression ratio; Whisper's definition is zlib's.
    text = first["text"].encode()
    assert first["compression_ratio"] == round(len(text) / len(zlib.compress(text)), 4)


async def test_the_sdk_reads_every_segment_field(client: openai.AsyncOpenAI) -> None:
    result = await client.audio.transcriptions.create(
        model="fake-stt", file=("a.wav", tone_file(1.0)), response_format="verbose_json"
    )
    assert result.segments is not None
    segment = result.segments[0]
    assert segment.seek == 0 and segment.tokens and segment.temperature == 0.0
    assert segment.compression_ratio > 0 and segment.avg_logprob < 0


async def test_streamed_segments_carry_the_same_fields(http: httpx.AsyncClient) -> None:
    response = await verbose(http, stream="true")
    events = [json.loads(x[6:]) for x in response.text.splitlines() if x.startswith("data: ")]
    deltas = [e["segment"] for e in events if e["type"] == "transcript.text.delta"]
    assert len(deltas) == 2
    for segment in deltas:
        typed(segment)
    assert events[-1]["segments"] == deltas


async def test_translation_segments_carry_every_sdk_field(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    stt = next(m for m in fake.model_list if m.name == "fake-stt")
    fake.model_list.append(replace(stt, name="fake-translator", translates=True, languages=()))
    response = await http.post(
        "/v1/audio/translations",
        data={"model": "fake-translator", "response_format": "verbose_json"},
        files={"file": ("a.wav", tone_file(1.0))},
    )
    body = response.json()
    TranslationVerbose.model_validate(body)
    typed(body["segments"][0])


async def test_a_model_without_scores_serves_no_made_up_segments(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """avg_logprob and no_speech_prob are the SDK's required floats: a model that reports
    none cannot fill them, so verbose_json with segments is refused, as OpenAI refuses it
    for its models without them; words alone and the other formats are served."""
    stt = next(m for m in fake.model_list if m.name == "fake-stt")
    fake.model_list.append(replace(stt, name="fake-unscored", segment_scores=False))
    refused = await verbose(http, "fake-unscored")
    assert_openai_error(refused, 400, param="response_format", code="unsupported_value")
    asked = await verbose(http, "fake-unscored", **{"timestamp_granularities[]": "segment"})
    assert_openai_error(asked, 400, param="timestamp_granularities[]", code="unsupported_value")
    words = await verbose(http, "fake-unscored", **{"timestamp_granularities[]": "word"})
    assert words.status_code == 200 and "segments" not in words.json()
    assert len(words.json()["words"]) == 8
    srt = await http.post(
        URL,
        data={"model": "fake-unscored", "response_format": "srt"},
        files={"file": ("a.wav", tone_file(1.0))},
    )
    assert srt.status_code == 200 and "Segment 1 says hello." in srt.text
    assert len(fake.transcribe_calls) == 2  # the refusals never reached the model


def test_compression_ratio_is_whispers() -> None:
    looping = " the the the the the the the the the the the the the the the the"
    assert compression_ratio(looping) > 2.4 > compression_ratio(" A plain sentence.")
    assert compression_ratio("") == 0.0


def test_a_stretch_cut_out_by_vad_has_its_seek_in_the_whole_audio() -> None:
    segment = Segment(" Hi.", 0.5, 1.0, seek=0)
    moved = _shifted(segment, 12.34)
    assert (moved.seek, moved.start, moved.end) == (1234, 12.84, 13.34)


# -- the tensors ---------------------------------------------------------------------------


def response(**outputs: Any) -> streams.Outputs:
    """A Triton response: str -> BYTES [1], float -> FP32 [1], list -> INT32 [n]."""
    message = service_pb2.ModelInferResponse()
    for name, value in outputs.items():
        tensor = message.outputs.add(name=name)
        if isinstance(value, str):
            data = value.encode()
            tensor.datatype, tensor.shape[:] = "BYTES", [1]
            message.raw_output_contents.append(len(data).to_bytes(4, "little") + data)
        elif isinstance(value, list):
            tensor.datatype, tensor.shape[:] = "INT32", [len(value)]
            message.raw_output_contents.append(np.array(value, np.int32).tobytes())
        else:
            tensor.datatype, tensor.shape[:] = "FP32", [1]
            message.raw_output_contents.append(np.array([value], np.float32).tobytes())
    return streams.Outputs(message, final=True)


WHISPER_OUTPUTS = [
    spec("text", "TYPE_STRING", [1]),
    spec("start", "TYPE_FP32", [1]),
    spec("end", "TYPE_FP32", [1]),
    spec("avg_logprob", "TYPE_FP32", [1]),
    spec("no_speech_prob", "TYPE_FP32", [1]),
    spec("seek", "TYPE_INT32", [1]),
    spec("tokens", "TYPE_INT32", [-1]),
    spec("decode_temperature", "TYPE_FP32", [1]),
    spec("compression_ratio", "TYPE_FP32", [1]),
]


def test_whispers_segment_outputs_are_read_whole() -> None:
    """The tensors whisper_stt and whisper_base send (triton_repo/README.md)."""
    contract = audio_model(
        "transcription", [spec("audio", "TYPE_FP32", [-1])], WHISPER_OUTPUTS, languages="en"
    )
    assert contract is not None and contract.info().segment_scores
    outputs = response(
        text=" Hello.",
        start=0.0,
        end=1.5,
        avg_logprob=-0.25,
        no_speech_prob=0.125,
        seek=3000,
        tokens=[50363, 15947, 13],
        decode_temperature=0.5,
        compression_ratio=0.75,
    )
    segment = contract.segment(outputs, 2.0)
    assert segment is not None
    assert (segment.seek, segment.tokens, segment.temperature) == (3000, (50363, 15947, 13), 0.5)
    assert (segment.avg_logprob, segment.no_speech_prob, segment.compression_ratio) == (
        -0.25,
        0.125,
        0.75,
    )


def test_a_model_with_its_own_tensors_maps_them_or_reports_none() -> None:
    mapped = audio_model(
        "transcription",
        [spec("samples", "TYPE_FP32", [-1])],
        [spec("transcript", "TYPE_STRING", [1]), spec("confidence", "TYPE_FP32", [1])],
        openai_input_audio="samples",
        openai_output_text="transcript",
        openai_output_avg_logprob="confidence",
    )
    assert mapped is not None and not mapped.info().segment_scores  # no no_speech_prob
    segment = mapped.segment(response(transcript=" Hi.", confidence=-0.5), 1.0)
    assert segment is not None and segment.avg_logprob == -0.5
    assert (segment.no_speech_prob, segment.temperature, segment.compression_ratio) == (
        None,
        None,
        None,
    )
    assert (segment.seek, segment.tokens, segment.end) == (0, (), 1.0)


SPEECH_INPUTS = [spec("input_text", "TYPE_STRING", [1]), spec("style", "TYPE_STRING", [1])]


def test_instructions_reach_the_input_the_config_maps() -> None:
    contract = audio_model(
        "speech",
        SPEECH_INPUTS,
        [spec("waveform", "TYPE_FP32", [-1])],
        openai_input_text="input_text",
        openai_input_instructions="style",
        openai_output_audio="waveform",
        sample_rate="22050",
    )
    assert contract is not None
    info = contract.info()
    assert "instructions" in info.takes and "instructions" not in info.ignores
    sent = decoded(contract.synthesize("Hello.", "default", 1.0, "Speak softly."))
    assert text_of(sent["style"][2]) == ["Speak softly."]
    assert text_of(sent["input_text"][2]) == ["Hello."]
    assert "style" not in decoded(contract.synthesize("Hello.", "default", 1.0))


def test_a_voice_without_an_input_for_instructions_lists_them_as_ignored() -> None:
    contract = audio_model(
        "speech",
        SPEECH_INPUTS[:1],
        [spec("waveform", "TYPE_FP32", [-1])],
        openai_input_text="input_text",
        openai_output_audio="waveform",
        sample_rate="22050",
    )
    assert contract is not None
    info = contract.info()
    assert "instructions" in info.ignores and "instructions" not in info.takes
    sent = decoded(contract.synthesize("Hello.", "default", 1.0, "Speak softly."))
    assert list(sent) == ["input_text"]
