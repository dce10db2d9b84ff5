"""The ``trtllm`` profile: TensorRT-LLM's ``ensemble`` and ``tensorrt_llm_bls`` models.

Read from ``tensorrtllm_backend`` ``all_models/inflight_batcher_llm/`` (r24.08 to r25.05,
then ``NVIDIA/TensorRT-LLM`` ``triton_backend/``):

- ``max_batch_size > 0``: every tensor has a leading batch dimension; ``max_tokens`` is a
  **required** INT32 input (the gateway always sends one).
- Renames across releases are followed by what the config declares: ``random_seed`` (up to
  v0.19) or ``seed``, ``min_length`` or ``min_tokens`` (the same releases);
  ``exclude_input_in_output`` exists from r25.02; guided decoding
  (``guided_decoding_guide_type`` / ``_guide``) from r25.02; token counts
  (``return_num_*_tokens``) only in the newest templates.
- Stop words go in ``stop_words`` (a list) and the engine stops on them, but **keeps** them
  in the text: the gateway cuts the text before the stop word, as OpenAI does, and ends
  the stream there.
- A non-streamed answer repeats the prompt unless ``exclude_input_in_output`` is sent (or
  does not exist, when the gateway cuts the prompt off).
- Streaming needs a decoupled model; the ensemble's text is each response's new tokens
  decoded alone, the BLS with ``accumulate_tokens`` sends the whole text so far.
- vLLM's extensions it has an input for: ``top_k`` (vLLM's -1, no cut, is TensorRT-LLM's
  0), ``repetition_penalty``, ``min_tokens``; it has none for ``min_p`` or ``ignore_eos``.
- LoRA: ``lora_task_id`` (UINT64), the id the operator gave the adapter's name in the
  ``lora_adapters`` parameter (``name=id``). The gateway never sends ``lora_weights`` or
  ``lora_config``: the task must already be in the engine's LoRA cache (an id that is not
  is the engine's error).
- Images (the multimodal ensemble, ``all_models/multimodal/``, and the BLS; a config that
  says ``vision: true``): ``image_url_input`` STRING [1], one image per request, as a
  ``data:image/jpeg;base64,`` URL, the one form its preprocessing decodes (any other URL
  it fetches itself); the gateway converts other encodings to JPEG first.
- No finish reason: ``stop`` when the answer ended before ``max_tokens`` tokens (or at a
  stop word), ``length`` when it used them all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.backend import grpc_streams as streams
from gateway.backend.base import ChatImage, ImageInput, SamplingOptions
from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.model_config import ModelConfig
from gateway.backend.profiles.text import TextRules

#: vLLM's constraint kinds -> TensorRT-LLM's guide types.
_GUIDES = {
    "json": "json_schema",
    "json_object": "json",
    "regex": "regex",
    "grammar": "ebnf_grammar",
}
_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _is_engine_step(name: str, configs: Mapping[str, ModelConfig]) -> bool:
    step = configs.get(name)
    return name == "tensorrt_llm" or (step is not None and step.backend == "tensorrtllm")


class TrtllmContract(Contract):
    profile = "trtllm"

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        if "tensorrt_llm_model_name" in config.parameters:
            return True
        return config.platform == "ensemble" and any(
            _is_engine_step(step, configs) for step in config.steps
        )

    def task(self) -> str | None:
        return super().task() or "chat"

    def release(self) -> str:
        inputs = self.config.inputs
        seed = "seed" if "seed" in inputs else "random_seed"
        era = "r25.02+" if "exclude_input_in_output" in inputs else "before r25.02"
        return f"{era} ({seed})"

    def _seed_input(self) -> str | None:
        return next((n for n in ("seed", "random_seed") if self.has(n)), None)

    def _min_tokens_input(self) -> str | None:
        return next((n for n in ("min_tokens", "min_length") if self.has(n)), None)

    def structured_outputs(self) -> tuple[tuple[str, ...], str]:
        if self.has("guided_decoding_guide_type") and self.has("guided_decoding_guide"):
            return tuple(_GUIDES), "guided_decoding"
        return (), "structured_outputs"

    def takes(self) -> frozenset[str]:
        taken = {"stop"} | {name for name in _FLOATS if self.has(name)}
        if self.has("max_tokens"):
            taken.add("max_tokens")
        if self._seed_input():
            taken.add("seed")
        if self.has("top_k"):
            taken.add("top_k")
        if self._min_tokens_input():
            taken.add("min_tokens")
        if self.structured_outputs()[0]:
            taken.add("response_format")
        return frozenset(taken)

    def _task_ids(self) -> dict[str, int]:
        """Adapter name -> ``lora_task_id``, for the entries of ``lora_adapters`` with one."""
        return {name: int(value) for name, value in self.lora_entries().items() if value.isdigit()}

    def adapters(self) -> tuple[str, ...]:
        entries = self.lora_entries()
        if not self.has("lora_task_id"):
            if entries:
                self.unusable_adapters(tuple(entries), "the model has no lora_task_id input")
            return ()
        ids = self._task_ids()
        missing = tuple(name for name in entries if name not in ids)
        if missing:
            self.unusable_adapters(missing, "no task id (write name=id in lora_adapters)")
        return tuple(ids)

    def _accumulates(self) -> bool:
        value = self.config.parameters.get("accumulate_tokens", "").strip().lower()
        return value in ("true", "yes", "1", "t")

    def image_input(self) -> ImageInput | None:
        if not (self.vision() and self.has("image_url_input")):
            return None
        # [1] per batch item: one image a request; the preprocessing decodes only JPEG data
        # URLs (anything else it fetches with requests.get), so every image goes as one.
        return ImageInput(max_images=self.image_bound("image_url_input"), formats=("jpeg",))

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
        values: dict[str, object] = {
            "text_input": prompt,
            "stream": streaming,
            "exclude_input_in_output": True,
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
        }
        if images:
            values["image_url_input"] = [
                f"data:image/jpeg;base64,{image.base64}" for image in images
            ]
        inputs = config.tensors(values)
        if options.max_tokens is not None and self.has("max_tokens"):
            inputs.append(config.tensor("max_tokens", options.max_tokens, "max_tokens"))
        for name in _FLOATS:
            value = getattr(options, name)
            if value is not None and self.has(name):
                inputs.append(config.tensor(name, value, name))
        seed = self._seed_input()
        if options.seed is not None and seed is not None:
            inputs.append(config.tensor(seed, options.seed, "seed"))
        if options.top_k is not None and self.has("top_k"):
            inputs.append(config.tensor("top_k", max(options.top_k, 0), "top_k"))
        min_tokens = self._min_tokens_input()
        if options.min_tokens is not None and min_tokens is not None:
            inputs.append(config.tensor(min_tokens, options.min_tokens, "min_tokens"))
        if options.stop and self.has("stop_words"):
            inputs.append(config.tensor("stop_words", list(options.stop), "stop"))
        if options.lora_name is not None:
            task_id = self._task_ids()[options.lora_name]
            inputs.append(config.tensor("lora_task_id", task_id, "model"))
        if options.constraint is not None:
            kind, value = next(iter(options.constraint.items()))
            guide = "" if kind == "json_object" else value
            if not isinstance(guide, str):
                guide = json.dumps(guide)
            inputs.append(config.tensor("guided_decoding_guide_type", _GUIDES[kind]))
            inputs.append(config.tensor("guided_decoding_guide", guide))
        echoed = not streaming and not self.has("exclude_input_in_output")
        rules = TextRules(
            text_output="text_output",
            cumulative=streaming and self._accumulates(),
            echo=prompt if echoed else None,
            stops=tuple(options.stop),
            max_tokens=options.max_tokens,
            prompt_tokens_output=self.output("num_input_tokens"),
            completion_tokens_output=self.output("num_output_tokens"),
        )
        return inputs, rules
