"""Types of the backend interface; they speak the gateway's terms, never Triton's."""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

#: vLLM's sampling parameters beyond OpenAI's, which clients written for vLLM send (the
#: openai SDK's ``extra_body``); in vLLM's names and meanings.
VLLM_EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")
#: The sampling parameters a chat model may or may not take (``ModelInfo.takes``).
SAMPLING_PARAMETERS = (
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    *VLLM_EXTENSIONS,
    "logprobs",
    "response_format",
)
#: Those a request's ``SamplingOptions`` carry as plain fields.
OPTION_PARAMETERS = tuple(
    p for p in SAMPLING_PARAMETERS if p not in ("logprobs", "response_format")
)


@dataclass(frozen=True)
class ImageInput:
    """How a chat model takes the images of a request."""

    max_images: int | None = None
    """The most images one request may carry to it (None: no bound of its own)."""
    formats: tuple[str, ...] = ()
    """The image encodings it decodes (``jpeg``, ``png``, ``gif``, ``webp``); others are
    converted to the first. Empty: all of them."""


@dataclass(frozen=True)
class ChatImage:
    """An image of a chat request, read and checked by the gateway: the encoded file, its
    encoding (``jpeg``, ``png``, ``gif``, ``webp``) and size in pixels."""

    data: bytes
    format: str
    width: int
    height: int

    @cached_property
    def base64(self) -> str:
        """The file in base64, made once however many choices send it."""
        return b64encode(self.data).decode("ascii")


@dataclass(frozen=True)
class ModelInfo:
    """A model the backend can serve, as read from its repository and configuration.

    ``task`` is the OpenAI capability it serves (``chat``; later ``speech``,
    ``transcription``); ``ready`` is false for a model that is in the repository but not
    loaded (:attr:`state` and :attr:`reason` say why)."""

    name: str
    task: str | None
    ready: bool
    chat_template: str | None = None
    context_length: int | None = None
    voices: tuple[str, ...] = ()
    """Speech models: the voices it has, the default first."""
    languages: tuple[str, ...] = ()
    """Transcription models: the language codes it transcribes (empty: any)."""
    tool_call_parser: str | None = None
    """Chat models: the name of the parser that reads tool calls out of their text."""
    structured_outputs: tuple[str, ...] = ()
    """Chat models: the constraints they enforce (``json``, ``json_object``, ``regex``,
    ``choice``, ``grammar``: the kinds of vLLM's structured outputs)."""
    structured_outputs_key: str = "structured_outputs"
    """The ``sampling_parameters`` key the constraint goes under (``guided_decoding`` for
    Triton's vLLM backend up to 25.11)."""
    logprobs: bool = False
    """Chat models: they send the ``logprobs`` output when asked (``return_logprobs``)."""
    max_logprobs: int = 20
    """The most alternatives per token they report."""
    dimensions: int | None = None
    """Embedding models: the length of their vectors."""
    max_input_tokens: int | None = None
    """Embedding models: the longest input they take, in their own tokens."""
    matryoshka: bool = False
    """Embedding models: trained so that a vector's first ``k`` values, renormalized, are a
    good embedding too (OpenAI's ``dimensions``)."""
    input_types: tuple[str, ...] = ()
    """Embedding models: the input types they tell apart (e5: ``query``, ``passage``), the
    default first; empty: one kind of input."""
    max_batch_size: int = 0
    """Triton's ``max_batch_size``: the most items one request may carry (0: no batching)."""
    profile: str = ""
    """How the gateway talks to it (``vllm``, ``trtllm``, ``custom``; see
    :mod:`gateway.backend.profiles`)."""
    release: str = ""
    """The release of its backend, as told from its config (vLLM, TensorRT-LLM)."""
    takes: frozenset[str] = frozenset((*SAMPLING_PARAMETERS, "speed", "language", "prompt"))
    """The OpenAI request parameters the model honours; others are refused with a 400
    unless they are in :attr:`ignores`."""
    ignores: frozenset[str] = frozenset()
    """Parameters the operator accepts without the model honouring them (``openai_ignore``)."""
    default_max_tokens: int | None = None
    """``max_tokens`` sent when the client sends none (``default_max_tokens`` parameter)."""
    bos_token: str | None = None
    eos_token: str | None = None
    """Special tokens of its tokenizer, for chat templates that refer to them."""
    reasoning_parser: str | None = None
    """Chat models that reason before they answer: the name of the parser that tells the
    reasoning apart from the answer (``deepseek_r1``, ``qwen3``)."""
    adapters: tuple[str, ...] = ()
    """Chat models: the names of the LoRA adapters it serves (``lora_adapters`` parameter),
    each a model id of its own (see :mod:`gateway.serving.catalog`)."""
    lora_base: str | None = None
    """A LoRA adapter's model id: the Triton model it runs on (None for a Triton model)."""
    lora_adapter: str | None = None
    """A LoRA adapter's model id: the adapter's name, as the base model knows it."""
    image_input: ImageInput | None = None
    """Chat models that see images (the ``vision`` parameter, or a custom model's
    ``openai_input_image``): how they take them. None: image parts are refused."""
    translates: bool = False
    """Transcription models: they translate speech into English (``translates`` parameter
    and a ``task`` input), so ``/v1/audio/translations`` may use them."""
    segment_scores: bool = True
    """Transcription models: they report each segment's ``avg_logprob`` and
    ``no_speech_prob``, which ``verbose_json`` segments carry (never made up)."""
    state: str = ""
    """The server's state of the model, as :attr:`RepositoryModel.state` (empty: never
    loaded, or a backend that does not say)."""
    reason: str = ""
    """The server's reason for that state (why a load failed); for operators only: it may
    name files and carry a traceback."""

    @property
    def runs_on(self) -> str:
        """The Triton model a request for this model id goes to."""
        return self.lora_base or self.name

    @property
    def status(self) -> str:
        """:func:`load_status` of the model: ``ready``, ``failed``, ``unloaded``..."""
        return "ready" if self.ready else load_status(self.state, self.reason)


