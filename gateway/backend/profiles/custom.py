"""The ``custom`` profile: a model with its own tensor names, mapped in its config.

``config.pbtxt`` ``parameters`` name the tensors, so the repository stays the one source
of truth (see ``triton_repo/README.md``, "Fronting your Triton"):

- ``openai_input_<field>``: the input that takes an OpenAI field. Chat: ``prompt`` (the
  rendered prompt), ``image`` (BYTES: the images' encoded files, one element each, in
  the prompt's order; mapping it says the model sees images), ``max_tokens``,
  ``temperature``, ``top_p``, ``seed``, ``stop``, ``presence_penalty``,
  ``frequency_penalty``, ``stream``, and vLLM's ``top_k``, ``min_p``,
  ``repetition_penalty``, ``min_tokens``, ``ignore_eos`` (vLLM's meanings);
  speech: ``text``, ``voice``, ``speed``, ``instructions`` (how to speak: a model without
  it reads the same words in its one style, and lists ``instructions`` as ignored);
  transcription: ``audio`` (FP32 samples at ``sample_rate``, or the encoded file as
  BYTES), ``language``, ``prompt``, ``temperature``, ``task`` (``transcribe`` or
  ``translate``); embeddings: ``text``, ``input_type``. Chat's ``lora`` (BYTES): the name
  of the LoRA adapter a request asked for (one of ``lora_adapters``), absent without.
- ``openai_output_<field>``: the output that returns it. Chat: ``text``,
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``; speech: ``audio`` (FP32 in
  [-1, 1] or INT16 samples), ``sample_rate``; transcription: ``text``, and Whisper's
  segment fields ``start``, ``end``, ``words``, ``language``, ``seek``, ``tokens``,
  ``temperature``, ``compression_ratio``, ``avg_logprob``, ``no_speech_prob``; embeddings:
  ``embedding``, ``prompt_tokens``.
- ``openai_output_text_mode``: ``delta`` (each response holds new text, the default) or
  ``cumulative``; ``sample_rate``: the rate of audio tensors; ``translates``: ``true`` for a
  transcription model that also translates into English (it needs the ``task`` input).

A field without a parameter uses the tensor of the gateway's own contract when the model
declares it (``text_input`` / ``text_output``; ``text``, ``voice``, ``speed`` -> ``audio``,
``sample_rate``; ...), and a chat model with one BYTES input and one BYTES output needs no
mapping at all. A parameter the client sets that no tensor takes is refused with a 400
unless the config lists it in ``openai_ignore``.
"""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gateway.backend import grpc_streams as streams
from gateway.backend.base import (
    OPTION_PARAMETERS,
    AudioChunk,
    ChatImage,
    ImageInput,
    SamplingOptions,
    Segment,
    TranscriptionOptions,
    Word,
)
from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.model_config import ModelConfig, TensorSpec
from gateway.backend.profiles.text import TextRules
from gateway.errors import BackendError, InvalidRequestError

#: The tensors of the gateway's own contract (``triton_repo/README.md``), used for a field
#: the config does not map.
DEFAULT_INPUTS = {
    "chat": {"prompt": "text_input", "stream": "stream"},
    "speech": {"text": "text", "voice": "voice", "speed": "speed", "instructions": "instructions"},
    "transcription": {
        "audio": "audio",
        "language": "language",
        "prompt": "prompt",
        "temperature": "temperature",
        "word_timestamps": "word_timestamps",
        "task": "task",
    },
    "embeddings": {"text": "text_input", "input_type": "input_type"},
}
DEFAULT_OUTPUTS = {
    "chat": {"text": "text_output"},
    "speech": {"audio": "audio", "sample_rate": "sample_rate"},
    "transcription": {
        "text": "text",
        "start": "start",
        "end": "end",
        "words": "words",
        "avg_logprob": "avg_logprob",
        "no_speech_prob": "no_speech_prob",
        "language": "language",
        "seek": "seek",
        "tokens": "tokens",
        # Not "temperature": that name is the request's input.
        "temperature": "decode_temperature",
        "compression_ratio": "compression_ratio",
    },
    "embeddings": {"embedding": "embedding", "prompt_tokens": "num_input_tokens"},
}
#: Chat's sampling fields a model may map (``stop`` the gateway enforces when none does).
_CHAT_FIELDS = tuple(p for p in OPTION_PARAMETERS if p != "stop")
_STT_RATE = 16_000


