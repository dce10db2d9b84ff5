"""The ``vllm`` profile: Triton's vLLM backend, of whichever release the model runs on.

Read from ``triton-inference-server/vllm_backend`` ``src/model.py`` per release branch: the
backend auto-completes the config, so the inputs a model declares tell its release.

| declared inputs | release | finish reason and token counts | structured outputs key |
| --- | --- | --- | --- |
| no ``return_*`` switches | up to 24.11 | none (the gateway derives and counts) | none |
| switches, no ``image`` | 24.12 (vLLM 0.5.5) | outputs | none |
| switches and ``image`` | 25.01 to 25.10 | outputs | ``guided_decoding`` |
| ``embedding_request`` | 25.11 and later | outputs | ``structured_outputs`` |

The constraint is a JSON *string* under that key (a nested object fails the backend). A
config's ``structured_outputs`` / ``structured_outputs_key`` parameters override the
table (the chat models of this repository take both keys).

vLLM's own sampling parameters beyond OpenAI's (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``) are ``SamplingParams`` fields in
every release, so they go into ``sampling_parameters`` under their own names. A model that
speaks these tensors without being vLLM lists the ones it takes in a
``sampling_extensions`` parameter (empty: none); the others are then refused.

A LoRA adapter (one of the ``lora_adapters`` parameter) goes as ``lora_name`` in
``sampling_parameters`` (r24.05+); the backend refuses a name that is not in the
``multi_lora.json`` beside the model (``LoRA <name> is not supported, ...``).

Stop strings go in ``sampling_parameters`` with ``include_stop_str_in_output`` (a
``SamplingParams`` field in every release): the engine still stops at the first one, and the
gateway cuts the text before it, so that it knows which one ended the answer (Anthropic's
``stop_sequence``; vLLM's backend reports no ``stop_reason``). A model that speaks these
tensors without being vLLM gets that field only when its ``sampling_extensions`` lists it;
otherwise it cuts the stop string itself and the answer names none.

Every request sends ``exclude_input_in_output`` where it exists; on a release without it,
a non-streamed answer starts with the prompt, which is cut off. A model whose config says
``vision: true`` sees images: each goes as one base64 element of the ``image`` input
(25.01+; the backend adds the input to every config, multimodal or not, hence the
parameter). An embedding model (25.11+)
is told by ``openai_task: embeddings`` in its config: vLLM decides it from the
architecture, which Triton does not report. Its vector comes back as JSON in
``text_output``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.backend import grpc_streams as streams
from gateway.backend.base import (
    SAMPLING_PARAMETERS,
    VLLM_EXTENSIONS,
    ChatImage,
    ImageInput,
    SamplingOptions,
)
from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.model_config import ModelConfig
from gateway.backend.profiles.text import TextRules

_CHAT_INPUTS = {"text_input", "sampling_parameters"}
#: Every kind of vLLM's structured outputs.
_CONSTRAINTS = ("json", "json_object", "regex", "choice", "grammar")
_KEEP_STOPS = "include_stop_str_in_output"
_SWITCHES = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")


class VllmContract(Contract):
    profile = "vllm"

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        return config.backend == "vllm" or set(config.inputs) >= _CHAT_INPUTS

    def task(self) -> str | None:
        return super().task() or "chat"

    def release(self) -> str:
        inputs = self.config.inputs
        if "embedding_request" in inputs:
            return "25.11+"
        if "return_finish_reason" not in inputs:
            return "24.11 or older"
        return "25.01-25.10" if "image" in inputs else "24.12"

    def adapters(self) -> tuple[str, ...]:
        """Every adapter listed: the backend takes ``lora_name`` in ``sampling_parameters``
        from r24.05 (the releases before it cannot be told apart by their inputs; they fail
        the request with vLLM's "unexpected keyword argument 'lora_name'")."""
        return tuple(self.lora_entries())

    def _default_key(self) -> str | None:
        return {"25.11+": "structured_outputs", "25.01-25.10": "guided_decoding"}.get(
            self.release()
        )

    def structured_outputs(self) -> tuple[tuple[str, ...], str]:
        params = self.config.parameters
        key = params.get("structured_outputs_key") or self._default_key()
        if "structured_outputs" in params:
            return self.config.names("structured_outputs"), key or "structured_outputs"
        if key is None:
            return (), "structured_outputs"
        return _CONSTRAINTS, key

    def takes(self) -> frozenset[str]:
        if self.task() != "chat":
            return frozenset()
        taken = set(SAMPLING_PARAMETERS) - {"logprobs", "response_format", *VLLM_EXTENSIONS}
        if "sampling_extensions" in self.config.parameters:
            taken |= set(self.config.names("sampling_extensions")) & set(VLLM_EXTENSIONS)
        else:
            taken |= set(VLLM_EXTENSIONS)
        if self.has("return_logprobs") and self.output("logprobs"):
            taken.add("logprobs")
        if self.structured_outputs()[0]:
            taken.add("response_format")
        return frozenset(taken)

    def keeps_stops(self) -> bool:
        """Whether the engine takes ``include_stop_str_in_output``: vLLM always; a model
        that lists its ``sampling_extensions``, when it lists this one."""
        if "sampling_extensions" not in self.config.parameters:
            return True
        return _KEEP_STOPS in self.config.names("sampling_extensions")

    def image_input(self) -> ImageInput | None:
        if not (self.vision() and self.has("image")):
            return None
        return ImageInput(max_images=self.image_bound("image"))

    def generate(
        self,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> tuple[list[streams.Input], TextRules]:
        self._images_refused(images)
        config = self.config
        streaming = self.streaming(stream)
        kept = bool(options.stop) and self.keeps_stops()
        values: dict[str, object] = {
            "text_input": prompt,
            "stream": streaming,
            "sampling_parameters": (
                options.to_json(include_stop_str_in_output=True) if kept else options.to_json()
            ),
            "exclude_input_in_output": True,
        }
        if images:
            # One plain base64 file per element (no data: prefix): the backend decodes each
            # with PIL into vLLM's multi_modal_data, in the prompt's placeholder order.
            values["image"] = [image.base64 for image in images]
        for switch in _SWITCHES:
            values[switch] = True
        logprobs = options.logprobs is not None
        if logprobs:
            values["return_logprobs"] = True
        inputs = config.tensors(values)
        echoed = not streaming and not self.has("exclude_input_in_output")
        rules = TextRules(
            text_output="text_output",
            echo=prompt if echoed else None,
            stops=tuple(options.stop) if kept else (),
            max_tokens=options.max_tokens,
            finish_output=self.output("finish_reason") if self.has(_SWITCHES[0]) else None,
            prompt_tokens_output=self.output("num_input_tokens")
            if self.has(_SWITCHES[1])
            else None,
            completion_tokens_output=(
                self.output("num_output_tokens") if self.has(_SWITCHES[2]) else None
            ),
            logprobs_output="logprobs" if logprobs else None,
        )
        return inputs, rules

    # -- embeddings (25.11+, a model declared ``openai_task: embeddings``) ----------------

    def embed(self, texts: list[str], input_type: str | None) -> list[list[streams.Input]]:
        if self.task() != "embeddings" or not self.has("embedding_request"):
            raise self._unsupported("embeddings")
        return [
            self.config.tensors(
                {
                    "text_input": text,
                    "embedding_request": json.dumps({"input": text, "pooling_params": {}}),
                    "return_num_input_tokens": True,
                }
            )
            for text in texts
        ]

    def embeddings(self, outputs: list[streams.Outputs]) -> tuple[list[list[float]], list[int]]:
        vectors, tokens = [], []
        for text, reported in (
            (o.first_bytes("text_output"), o.first_number("num_input_tokens")) for o in outputs
        ):
            vectors.append([float(v) for v in json.loads(text or b"[]")])
            tokens.append(int(reported) if reported is not None else 0)
        return vectors, tokens