#: Triton's reason for a model unloaded on purpose (any other reason of an UNAVAILABLE
#: model is why its load failed).
UNLOADED_REASON = "unloaded"


def load_status(state: str, reason: str = "") -> str:
    """A model's state in the server's repository, in the words of ``/admin/models``:
    ``ready``, ``loading``, ``unloading``, ``unloaded`` (on purpose), ``failed`` (its load
    failed, or it stopped serving: the reason says why) or ``not_loaded`` (never loaded).
    Triton's states are ``READY``, ``LOADING``, ``UNLOADING`` and ``UNAVAILABLE`` (with
    the reason ``unloaded`` after an unload, else the error); none for a model never
    loaded."""
    if state == "UNAVAILABLE":
        return "unloaded" if reason in ("", UNLOADED_REASON) else "failed"
    return state.lower() if state in ("READY", "LOADING", "UNLOADING") else "not_loaded"


@dataclass(frozen=True)
class RepositoryModel:
    """A model of the server's repository and its state (Triton's: ``READY``,
    ``UNAVAILABLE``, ``LOADING``, ``UNLOADING``, or empty for one never loaded)."""

    name: str
    state: str
    version: str = ""
    reason: str = ""

    @property
    def status(self) -> str:
        """:func:`load_status` of the model."""
        return load_status(self.state, self.reason)


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling parameters in the vLLM names the chat models take; ``None`` = model default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    """-1: no top-k cut (vLLM's meaning)."""
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = None
    """Report the sampled token's log probability and this many alternatives (vLLM's
    ``logprobs``); None: no log probabilities."""
    constraint: dict[str, Any] | None = None
    """Structured output the model must produce, in vLLM's ``StructuredOutputsParams``
    terms: ``{"json": schema}`` or ``{"json_object": true}``."""
    constraint_key: str = "structured_outputs"
    """The ``sampling_parameters`` key of :attr:`constraint` (see ``ModelInfo``)."""
    lora_name: str | None = None
    """The LoRA adapter to generate with (one of the model's ``adapters``); vLLM's name for
    it in ``sampling_parameters``, which the other profiles turn into their own input."""

    def to_json(self, **extra: object) -> str:
        """The ``sampling_parameters`` tensor: only the fields that are set, and ``extra``.
        The constraint is itself a JSON string there, as Triton's vLLM backend reads it."""
        params: dict[str, object] = {
            name: value
            for name in _SAMPLING_FIELDS
            if (value := getattr(self, name)) is not None and value != []
        }
        if self.constraint is not None:
            params[self.constraint_key] = json.dumps(self.constraint)
        params.update(extra)
        return json.dumps(params)


