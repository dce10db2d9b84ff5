"""Speech in other languages with the fake backend: a multilingual model's language given,
detected and reported, /v1/audio/translations, and the ``task`` tensor of the custom
mapping (the real model: tests/integration/test_multilingual_e2e.py)."""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest

from gateway.backend import ModelInfo, Segment, TranscriptionOptions
from gateway.backend.fake import FakeBackend
from tests.support.audio import tone_file
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import make_settings, new_key, sdk, serve
from tests.support.triton import audio_model, decoded, spec, text_of

MULTI = ModelInfo(
    "fake-multi",
    "transcription",
    True,
    languages=("en", "es", "fr", "hi"),
    translates=True,
)
TRANSLATE_URL = "/v1/audio/translations"


@dataclass
class Multilingual(FakeBackend):
    """The fake backend, whose multilingual model hears Spanish when no language is given."""

    def __post_init__(self) -> None:
        self.model_list = [*self.model_list, MULTI]

    async def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        async for segment in super().transcribe(model, audio, options):
            yield replace(segment, language=options.language or "es")


@pytest.fixture
async def served() -> AsyncIterator[tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI]]:
    fake = Multilingual()
    settings = make_settings(models=["fake-chat", "fake-stt", "fake-multi"])
    async with serve(settings, fake) as (_, http, client):
        yield fake, http, client


