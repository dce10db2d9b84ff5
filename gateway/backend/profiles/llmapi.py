"""The ``llmapi`` profile: TensorRT-LLM's LLM API (PyTorch) Triton model, the default
TensorRT-LLM deployment on Triton (``NVIDIA/TensorRT-LLM``
``triton_backend/all_models/llmapi/tensorrt_llm/``: ``config.pbtxt``, ``1/model.py``,
``1/helpers.py``, ``1/model.yaml``).

- **Found by its inputs**: a model that takes ``text_input`` and ``sampling_param_*``
  inputs (upstream's is a Python model); no parameter in its config is needed.
  ``max_batch_size`` and decoupling come from its ``model.yaml`` through Triton's
  auto-complete (upstream ships ``decoupled: False``), and the gateway reads them from the
  loaded config as for any model.
- **Requests**: ``text_input`` is 1-D (the prompt is its first element); the sampling
  parameters each have an input (``sampling_param_max_tokens`` INT32, ``_temperature``,
  ``_top_p``, ``_top_k``, ``_frequency_penalty``, ``_presence_penalty``, ``_seed`` UINT64).
  **Stop strings are the gateway's**: upstream's ``helpers.py`` hands the
  ``sampling_param_stop`` tensor to ``SamplingParams(stop=...)`` as it comes, an array of
  bytes, where the engine's tokenizer takes ``str`` (``tokenizer.encode`` of each). So the
  gateway never sends it: it cuts the text at the first stop string and ends the request
  there (the engine is stopped as for a client that left, see below).
  ``sampling_param_exclude_input_from_output`` is sent true (upstream's default is false:
  the prompt comes back first); a config without that input gets the echo cut by the
  gateway. ``return_finish_reason`` is asked for.
- **Responses**: ``text_output`` is the whole text so far (``CompletionOutput.text``), so
  the gateway sends the new part; ``finish_reason`` is ``"None"`` until the end, then
  ``stop``, ``length``, ``timeout`` or ``cancelled`` (the last two read as ``stop``, as
  OpenAI has neither).
- **No token counts**: usage is counted with the model's tokenizer where one is mounted
  (``GATEWAY_TOKENIZERS``), else estimated, and flagged ``estimated`` either way.
- **Not there**: per-token log probabilities (``logprobs`` is a 400), guided decoding
  (``response_format`` constraints and forced tool calls are 400s), ``min_p``,
  ``repetition_penalty``, ``min_tokens``, ``ignore_eos``.
- **Streaming** needs a decoupled deployment (upstream refuses ``streaming`` otherwise):
  a stream to a non-decoupled one is answered as one chunk.
- **Cancellation**: decoupled, cancelling the gRPC stream is what the model polls
  (``is_cancelled()`` every ``cancellation_check_period_ms``); not decoupled, the gateway
  also sends the ``stop`` flag with the request's id (:meth:`LlmApiContract.stop_request`),
  which aborts the engine's request of that id.
- **LoRA**: ``lora_id``, ``lora_name`` and ``lora_path`` go together (upstream refuses one
  alone). The operator lists adapters as ``name=id:path`` in ``lora_adapters``
  (``sql=7:/loras/sql``), each served as the model id ``<model>:<name>``; an entry without
  an id and a path, or with another entry's id (the engine caches adapters by id), is not
  served (logged). ``lora_ckpt_source`` is not sent: Hugging Face checkpoints (its default).
- **Images**: ``image_url`` (1-D, one URL an image) for a deployment that says
  ``vision: true`` in its config (and ``multimodal: true`` in ``model.yaml``'s
  ``triton_config``, without which the model ignores the input), as ``data:`` URLs
  (upstream fetches http(s) URLs itself; the gateway sends what it checked).
- **Engine metrics**: ``sampling_param_return_perf_metrics`` is asked for; the KV-cache hit
  rate and the engine's queue and first-token times of each request go on the request's
  trace span and into ``/metrics`` (:meth:`LlmApiContract.engine_stats`). Upstream encodes
  these outputs as strings: both forms are read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gateway.backend import grpc_streams as streams
from gateway.backend.base import ChatImage, ImageInput, SamplingOptions
from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.model_config import ModelConfig
from gateway.backend.profiles.text import TextRules

#: The sampling parameters with an input of their own: SamplingOptions field -> input.
_SAMPLING = {
    "max_tokens": "sampling_param_max_tokens",
    "temperature": "sampling_param_temperature",
    "top_p": "sampling_param_top_p",
    "top_k": "sampling_param_top_k",
    "frequency_penalty": "sampling_param_frequency_penalty",
    "presence_penalty": "sampling_param_presence_penalty",
    "seed": "sampling_param_seed",
}
_EXCLUDE = "sampling_param_exclude_input_from_output"
_PERF = "sampling_param_return_perf_metrics"
#: The engine's timing outputs (nanoseconds since an arbitrary epoch, one clock).
_TIMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")


class LlmApiContract(Contract):
    profile = "llmapi"

    @classmethod
    def matches(cls, config: ModelConfig, configs: Mapping[str, ModelConfig]) -> bool:
        inputs = config.inputs
        return "text_input" in inputs and any(n.startswith("sampling_param_") for n in inputs)

    def task(self) -> str | None:
        return super().task() or "chat"

    def release(self) -> str:
        parts = ["LLM API"]
        if self.has("lora_path"):
            parts.append("LoRA")
        if self.has("image_url"):
            parts.append("image_url")
        return ", ".join(parts)

    def takes(self) -> frozenset[str]:
        taken = {name for name, tensor in _SAMPLING.items() if self.has(tensor)}
        taken.add("stop")  # the engine's list, or the gateway's cut
        return frozenset(taken)

    # -- LoRA ----------------------------------------------------------------------------

    def _loras(self) -> dict[str, tuple[int, str]]:
        """Adapter name -> (``lora_id``, ``lora_path``), for the ``lora_adapters`` entries
        written ``name=id:path``."""
        found: dict[str, tuple[int, str]] = {}
        for name, value in self.lora_entries().items():
            number, _, path = value.partition(":")
            if number.strip().isdigit() and path.strip():
                found[name] = (int(number), path.strip())
        return found

    def adapters(self) -> tuple[str, ...]:
        entries = self.lora_entries()
        if not all(self.has(n) for n in ("lora_id", "lora_name", "lora_path")):
            if entries:
                self.unusable_adapters(tuple(entries), "the model has no lora_* inputs")
            return ()
        loras = self._loras()
        missing = tuple(name for name in entries if name not in loras)
        ids: dict[int, str] = {}
        for name, (lora_id, _) in list(loras.items()):
            if lora_id in ids:
                self.unusable_adapters((name,), f"its id {lora_id} is {ids[lora_id]}'s too")
                del loras[name]
            else:
                ids[lora_id] = name
        if missing:
            self.unusable_adapters(missing, "no id and path (write name=id:path in lora_adapters)")
        return tuple(loras)

    # -- images --------------------------------------------------------------------------

    def image_input(self) -> ImageInput | None:
        if not (self.vision() and self.has("image_url")):
            return None
        return ImageInput(max_images=self.image_bound("image_url"))

    # -- generation ----------------------------------------------------------------------

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
            "text_input": [prompt],
            "streaming": streaming,
            _EXCLUDE: True,
            _PERF: True,
            "return_finish_reason": True,
        }
        if images:
            values["image_url"] = [
                f"data:image/{image.format};base64,{image.base64}" for image in images
            ]
        inputs = config.tensors(values)
        for field, name in _SAMPLING.items():
            value = getattr(options, field)
            if value is None or not self.has(name):
                continue
            if field == "top_k":
                value = max(int(value), 0)  # vLLM's -1 (no cut) is the engine's 0
            inputs.append(config.tensor(name, value, field))
        if options.lora_name is not None:
            lora_id, path = self._loras()[options.lora_name]
            inputs.append(config.tensor("lora_id", lora_id, "model"))
            inputs.append(config.tensor("lora_name", options.lora_name, "model"))
            inputs.append(config.tensor("lora_path", path, "model"))
        rules = TextRules(
            text_output="text_output",
            cumulative=True,
            echo=None if self.has(_EXCLUDE) else prompt,
            stops=tuple(options.stop),
            max_tokens=options.max_tokens,
            finish_output=self.output("finish_reason")
            if self.has("return_finish_reason")
            else None,
        )
        return inputs, rules

    def stop_request(self) -> list[streams.Input] | None:
        """The inputs of the request that aborts the engine's request with the same id (the
        ``stop`` flag); None for a decoupled deployment, which the cancelled stream stops."""
        if self.config.decoupled or not self.has("stop"):
            return None
        return self.config.tensors({"text_input": [""], "stop": True})

    def engine_stats(self, outputs: streams.Outputs) -> dict[str, float]:
        """The KV-cache hit rate and the engine's times of a response that carries them
        (``return_perf_metrics``): ``kv_cache_hit_rate``, ``queue_s`` (arrival to first
        scheduled) and ``first_token_s`` (arrival to first token)."""
        stats: dict[str, float] = {}
        hit = _number(outputs, "kv_cache_hit_rate")
        if hit is not None:
            stats["kv_cache_hit_rate"] = hit
        arrival, scheduled, first = (_number(outputs, name) for name in _TIMES)
        if arrival is not None and scheduled is not None and scheduled >= arrival:
            stats["queue_s"] = (scheduled - arrival) / 1e9
        if arrival is not None and first is not None and first >= arrival:
            stats["first_token_s"] = (first - arrival) / 1e9
        return stats


def _number(outputs: streams.Outputs, name: str) -> float | None:
    """An output's first value, sent as a number or (as upstream encodes its perf metrics)
    as its text; None when absent or not a number."""
    kind = outputs.datatype(name)
    if kind is None:
        return None
    if kind != "BYTES":
        number = outputs.first_number(name)
        return number if number is not None and math.isfinite(number) else None
    raw = outputs.first_bytes(name)
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