# Read field by field: dataclasses.asdict deep-copies every value, on every request.
_SAMPLING_FIELDS = tuple(
    f.name for f in fields(SamplingOptions) if f.name not in ("constraint", "constraint_key")
)


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token, its log probability and the likeliest alternatives (by rank)."""

    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class GenerationChunk:
    """A piece of generated text. ``completion_tokens`` counts the tokens since the previous
    chunk; ``finish_reason`` is set on the last chunk only."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    """The tokens of ``text`` with their log probabilities, when they were asked for."""
    estimated: bool = False
    """A token count here was counted by the gateway (the model reports none)."""
    stop_sequence: str | None = None
    """On the last chunk: the stop string the gateway cut the text at; None for any other
    end, and when the engine cut it (it does not say at which)."""


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesized speech: mono 16-bit samples."""

    samples: npt.NDArray[np.int16]
    sample_rate: int


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class Segment:
    """A transcribed stretch of audio (seconds from the start)."""

    text: str
    start: float
    end: float
    words: tuple[Word, ...] = ()
    avg_logprob: float | None = None
    """Whisper's scores of the segment; None: the model reports none."""
    no_speech_prob: float | None = None
    language: str = ""
    seek: int = 0
    """Where the window the segment was decoded in starts, in 10 ms frames (Whisper's
    ``seek``); 0 from a model that reports none (it heard the audio as one window)."""
    tokens: tuple[int, ...] = ()
    """The text's token ids (empty: the model reports none)."""
    temperature: float | None = None
    """The temperature the segment was decoded at (after any fallback); None: not told."""
    compression_ratio: float | None = None
    """Whisper's compression ratio of the text; None: not told (the gateway computes it)."""


@dataclass(frozen=True)
class Embeddings:
    """One vector per input (rows, float32, as the model made them) and each input's size in
    the model's tokens."""

    vectors: npt.NDArray[np.float32]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class TranscriptionOptions:
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    word_timestamps: bool = False
    file: bytes | None = None
    """The uploaded file as it came, for models that take the encoded file."""
    task: str = "transcribe"
    """``transcribe``, or ``translate`` (into English; only for a model that translates)."""


class Backend(Protocol):
    """What the gateway needs from an inference server.

    Implementations raise :mod:`gateway.errors` exceptions (``BackendUnavailableError``,
    ``BackendError``, ...) and never their client library's own."""

    async def live(self) -> bool:
        """True when the server answers and serves requests: it is live, whatever the state
        of each of its models (one that failed to load does not make it false, as it makes
        Triton's own strict readiness false; :meth:`models` says which are ready)."""
        ...

    async def models(self) -> list[ModelInfo]:
        """Every model in the repository, loaded or not, with its state."""
        ...

    async def repository(self) -> list[RepositoryModel]:
        """Every model in the repository with its state."""
        ...

    async def load_model(self, name: str) -> None:
        """Loads (or reloads) a model; returns when it is ready. Raises ``ModelNotFoundError``
        for a name the repository does not have, ``BackendError`` if loading fails."""
        ...

    async def unload_model(self, name: str) -> None:
        """Unloads a model; returns once it no longer takes new requests, after waiting a
        little for the requests it is still serving to end."""
        ...

    def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Generates text for a rendered prompt (and the ``images`` its placeholders stand
        for, in order; only to a model whose ``ModelInfo.image_input`` is set). With ``stream``
        false the server may answer in one chunk. Closing the iterator early cancels the
        request on the server."""
        ...

    def synthesize(
        self, model: str, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> AsyncGenerator[AudioChunk, None]:
        """Speaks ``text``, one chunk per sentence as the model produces them; ``instructions``
        (how to speak) go to a model that takes them and are dropped for one that does not.
        Closing the iterator early cancels the request on the server."""
        ...

    def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        """Transcribes 16 kHz mono float PCM, one segment at a time as the model produces
        them. Closing the iterator early cancels the request on the server."""
        ...

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        """Embeds ``texts`` (at most the model's ``max_batch_size``) in one request;
        ``input_type`` is one of the model's ``input_types`` (None when it has none)."""
        ...

    async def count_tokens(self, model: str, text: str) -> tuple[int, bool]:
        """The tokens of ``text`` for ``model`` without generating, and whether the count
        is an estimate (the model's tokenizer is not mounted: ``GATEWAY_TOKENIZERS``)."""
        ...

    async def close(self) -> None:
        """Releases connections."""
        ...
