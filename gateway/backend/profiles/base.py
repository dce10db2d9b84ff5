"""The base of every model profile: :class:`Contract`, what the gateway asks of a model.

The base reads what every profile shares (the parameters of ``triton_repo/README.md``:
``openai_task``, ``chat_template``, ``context_length``, ``lora_adapters``, ...) and says "no"
to every task; a profile (one module of this package, listed in ``PROFILES`` in
``__init__.py``) says how its models are recognised (:meth:`Contract.matches`), builds their
requests and reads their responses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from gateway.backend import grpc_streams as streams
from gateway.backend.base import (
    AudioChunk,
    ChatImage,
    ImageInput,
    ModelInfo,
    SamplingOptions,
    Segment,
    TranscriptionOptions,
)
from gateway.backend.profiles.model_config import ModelConfig
from gateway.backend.profiles.text import TextReader, TextRules
from gateway.backend.tokenizer import Tokenizer, estimate_tokens
from gateway.errors import InvalidRequestError

__all__ = ["Contract"]

logger = logging.getLogger(__name__)


class Contract:
    """How the gateway talks to one model. The base reads what every profile shares (the
    parameters of ``triton_repo/README.md``); subclasses build requests and read
    responses. A task a profile does not serve raises ``InvalidRequestError``."""

    profile: ClassVar[str] = ""

    def __init__(self, config: ModelConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        """Whether this profile is the one for ``config`` (``configs``: every loaded model's
        config, for ensembles' steps)."""
        raise NotImplementedError

    # -- what the model serves ---------------------------------------------------------

    def task(self) -> str | None:
        return self.config.parameters.get("openai_task") or None

    def release(self) -> str:
        """Which release of its backend the config reads as (empty when not told apart)."""
        return ""

    def takes(self) -> frozenset[str]:
        """The OpenAI parameters (of :data:`SAMPLING_PARAMETERS`, plus ``speed`` for speech)
        the model honours."""
        return frozenset()

    def structured_outputs(self) -> tuple[tuple[str, ...], str]:
        """The constraint kinds the model enforces, and the key they go under."""
        return (), "structured_outputs"

    def info(self) -> ModelInfo:
        config = self.config
        params = config.parameters
        template = params.get("chat_template") or None
        bos = eos = None
        if self.tokenizer is not None:
            template = template or self.tokenizer.chat_template
            bos, eos = self.tokenizer.bos_token, self.tokenizer.eos_token
        kinds, key = self.structured_outputs()
        max_logprobs = config.integer("max_logprobs")
        return ModelInfo(
            name=config.name,
            task=self.task(),
            ready=True,
            chat_template=template,
            context_length=config.integer("context_length") or config.integer("max_model_len"),
            voices=self.voices(),
            languages=config.names("languages"),
            tool_call_parser=params.get("tool_call_parser") or None,
            structured_outputs=kinds,
            structured_outputs_key=key,
            logprobs="logprobs" in self.takes(),
            max_logprobs=max_logprobs if max_logprobs is not None else 20,
            dimensions=config.integer("dimensions"),
            max_input_tokens=config.integer("max_input_tokens"),
            matryoshka=params.get("matryoshka", "").lower() == "true",
            input_types=_input_types(config),
            max_batch_size=config.max_batch_size,
            profile=self.profile,
            release=self.release(),
            takes=self.takes(),
            ignores=frozenset(config.names("openai_ignore")) | self.unheeded(),
            default_max_tokens=config.integer("default_max_tokens"),
            bos_token=bos,
            eos_token=eos,
            reasoning_parser=params.get("reasoning_parser") or None,
            adapters=self.adapters() if self.task() == "chat" else (),
            image_input=self.image_input() if self.task() == "chat" else None,
            translates=self.translates(),
            segment_scores=self.segment_scores(),
        )

    def voices(self) -> tuple[str, ...]:
        return self.config.names("voices")

    # -- LoRA adapters -----------------------------------------------------------------

    def lora_entries(self) -> dict[str, str]:
        """The ``lora_adapters`` parameter: adapter name -> what follows its ``=`` (a
        TensorRT-LLM task id; empty when none), in the order listed."""
        entries: dict[str, str] = {}
        for entry in self.config.names("lora_adapters"):
            name, _, value = entry.partition("=")
            if name.strip():
                entries.setdefault(name.strip(), value.strip())
        return entries

    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters a request may name (``lora_adapters``), those the profile can
        send; a profile with no way to send one serves none (:meth:`unusable_adapters`)."""
        names = tuple(self.lora_entries())
        if names:
            self.unusable_adapters(names, "its profile has no way to name an adapter")
        return ()

    def unusable_adapters(self, names: tuple[str, ...], why: str) -> None:
        """Logs, once per model and reason, adapters listed that are not served."""
        key = (self.config.name, why)
        if key not in _WARNED:
            _WARNED.add(key)
            logger.warning(
                "model %s: LoRA adapters %s are not served: %s",
                self.config.name,
                ", ".join(names),
                why,
            )

    def translates(self) -> bool:
        """Transcription models: whether they translate into English."""
        return False

    def segment_scores(self) -> bool:
        """Transcription models: whether they report Whisper's segment scores
        (``avg_logprob``, ``no_speech_prob``)."""
        return False

    def unheeded(self) -> frozenset[str]:
        """Parameters the model cannot follow that clients send by default, accepted and
        not honoured (added to the operator's ``openai_ignore``; listed in ``/v1/models``
        ``ignored_parameters``)."""
        return frozenset()

    def sample_rate(self) -> int | None:
        return self.config.integer("sample_rate")

    def count(self, text: str) -> int:
        """Tokens of ``text`` by the model's tokenizer, or the estimate without one."""
        return self.tokenizer.count(text) if self.tokenizer is not None else estimate_tokens(text)

    # -- chat --------------------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> tuple[list[streams.Input], TextRules]:
        """The inputs of one generation request, and how to read its responses."""
        raise self._unsupported("text generation")

    def image_input(self) -> ImageInput | None:
        """How the model takes images, when it sees them (see :meth:`vision`)."""
        return None

    def vision(self) -> bool:
        """The operator says the model sees images (its ``vision`` parameter): a vLLM or
        TensorRT-LLM config declares its image input whether the model is multimodal or
        not, so the input alone does not tell."""
        return self.config.parameters.get("vision", "").strip().lower() in ("true", "1", "yes")

    def image_bound(self, name: str) -> int | None:
        """The most images a request may carry: the input ``name``'s fixed size, when it has
        one, and the ``max_images`` parameter, the smaller (None: neither bounds them)."""
        dims = self.config.inputs[name].dims
        bounds = [b for b in (self.config.integer("max_images"),) if b]
        if dims and -1 not in dims:
            bounds.append(max(1, int(np.prod(dims))))
        return min(bounds) if bounds else None

    def _images_refused(self, images: tuple[ChatImage, ...]) -> None:
        if images and self.image_input() is None:
            raise self._unsupported("images")

    def stop_request(self) -> list[streams.Input] | None:
        """The inputs of a request that stops an abandoned generation of the same request
        id, for a model that is not stopped by its cancelled call alone (None: the call's
        cancellation is enough)."""
        return None

    def engine_stats(self, outputs: streams.Outputs) -> dict[str, float]:
        """Engine measurements a response carries (KV-cache hit rate, queue and first-token
        times), for the trace and ``/metrics``; empty for most models."""
        return {}

    def reader(self, prompt: str, rules: TextRules) -> TextReader:
        return TextReader(rules, prompt, self.count)

    def streaming(self, stream: bool) -> bool:
        """Whether a request streams: only a decoupled model sends more than one response."""
        return stream and self.config.decoupled

    # -- speech, transcription, embeddings -----------------------------------------------

    def synthesize(
        self, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> list[streams.Input]:
        raise self._unsupported("speech")

    def audio(self, outputs: streams.Outputs) -> AudioChunk | None:
        raise self._unsupported("speech")

    def transcribe(
        self, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> list[streams.Input]:
        raise self._unsupported("transcription")

    def segment(self, outputs: streams.Outputs, duration: float) -> Segment | None:
        raise self._unsupported("transcription")

    def embed(self, texts: list[str], input_type: str | None) -> list[list[streams.Input]]:
        """The requests that embed ``texts`` (one, or one per text)."""
        raise self._unsupported("embeddings")

    def embeddings(self, outputs: list[streams.Outputs]) -> tuple[list[list[float]], list[int]]:
        """Each request's vectors and token counts, in order."""
        raise self._unsupported("embeddings")

    def _unsupported(self, what: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"The model '{self.config.name}' ({self.profile} profile) does not serve {what}.",
            param="model",
            code="model_not_supported",
        )

    # -- helpers for subclasses ----------------------------------------------------------

    def has(self, name: str | None) -> bool:
        return name is not None and name in self.config.inputs

    def output(self, name: str | None) -> str | None:
        """``name`` when the model declares that output."""
        return name if name is not None and name in self.config.outputs else None


def _input_types(config: ModelConfig) -> tuple[str, ...]:
    """``input_types`` of an embedding model, its ``default_input_type`` first."""
    kinds = list(config.names("input_types"))
    default = config.parameters.get("default_input_type", "").strip()
    if default in kinds:
        kinds.remove(default)
        kinds.insert(0, default)
    return tuple(kinds)


_WARNED: set[tuple[str, str]] = set()
"""(model, reason) pairs already logged by :meth:`Contract.unusable_adapters`."""
