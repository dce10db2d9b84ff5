"""Model profiles: which one a config picks, the request tensors built from the config, and
responses read back into OpenAI's terms (the configs are the backends' own; see
triton_repo/README.md for the stand-ins that run them end to end)."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer as Encoder
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tritonclient.grpc import service_pb2

from gateway.backend import ChatImage, ImageInput, SamplingOptions, TranscriptionOptions
from gateway.backend import grpc_streams as streams
from gateway.backend.profiles import ModelConfig, TensorSpec, contract_for
from gateway.backend.profiles.model_config import encode
from gateway.backend.profiles.text import TextReader, TextRules
from gateway.backend.tokenizer import Tokenizer, Tokenizers
from gateway.errors import InvalidRequestError
from tests.support.triton import (
    audio_model,
    decoded,
    response,
    spec,
    text_of,
    trtllm_ensemble,
    vllm,
)

# -- which profile, which release ------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "told", "key", "counts"),
    [
        ("24.05", "24.11 or older", None, False),
        ("24.12", "24.12", None, True),
        ("25.05", "25.01-25.10", "guided_decoding", True),
        ("25.11", "25.11+", "structured_outputs", True),
    ],
)
def test_vllm_release_is_read_from_the_declared_inputs(
    release: str, told: str, key: str | None, counts: bool
) -> None:
    contract = contract_for(vllm(release))
    assert contract is not None
    info = contract.info()
    assert (info.profile, info.task, info.release) == ("vllm", "chat", told)
    # The model's own counts are read where its release reports them; else the gateway counts.
    rules = contract.generate("Hi", SamplingOptions(max_tokens=5), stream=True)[1]
    assert (rules.completion_tokens_output is not None) is counts
    if key is None:
        assert info.structured_outputs == () and "response_format" not in info.takes
    else:
        assert info.structured_outputs_key == key and "json" in info.structured_outputs


def test_trtllm_is_recognised_by_its_engine_step_or_bls_parameter() -> None:
    ensemble = ModelConfig.from_json("ensemble", trtllm_ensemble())
    assert contract_for(ensemble).profile == "trtllm"  # type: ignore[union-attr]
    bls = ModelConfig.from_json(
        "tensorrt_llm_bls",
        {
            "backend": "python",
            "max_batch_size": 64,
            "input": trtllm_ensemble()["input"],
            "parameters": {"tensorrt_llm_model_name": {"string_value": "tensorrt_llm"}},
        },
    )
    assert contract_for(bls).info().task == "chat"  # type: ignore[union-attr]
    # An ensemble of other steps is no LLM the gateway knows: no task, not listed.
    other = {**trtllm_ensemble(), "ensemble_scheduling": {"step": [{"model_name": "resnet"}]}}
    assert contract_for(ModelConfig.from_json("e", other)) is None


def test_a_custom_model_with_one_text_tensor_each_way_needs_only_its_task() -> None:
    config = ModelConfig.from_json(
        "seed_llm",
        {
            "backend": "python",
            "max_batch_size": 72,
            "input": [spec("prompt", "TYPE_STRING", [1], optional=False)],
            "output": [spec("generated_text", "TYPE_STRING", [1])],
            "parameters": {"openai_task": {"string_value": "chat"}},
        },
    )
    contract = contract_for(config)
    assert contract is not None and contract.profile == "custom"
    assert contract.info().takes == frozenset({"stop"})
    inputs, rules = contract.generate("Hi", SamplingOptions(), stream=True)
    assert decoded(inputs) == {"prompt": ("BYTES", [1, 1], struct.pack("<I", 2) + b"Hi")}
    assert rules.text_output == "generated_text"


# -- requests built from the config ----------------------------------------------------


def test_trtllm_request_has_the_batch_dimension_and_the_release_names() -> None:
    contract = contract_for(ModelConfig.from_json("ensemble", trtllm_ensemble("random_seed")))
    assert contract is not None
    options = SamplingOptions(max_tokens=7, temperature=0.5, seed=3, stop=["\n\n", "END"])
    inputs = decoded(contract.generate("Hi", options, stream=False)[0])
    assert inputs["max_tokens"] == ("INT32", [1, 1], np.int32(7).tobytes())
    assert inputs["random_seed"][:2] == ("UINT64", [1, 1])
    assert inputs["temperature"] == ("FP32", [1, 1], np.float32(0.5).tobytes())
    assert inputs["stop_words"][:2] == ("BYTES", [1, 2])
    assert text_of(inputs["stop_words"][2]) == ["\n\n", "END"]
    # Not decoupled: no streaming asked, whatever the client wanted.
    assert inputs["stream"][2] == b"\x00"


def test_values_a_tensor_cannot_hold_are_the_clients_400() -> None:
    contract = contract_for(ModelConfig.from_json("ensemble", trtllm_ensemble()))
    assert contract is not None
    with pytest.raises(InvalidRequestError) as negative:
        contract.generate("Hi", SamplingOptions(max_tokens=5, seed=-1), stream=False)
    assert negative.value.param == "seed" and "UINT64" in negative.value.message
    with pytest.raises(InvalidRequestError) as huge:
        contract.generate("Hi", SamplingOptions(max_tokens=2**31), stream=False)
    assert huge.value.param == "max_tokens"


def test_vllm_sends_only_the_inputs_its_release_has() -> None:
    options = SamplingOptions(max_tokens=5, constraint={"json_object": True})
    old = contract_for(vllm("24.05"))
    assert old is not None
    sent = decoded(old.generate("Hi", options, stream=True)[0])
    assert set(sent) == {"text_input", "stream", "sampling_parameters", "exclude_input_in_output"}
    new = contract_for(vllm("25.05"))
    assert new is not None
    info = new.info()
    options = SamplingOptions(
        max_tokens=5, constraint={"json_object": True}, constraint_key=info.structured_outputs_key
    )
    params = json.loads(
        text_of(decoded(new.generate("Hi", options, stream=True)[0])["sampling_parameters"][2])[0]
    )
    # The constraint is a JSON string under the release's key, as the backend reads it.
    assert json.loads(params["guided_decoding"]) == {"json_object": True}


EXTRAS = {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 3}


def test_vllm_takes_its_sampling_extensions_under_their_own_names() -> None:
    contract = contract_for(vllm("24.12"))
    assert contract is not None
    assert {*EXTRAS, "ignore_eos"} <= contract.info().takes
    options = SamplingOptions(max_tokens=5, ignore_eos=True, **EXTRAS)  # type: ignore[arg-type]
    sent = decoded(contract.generate("Hi", options, stream=True)[0])
    params = json.loads(text_of(sent["sampling_parameters"][2])[0])
    assert params == {"max_tokens": 5, "ignore_eos": True, **EXTRAS}


def test_a_vllm_contract_model_that_is_not_vllm_lists_the_extensions_it_takes() -> None:
    contract = contract_for(vllm("24.12", sampling_extensions="top_k, min_tokens"))
    assert contract is not None
    takes = contract.info().takes
    assert {"top_k", "min_tokens"} <= takes
    assert not {"min_p", "repetition_penalty", "ignore_eos"} & takes


@pytest.mark.parametrize(
    ("extensions", "kept"),
    [(None, True), ("top_k,include_stop_str_in_output", True), ("top_k", False)],
)
def test_vllm_keeps_stop_strings_for_the_gateway_to_cut_where_the_model_can(
    extensions: str | None, kept: bool
) -> None:
    """vLLM is asked to keep the stop string, so the gateway cuts it and knows which one
    ended the answer; a not-vLLM model that does not list the field cuts it itself."""
    config = vllm("25.11") if extensions is None else vllm("25.11", sampling_extensions=extensions)
    contract = contract_for(config)
    assert contract is not None
    options = SamplingOptions(max_tokens=5, stop=["END", "\n"])
    inputs, rules = contract.generate("Hi", options, stream=True)
    params = json.loads(text_of(decoded(inputs)["sampling_parameters"][2])[0])
    assert params["stop"] == ["END", "\n"]
    assert params.get("include_stop_str_in_output", False) is kept
    assert rules.stops == (("END", "\n") if kept else ())
    inputs, rules = contract.generate("Hi", SamplingOptions(max_tokens=5), stream=True)
    assert "include_stop_str_in_output" not in text_of(decoded(inputs)["sampling_parameters"][2])[0]
    assert rules.stops == ()


def test_trtllm_takes_the_extensions_it_has_inputs_for_in_its_names() -> None:
    ensemble = trtllm_ensemble("random_seed")
    ensemble["input"] += [
        spec("top_k", "TYPE_INT32", [1]),
        spec("repetition_penalty", "TYPE_FP32", [1]),
        spec("min_length", "TYPE_INT32", [1]),
    ]
    contract = contract_for(ModelConfig.from_json("ensemble", ensemble))
    assert contract is not None
    takes = contract.info().takes
    assert {"top_k", "repetition_penalty", "min_tokens"} <= takes
    assert not {"min_p", "ignore_eos"} & takes
    options = SamplingOptions(max_tokens=7, top_k=-1, repetition_penalty=1.5, min_tokens=2)
    inputs = decoded(contract.generate("Hi", options, stream=False)[0])
    # vLLM's -1 (no cut) is TensorRT-LLM's 0; min_tokens is min_length before r25.05.
    assert inputs["top_k"] == ("INT32", [1, 1], np.int32(0).tobytes())
    assert inputs["repetition_penalty"] == ("FP32", [1, 1], np.float32(1.5).tobytes())
    assert inputs["min_length"] == ("INT32", [1, 1], np.int32(2).tobytes())
    assert (
        "top_k"
        not in contract_for(  # type: ignore[union-attr]
            ModelConfig.from_json("ensemble", trtllm_ensemble())
        )
        .info()
        .takes
    )


# -- responses read back ---------------------------------------------------------------


def reader(**rules: Any) -> TextReader:
    return TextReader(TextRules(text_output="text_output", **rules), "PROMPT", lambda t: len(t))


def test_stop_word_kept_by_the_engine_is_cut_and_ends_the_stream() -> None:
    text = reader(stops=("END",), max_tokens=50)
    pieces = [text.read(response(text_output=p)) for p in ("Hello wor", "ld E", "ND more")]
    assert [p.text if p else "" for p in pieces] == ["Hello wor", "ld ", ""]
    assert text.done
    last = text.finish()
    assert (last.text, last.finish_reason, last.stop_sequence) == ("", "stop", "END")


@pytest.mark.parametrize(
    ("pieces", "matched"),
    [
        (("Say STOP", " or END now"), "STOP"),  # the one met first in the text
        (("Say EN", "D or STOP"), "END"),  # met across responses
        (("Say ST", "OP"), "STOP"),
        (("Say nothing", ""), None),  # the model's own end: no stop string
    ],
)
def test_the_last_chunk_names_the_stop_string_the_text_was_cut_at(
    pieces: tuple[str, ...], matched: str | None
) -> None:
    text = reader(stops=("END", "STOP"))
    sent = "".join(p.text for p in (text.read(response(text_output=x)) for x in pieces) if p)
    last = text.finish()
    assert (sent + last.text, last.stop_sequence) == (
        ("Say " if matched else "Say nothing"),
        matched,
    )
    assert last.finish_reason == "stop"


def test_cumulative_text_holds_back_a_split_character() -> None:
    text = reader(cumulative=True)
    sent = [text.read(response(text_output=p)) for p in ("na", "na\ufffd", "naïve")]
    assert [p.text if p else None for p in sent] == ["na", None, "ïve"]


def test_delta_bytes_of_a_split_character_are_joined() -> None:
    text = reader()
    first = text.read(response(text_output=b"caf" + b"\xc3"))
    second = text.read(response(text_output=b"\xa9!"))
    assert (first and first.text, second and second.text) == ("caf", "é!")


def test_an_echoed_prompt_is_dropped() -> None:
    text = reader(echo="PROMPT")
    chunk = text.read(response(final=True, text_output="PROMPT answer"))
    assert chunk is not None and chunk.text == " answer"


def test_without_a_finish_reason_length_is_derived_and_counts_are_estimated() -> None:
    text = reader(max_tokens=6)  # the counter here counts characters
    text.read(response(text_output="abcdef"))
    last = text.finish()
    assert (last.finish_reason, last.completion_tokens, last.prompt_tokens) == ("length", 6, 6)
    assert last.estimated


def test_reported_counts_and_finish_reason_are_the_models() -> None:
    text = reader(
        finish_output="finish_reason",
        prompt_tokens_output="num_input_tokens",
        completion_tokens_output="num_output_tokens",
    )
    first = text.read(
        response(text_output="a", finish_reason="None", num_input_tokens=3, num_output_tokens=1)
    )
    text.read(response(text_output="b", finish_reason="abort", num_output_tokens=1))
    last = text.finish()
    assert first is not None and first.prompt_tokens == 3
    assert (last.finish_reason, last.estimated) == ("stop", False)  # abort is no OpenAI value


# -- speech and transcription with their own tensors -------------------------------------


def test_fp32_speech_becomes_int16_at_the_models_rate() -> None:
    contract = audio_model(
        "speech",
        [spec("input_text", "TYPE_STRING", [1])],
        [spec("waveform", "TYPE_FP32", [-1])],
        openai_input_text="input_text",
        openai_output_audio="waveform",
        sample_rate="22050",
    )
    assert contract is not None and contract.info().voices == ("default",)
    message = service_pb2.ModelInferResponse()
    message.outputs.add(name="waveform", datatype="FP32", shape=[3])
    message.raw_output_contents.append(np.array([0.5, -1.0, 2.0], np.float32).tobytes())
    chunk = contract.audio(streams.Outputs(message, final=True))
    assert chunk is not None and chunk.sample_rate == 22050
    assert chunk.samples.tolist() == [16383, -32767, 32767]


def test_transcription_audio_is_resampled_to_the_models_rate() -> None:
    contract = audio_model(
        "transcription",
        [spec("audio_samples", "TYPE_FP32", [-1])],
        [spec("transcript", "TYPE_STRING", [1])],
        openai_input_audio="audio_samples",
        openai_output_text="transcript",
        sample_rate="8000",
    )
    assert contract is not None and contract.info().takes == frozenset()
    sent = decoded(contract.transcribe(np.zeros(16_000, np.float32), TranscriptionOptions()))
    assert sent["audio_samples"][:2] == ("FP32", [8000])


# -- tokenizers ----------------------------------------------------------------------------


def make_tokenizer(
    folder: Path, template: str | None = "{{ bos_token }}{{ messages[0].content }}"
) -> Path:
    words = {"[UNK]": 0, "hello": 1, "world": 2}
    encoder = Encoder(WordLevel(words, unk_token="[UNK]"))
    encoder.pre_tokenizer = Whitespace()
    encoder.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {"bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    if template is not None:
        config["chat_template"] = [{"name": "default", "template": template}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tokenizer_gives_template_special_tokens_and_counts(tmp_path: Path) -> None:
    tokenizer = Tokenizer.load(make_tokenizer(tmp_path))
    assert tokenizer.chat_template == "{{ bos_token }}{{ messages[0].content }}"
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")
    assert tokenizer.count("hello world hello") == 3
    contract = contract_for(vllm("24.05"), tokenizer=tokenizer)
    assert contract is not None and contract.info().chat_template == tokenizer.chat_template
    assert contract.count("hello world") == 2


def test_a_tokenizer_that_cannot_be_read_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert Tokenizers({"m": tmp_path}).get("m") is None


def test_a_number_mapped_to_a_bytes_input_is_its_text_and_floats_are_checked() -> None:
    seed = decoded([encode(TensorSpec("seed", "BYTES", (1,)), 12345)])["seed"]
    assert seed == ("BYTES", [1], struct.pack("<I", 5) + b"12345")
    with pytest.raises(InvalidRequestError):
        encode(TensorSpec("temperature", "FP16", (1,)), 70000.0, param="temperature")


def test_long_stop_strings_cost_only_their_own_length_per_chunk() -> None:
    text = reader(stops=("x" * 256,))
    pieces = [text.read(response(text_output="abcd")) for _ in range(2000)]
    whole = "".join(p.text for p in pieces if p) + text.finish().text
    assert whole == "abcd" * 2000 and not text.done


# -- images (serving/images/ reads them; the profile puts them in the model's tensors) ----

PNG = ChatImage(b"\x89PNG-file", "png", 4, 3)
JPEG = ChatImage(b"\xff\xd8-file", "jpeg", 2, 2)


def test_only_a_model_said_to_see_images_takes_them() -> None:
    seeing = contract_for(vllm("25.11", vision="true"))
    blind = contract_for(vllm("25.11"))
    old = contract_for(vllm("24.12", vision="true"))  # no image input at this release
    assert seeing is not None and blind is not None and old is not None
    assert seeing.info().image_input == ImageInput(max_images=None, formats=())
    assert blind.info().image_input is None and old.info().image_input is None
    with pytest.raises(InvalidRequestError):
        blind.generate("Hi", SamplingOptions(), stream=False, images=(PNG,))
    limited = contract_for(vllm("25.11", vision="true", max_images="2"))
    assert limited is not None and limited.info().image_input == ImageInput(max_images=2)


def test_vllm_gets_each_image_as_plain_base64_in_order() -> None:
    contract = contract_for(vllm("25.11", vision="true"))
    assert contract is not None
    inputs = decoded(contract.generate("Hi", SamplingOptions(), False, (PNG, JPEG))[0])
    kind, shape, raw = inputs["image"]
    assert (kind, shape) == ("BYTES", [2])
    assert text_of(raw) == [base64.b64encode(i.data).decode() for i in (PNG, JPEG)]
    assert "image" not in decoded(contract.generate("Hi", SamplingOptions(), False)[0])


def test_trtllm_gets_one_jpeg_data_url_in_its_batch_row() -> None:
    config = trtllm_ensemble()
    config["input"].append(spec("image_url_input", "TYPE_STRING", [1]))
    config["parameters"] = {"vision": {"string_value": "true"}}
    contract = contract_for(ModelConfig.from_json("multimodal", config))
    assert contract is not None
    assert contract.info().image_input == ImageInput(max_images=1, formats=("jpeg",))
    options = SamplingOptions(max_tokens=5)
    kind, shape, raw = decoded(contract.generate("Hi", options, False, (JPEG,))[0])[
        "image_url_input"
    ]
    assert (kind, shape) == ("BYTES", [1, 1])
    assert text_of(raw) == ["data:image/jpeg;base64," + base64.b64encode(JPEG.data).decode()]


def test_a_custom_model_maps_its_image_input() -> None:
    config = ModelConfig.from_json(
        "captioner",
        {
            "backend": "python",
            "input": [
                spec("prompt", "TYPE_STRING", [1], optional=False),
                spec("pictures", "TYPE_STRING", [-1]),
            ],
            "output": [spec("caption", "TYPE_STRING", [1])],
            "parameters": {
                "openai_task": {"string_value": "chat"},
                "openai_input_prompt": {"string_value": "prompt"},
                "openai_input_image": {"string_value": "pictures"},
                "openai_output_text": {"string_value": "caption"},
            },
        },
    )
    contract = contract_for(config)
    assert contract is not None and contract.info().image_input == ImageInput()
    inputs = decoded(contract.generate("Hi", SamplingOptions(), False, (PNG, JPEG))[0])
    kind, shape, raw = inputs["pictures"]
    assert (kind, shape) == ("BYTES", [2])
    # The encoded files as they came, one element each (no base64).
    assert raw == b"".join(struct.pack("<I", len(i.data)) + i.data for i in (PNG, JPEG))