def _only_bytes(specs: Mapping[str, TensorSpec]) -> str | None:
    """The one BYTES tensor among ``specs``, when there is exactly one."""
    names = [n for n, s in specs.items() if s.datatype == "BYTES"]
    return names[0] if len(names) == 1 else None


def _mapped(config: ModelConfig) -> bool:
    return any(k.startswith(("openai_input_", "openai_output_")) for k in config.parameters)


class CustomContract(Contract):
    profile = "custom"

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        return _mapped(config) and bool(config.parameters.get("openai_task"))

    def input(self, field: str) -> str | None:
        """The input that takes ``field``, if the model has one."""
        name = self.config.parameters.get(f"openai_input_{field}")
        if name is None:
            name = DEFAULT_INPUTS.get(self.task() or "", {}).get(field)
            if field == "prompt" and not self.has(name):
                name = _only_bytes(self.config.inputs)
        return name if self.has(name) else None

    def output_of(self, field: str) -> str | None:
        name = self.config.parameters.get(f"openai_output_{field}")
        if name is None:
            name = DEFAULT_OUTPUTS.get(self.task() or "", {}).get(field)
            if field == "text" and self.task() == "chat" and self.output(name) is None:
                name = _only_bytes(self.config.outputs)
        return self.output(name)

    def takes(self) -> frozenset[str]:
        task = self.task()
        if task == "chat":
            return frozenset({f for f in _CHAT_FIELDS if self.input(f)} | {"stop"})
        if task == "speech":
            return frozenset(f for f in ("speed", "instructions") if self.input(f))
        if task == "transcription":
            return frozenset(f for f in ("language", "prompt", "temperature") if self.input(f))
        return frozenset()

    def adapters(self) -> tuple[str, ...]:
        names = tuple(self.lora_entries())
        if names and self.input("lora") is None:
            self.unusable_adapters(names, "no openai_input_lora input takes the adapter's name")
            return ()
        return names

    def unheeded(self) -> frozenset[str]:
        # The OpenAI Agents SDK sends instructions with every speech request: a voice that
        # cannot follow them still reads the same words.
        if self.task() == "speech" and self.input("instructions") is None:
            return frozenset({"instructions"})
        return frozenset()

    def segment_scores(self) -> bool:
        if self.task() != "transcription":
            return False
        return all(self.output_of(f) for f in ("avg_logprob", "no_speech_prob"))

    def translates(self) -> bool:
        declared = self.config.parameters.get("translates", "").strip().lower() == "true"
        return declared and self.task() == "transcription" and self.input("task") is not None

    # -- chat --------------------------------------------------------------------------

    def image_input(self) -> ImageInput | None:
        name = self.input("image")
        if name is None or self.config.inputs[name].datatype != "BYTES":
            return None
        return ImageInput(max_images=self.image_bound(name))

    def generate(
        self,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> tuple[list[streams.Input], TextRules]:
        if self.task() != "chat":
            raise self._unsupported("text generation")
        self._images_refused(images)
        target = self.input("prompt")
        text = self.output_of("text")
        if target is None or text is None:
            raise BackendError(
                f"The model '{self.config.name}' maps no prompt input or text output "
                "(openai_input_prompt / openai_output_text).",
                code="model_config_error",
            )
        streaming = self.streaming(stream)
        inputs = [self.config.tensor(target, prompt)]
        for field in _CHAT_FIELDS:
            name, value = self.input(field), getattr(options, field)
            if name is not None and value is not None:
                inputs.append(self.config.tensor(name, value, field))
        image_input = self.input("image")
        if images and image_input is not None:
            # The encoded files as they came (JPEG, PNG, GIF, WebP), one element each.
            inputs.append(self.config.tensor(image_input, [image.data for image in images]))
        stop_input = self.input("stop")
        if stop_input is not None and options.stop:
            inputs.append(self.config.tensor(stop_input, list(options.stop), "stop"))
        stream_input = self.input("stream")
        if stream_input is not None:
            inputs.append(self.config.tensor(stream_input, streaming))
        lora_input = self.input("lora")
        if lora_input is not None and options.lora_name is not None:
            inputs.append(self.config.tensor(lora_input, options.lora_name))
        mode = self.config.parameters.get("openai_output_text_mode", "delta").strip().lower()
        rules = TextRules(
            text_output=text,
            cumulative=mode == "cumulative",
            # Where the model takes stop strings, it may still keep them; cut either way.
            stops=tuple(options.stop),
            max_tokens=options.max_tokens,
            finish_output=self.output_of("finish_reason"),
            prompt_tokens_output=self.output_of("prompt_tokens"),
            completion_tokens_output=self.output_of("completion_tokens"),
            completion_tokens_cumulative=mode == "cumulative",
        )
        return inputs, rules

    # -- speech ------------------------------------------------------------------------

    def voices(self) -> tuple[str, ...]:
        declared = super().voices()
        if declared or self.task() != "speech" or self.input("voice"):
            return declared
        return ("default",)  # one voice: OpenAI's voice names map onto it

    def synthesize(
        self, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> list[streams.Input]:
        target = self.input("text")
        if self.task() != "speech" or target is None:
            raise self._unsupported("speech")
        values: dict[str, object] = {target: text}
        if (name := self.input("voice")) is not None:
            values[name] = voice
        if (name := self.input("speed")) is not None:
            values[name] = speed
        if (name := self.input("instructions")) is not None and instructions:
            values[name] = instructions
        return [self.config.tensor(n, v) for n, v in values.items()]

    def audio(self, outputs: streams.Outputs) -> AudioChunk | None:
        name = self.output_of("audio")
        samples = outputs.array(name) if name is not None else None
        if samples is None or not samples.size:
            return None
        rate_output = self.output_of("sample_rate")
        reported = outputs.first_number(rate_output) if rate_output is not None else None
        rate = int(reported) if reported else self.sample_rate()
        if not rate:
            raise BackendError(
                f"The model '{self.config.name}' declares no sample rate (a 'sample_rate' "
                "parameter or output).",
                code="model_config_error",
            )
        flat = samples.reshape(-1)
        if flat.dtype.kind == "f":
            flat = (np.clip(flat, -1.0, 1.0) * 32767.0).astype(np.int16)
        return AudioChunk(flat.astype(np.int16, copy=False), rate)

    # -- transcription -----------------------------------------------------------------

    def transcribe(
        self, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> list[streams.Input]:
        target = self.input("audio")
        if self.task() != "transcription" or target is None:
            raise self._unsupported("transcription")
        inputs = []
        if self.config.inputs[target].datatype == "BYTES":
            inputs.append(self.config.tensor(target, options.file or _wav(audio)))
        else:
            rate = self.sample_rate() or _STT_RATE
            inputs.append(self.config.tensor(target, _resample(audio, rate)))
        optional: dict[str, object | None] = {
            "language": options.language,
            "prompt": options.prompt,
            "temperature": options.temperature,
            "word_timestamps": options.word_timestamps,
            # Sent where the model has the input, so a transcription is never taken for a
            # translation by a model whose own default differs.
            "task": options.task,
        }
        if options.task != "transcribe" and not self.translates():
            raise InvalidRequestError(
                f"The model '{self.config.name}' does not translate.",
                param="model",
                code="model_not_supported",
            )
        for field, value in optional.items():
            name = self.input(field)
            if name is not None and value is not None:
                inputs.append(self.config.tensor(name, value, field))
        return inputs

    def segment(self, outputs: streams.Outputs, duration: float) -> Segment | None:
        name = self.output_of("text")
        text = outputs.first_bytes(name) if name is not None else None
        if text is None:
            return None  # the empty final response

        def told(field: str) -> float | None:
            found = self.output_of(field)
            return outputs.first_number(found) if found is not None else None

        def number(field: str, default: float) -> float:
            value = told(field)
            return default if value is None else value

        words_output = self.output_of("words")
        words = json.loads(outputs.first_bytes(words_output) or b"[]") if words_output else []
        language = self.output_of("language")
        tokens_output = self.output_of("tokens")
        tokens = outputs.array(tokens_output) if tokens_output is not None else None
        return Segment(
            text=text.decode("utf-8", errors="replace"),
            start=number("start", 0.0),
            end=number("end", duration),
            words=tuple(Word(w["word"], w["start"], w["end"]) for w in words),
            avg_logprob=told("avg_logprob"),
            no_speech_prob=told("no_speech_prob"),
            language=(outputs.first_bytes(language) or b"").decode() if language else "",
            seek=int(number("seek", 0.0)),
            tokens=tuple(int(t) for t in tokens.reshape(-1)) if tokens is not None else (),
            temperature=told("temperature"),
            compression_ratio=told("compression_ratio"),
        )

    # -- embeddings --------------------------------------------------------------------

    def embed(self, texts: list[str], input_type: str | None) -> list[list[streams.Input]]:
        target = self.input("text")
        if self.task() != "embeddings" or target is None:
            raise self._unsupported("embeddings")
        batches = [texts] if self.config.batched else [[t] for t in texts]
        requests = []
        for batch in batches:
            inputs = [self._rows(target, batch)]
            kind = self.input("input_type")
            if input_type is not None and kind is not None:
                inputs.append(self._rows(kind, [input_type] * len(batch)))
            requests.append(inputs)
        return requests

    def _rows(self, name: str, values: list[str]) -> streams.Input:
        if self.config.batched:
            return self.config.rows(name, values)
        return self.config.tensor(name, values[0])

    def embeddings(self, outputs: list[streams.Outputs]) -> tuple[list[list[float]], list[int]]:
        name = self.output_of("embedding")
        tokens_output = self.output_of("prompt_tokens")
        vectors: list[list[float]] = []
        tokens: list[int] = []
        for response in outputs:
            values = response.array(name) if name is not None else None
            if values is None:
                raise BackendError(f"Model '{self.config.name}' sent no embedding.")
            rows = values.reshape(values.shape[0] if values.ndim > 1 else 1, -1)
            vectors += rows.astype(np.float32).tolist()
            counts = response.array(tokens_output) if tokens_output is not None else None
            if counts is not None:
                tokens += [int(c) for c in counts.reshape(-1)]
            else:
                tokens += [0] * rows.shape[0]
        return vectors, tokens


class DeclaredTask(CustomContract):
    """Any other model that declares an ``openai_task``: it speaks the default tensors
    (this repository's speech, transcription and embedding models)."""

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        return bool(config.parameters.get("openai_task"))


def _resample(audio: npt.NDArray[np.float32], rate: int) -> npt.NDArray[np.float32]:
    """16 kHz samples at ``rate`` (linear interpolation; speech models take 8 to 48 kHz)."""
    if rate == _STT_RATE or not audio.size:
        return audio
    count = max(round(audio.size * rate / _STT_RATE), 1)
    positions = np.linspace(0, audio.size - 1, count)
    return np.interp(positions, np.arange(audio.size), audio).astype(np.float32)


def _wav(audio: npt.NDArray[np.float32]) -> bytes:
    """16 kHz float samples as a 16-bit WAV file, for a model that takes an encoded file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(_STT_RATE)
        out.writeframes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()