async def test_a_language_left_out_is_detected_and_named_in_verbose_json(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    fake, _, client = served
    result = await client.audio.transcriptions.create(
        model="fake-multi", file=("a.wav", tone_file(1.0)), response_format="verbose_json"
    )
    assert fake.transcribe_calls[-1][2].language is None  # nothing sent: the model detects
    assert result.language == "spanish"  # OpenAI's name, not the code
    given = await client.audio.transcriptions.create(
        model="fake-multi",
        file=("a.wav", tone_file(1.0)),
        response_format="verbose_json",
        language="hi",
    )
    assert fake.transcribe_calls[-1][2].language == "hi" and given.language == "hindi"


async def test_a_language_the_model_does_not_list_is_400_naming_language(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    fake, http, _ = served
    files = {"file": ("a.wav", tone_file(1.0))}
    response = await http.post(
        "/v1/audio/transcriptions", data={"model": "fake-multi", "language": "de"}, files=files
    )
    error = assert_openai_error(response, 400, param="language", code="unsupported_language")
    assert "es" in error["message"]
    assert fake.transcribe_calls == []


async def test_translation_asks_the_model_to_translate_and_answers_in_english(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    fake, http, client = served
    result = await client.audio.translations.create(
        model="fake-multi", file=("a.wav", tone_file(2.0)), prompt="Meeting notes.", temperature=0.2
    )
    assert result.text == "Segment 1 says hello. Segment 2 says hello."
    options = fake.transcribe_calls[-1][2]
    assert (options.task, options.prompt, options.temperature) == (
        "translate",
        "Meeting notes.",
        0.2,
    )
    assert options.language is None
    # OpenAI's translation json is the text alone.
    files = {"file": ("a.wav", tone_file(1.0))}
    body = (await http.post(TRANSLATE_URL, data={"model": "fake-multi"}, files=files)).json()
    assert body == {"text": "Segment 1 says hello."}


@pytest.mark.parametrize("response_format", ["text", "srt", "vtt", "verbose_json"])
async def test_translation_formats(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI], response_format: str
) -> None:
    _, http, _ = served
    files = {"file": ("a.wav", tone_file(2.0))}
    data = {"model": "fake-multi", "response_format": response_format}
    response = await http.post(TRANSLATE_URL, data=data, files=files)
    assert response.status_code == 200, response.text
    if response_format == "text":
        assert response.text == "Segment 1 says hello. Segment 2 says hello.\n"
    elif response_format == "srt":
        assert response.text.startswith("1\n00:00:00,000 --> 00:00:01,000\nSegment 1")
    elif response_format == "vtt":
        assert response.text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nSegment 1")
    else:
        body = response.json()
        # Always english (the output's language), whatever the speech was.
        assert (body["task"], body["language"], body["duration"]) == ("translate", "english", 2.0)
        assert [s["text"] for s in body["segments"]] == [
            " Segment 1 says hello.",
            " Segment 2 says hello.",
        ]
        assert "usage" not in body and "words" not in body


async def test_a_model_that_does_not_translate_is_400_naming_model(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    fake, http, client = served
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.translations.create(model="fake-stt", file=("a.wav", tone_file(1.0)))
    assert refused.value.param == "model" and "does not translate" in refused.value.message
    files = {"file": ("a.wav", tone_file(1.0))}
    chat = await http.post(TRANSLATE_URL, data={"model": "fake-chat"}, files=files)
    assert_openai_error(chat, 400, param="model", code="model_not_supported")
    assert fake.transcribe_calls == []


@pytest.mark.parametrize(
    "field", ["language", "stream", "timestamp_granularities[]", "chunking_strategy", "foo"]
)
async def test_only_openais_translation_fields_are_taken(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI], field: str
) -> None:
    """Translation has fewer fields than transcription: the others are refused by name,
    never dropped (``language``: the output is always English)."""
    fake, http, _ = served
    data = {"model": "fake-multi", field: "es"}
    files = {"file": ("a.wav", tone_file(1.0))}
    response = await http.post(TRANSLATE_URL, data=data, files=files)
    assert_openai_error(response, 400, param=field)
    assert fake.transcribe_calls == []


async def test_translation_needs_the_key_to_allow_the_model_and_counts_usage(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    fake, http, _ = served
    key = (await new_key(http, models=["fake-stt"]))["key"]
    with pytest.raises(openai.PermissionDeniedError):
        await sdk(http, key).audio.translations.create(
            model="fake-multi", file=("a.wav", tone_file(1.0))
        )
    assert fake.transcribe_calls == []
    allowed = await new_key(http, models=["fake-multi"])
    await sdk(http, allowed["key"]).audio.translations.create(
        model="fake-multi", file=("a.wav", tone_file(3.0))
    )
    usage = (await http.get(f"/admin/keys/{allowed['id']}/usage")).json()
    assert (usage["requests"], usage["audio_seconds_in"]) == (1, 3.0)


async def test_models_list_says_which_models_translate(
    served: tuple[Multilingual, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, _, client = served
    models = {m.id: m.model_extra or {} for m in (await client.models.list()).data}
    assert models["fake-multi"]["translates"] is True
    assert models["fake-multi"]["languages"] == ["en", "es", "fr", "hi"]
    assert models["fake-stt"]["translates"] is False
    assert "translates" not in models["fake-chat"] or models["fake-chat"]["translates"] is None


# -- the custom mapping's task tensor ----------------------------------------------------

STT_INPUTS = [spec("audio", "TYPE_FP32", [-1]), spec("language", "TYPE_STRING", [1])]
STT_OUTPUTS = [spec("text", "TYPE_STRING", [1])]


def test_a_model_translates_when_it_says_so_and_has_the_task_input() -> None:
    with_task = [*STT_INPUTS, spec("task", "TYPE_STRING", [1])]
    model = audio_model("transcription", with_task, STT_OUTPUTS, translates="true")
    assert model is not None and model.info().translates
    silence = np.zeros(1600, np.float32)
    sent = decoded(model.transcribe(silence, TranscriptionOptions(task="translate")))
    assert text_of(sent["task"][2]) == ["translate"]
    plain = decoded(model.transcribe(np.zeros(1600, np.float32), TranscriptionOptions()))
    assert text_of(plain["task"][2]) == ["transcribe"]
    # Saying so is not enough without the input, and the input alone says nothing.
    no_input = audio_model("transcription", STT_INPUTS, STT_OUTPUTS, translates="true")
    unsaid = audio_model("transcription", with_task, STT_OUTPUTS)
    assert no_input is not None and unsaid is not None
    assert not no_input.info().translates and not unsaid.info().translates


def test_a_transcription_model_without_the_task_input_gets_no_task_tensor() -> None:
    """whisper_stt and the other transcription models keep working as they were."""
    model = audio_model("transcription", STT_INPUTS, STT_OUTPUTS)
    assert model is not None
    sent = decoded(model.transcribe(np.zeros(1600, np.float32), TranscriptionOptions()))
    assert set(sent) == {"audio"}
    with pytest.raises(Exception, match="does not translate"):
        model.transcribe(np.zeros(1600, np.float32), TranscriptionOptions(task="translate"))


async def test_input_audio_parts_go_to_the_multilingual_model_chosen_and_are_detected() -> None:
    """Chat's ``input_audio`` parts have no language field (OpenAI's): with
    GATEWAY_VOICE_TRANSCRIPTION_MODEL naming a multilingual model, each part goes to it and
    its language is detected (none is sent)."""
    fake = Multilingual()
    settings = make_settings(
        models=["fake-chat", "fake-multi"], voice_transcription_model="fake-multi"
    )
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(tone_file(1.0)).decode(), "format": "wav"},
    }
    body = {"model": "fake-chat", "messages": [{"role": "user", "content": [part]}]}
    async with serve(settings, fake) as (_, http, _sdk):
        answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    [(model, _, options)] = fake.transcribe_calls
    assert (model, options.language, options.task) == ("fake-multi", None, "transcribe")
    assert "Segment 1 says hello." in fake.calls[-1].prompt  # the transcript reached chat
