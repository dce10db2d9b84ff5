"""The models the backend serves, read from it and cached for a short time.

The model list comes from Triton's repository index and each model's config, so a model
added to the repository (and loaded) appears without code changes. Inference lookups use a
cached copy (``model_cache_ttl_s``); a name that is not in it forces one fresh read, so a
model loaded a moment ago is found at once while a stream of requests costs no extra round
trip. ``/v1/models``, the admin API and the readiness probe read it fresh
(:meth:`ModelCatalog.refresh`). Each read tells the metrics which model ids exist (the only
``model`` label values besides ``unknown``) and which models serve
(``gateway_model_ready``): see :mod:`gateway.metrics`.
:class:`DefaultModels` picks the model of a task where a request names none (audio, the
Realtime API).

LoRA adapters: a chat model that lists adapters (its ``lora_adapters`` parameter, read by
its profile into ``ModelInfo.adapters``) gives each one a model id of its own,
``<base><separator><adapter>`` (``GATEWAY_LORA_SEPARATOR``, ``:`` by default, as in OpenAI's
fine-tuned ids ``ft:gpt-4o-mini:org::id``). The catalog lists those ids beside the Triton
models, so everything that looks a model up by its id (``/v1/models``, a key's allow-list,
usage, metrics, the response's ``model``) sees the adapter's id; its ``ModelInfo`` is the
base's with ``base`` and ``adapter`` set, and a request for it runs on the base
(``ModelInfo.runs_on``) with the adapter in ``SamplingOptions.lora_name``. A Triton model
whose name is the same as an adapter id wins (the adapter is not listed, and a warning says
so).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from gateway.backend import Backend, ModelInfo
from gateway.config import Settings
from gateway.errors import BackendUnavailableError, InvalidRequestError, ModelNotFoundError
from gateway.metrics import Metrics

logger = logging.getLogger(__name__)

DEFAULT_SEPARATOR = ":"
_WARNED: set[str] = set()


def with_adapters(models: list[ModelInfo], separator: str) -> dict[str, ModelInfo]:
    """Every model by its id, and every LoRA adapter of a loaded model by its adapter id
    (after its base); a Triton model keeps its name where an adapter id would take it."""
    found = {m.name: m for m in models}
    listed: dict[str, ModelInfo] = {}
    for model in models:
        listed[model.name] = model
        if not model.ready:
            continue
        for adapter in model.adapters:
            model_id = f"{model.name}{separator}{adapter}"
            if model_id in found or model_id in listed:
                if model_id in _WARNED:
                    continue
                _WARNED.add(model_id)
                logger.warning(
                    "LoRA adapter %s of %s is not listed: a model is already called %s",
                    adapter,
                    model.name,
                    model_id,
                )
                continue
            listed[model_id] = dataclasses.replace(
                model, name=model_id, adapters=(), lora_base=model.name, lora_adapter=adapter
            )
    return listed


def model_takes(model: ModelInfo, name: str, param: str | None = None) -> bool:
    """Whether ``model`` takes the OpenAI parameter ``name`` that a request set: True when
    it does, False when the operator lists it in the model's ``openai_ignore`` (the caller
    leaves it out), else a 400 naming it (``param``: the request's name for it)."""
    if name in model.takes:
        return True
    if name in model.ignores:
        return False
    param = param or name
    raise InvalidRequestError(
        f"The model '{model.name}' does not take '{param}' (its Triton config has no input "
        f"for it; it takes: {', '.join(sorted(model.takes)) or 'none'}). Leave it out, or "
        "ask the operator to list it in the model's openai_ignore.",
        param=param,
        code="unsupported_parameter",
    )


class ModelCatalog:
    def __init__(
        self,
        backend: Backend,
        ttl_s: float,
        separator: str = DEFAULT_SEPARATOR,
        metrics: Metrics | None = None,
    ) -> None:
        """``metrics`` hears of every read: the model ids it may take as label values, and
        each model's readiness (``gateway_model_ready``)."""
        self.backend = backend
        self.ttl_s = ttl_s
        self.metrics = metrics
        self.separator = separator
        """Between a base model's name and its adapter's in an adapter's model id."""
        self._models: dict[str, ModelInfo] = {}
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()
        #: ``created`` of the OpenAI model objects: when this gateway first saw the models.
        self.created = int(time.time())

    async def refresh(self) -> dict[str, ModelInfo]:
        """Reads the model list from the backend now. Concurrent callers share one read, but
        only a read that began after they asked: an older one may predate a model they
        expect."""
        asked = time.monotonic()
        async with self._lock:
            if self._read_at >= asked:
                return self._models
            began = time.monotonic()
            models = await self.backend.models()
            self._models = with_adapters(models, self.separator)
            self._read_at = began
            if self.metrics is not None:
                # Only a model the server has a state for: not the many never loaded.
                ready = {n: m.ready for n, m in self._models.items() if m.ready or m.state}
                self.metrics.models_read(self._models, ready)
            return self._models

    def _stale(self) -> bool:
        return time.monotonic() - self._read_at > self.ttl_s

    async def cached(self) -> dict[str, ModelInfo]:
        """Every model, from the cached list while it is fresh."""
        return await self.refresh() if self._stale() else self._models

    async def find(self, name: str) -> ModelInfo | None:
        """The loaded model called ``name``, or None. A name that is not loaded in the cached
        list forces a fresh read, so a model loaded a moment ago is found."""
        model = self._models.get(name)
        if model is None or not model.ready or self._stale():
            model = (await self.refresh()).get(name)
        return model if model is not None and model.ready else None

    async def get(self, name: str, task: str) -> ModelInfo:
        """A loaded model serving ``task``; 404 for an unknown or unloaded model, 400 for a
        model of another task."""
        model = await self.find(name)
        if model is None:
            raise ModelNotFoundError(name)
        if model.task != task:
            raise InvalidRequestError(
                f"The model '{name}' does not support this endpoint (it serves "
                f"{model.task or 'no OpenAI task'}, this endpoint needs {task}).",
                param="model",
                code="model_not_supported",
            )
        return model


class DefaultModels:
    """The model of each task that the gateway picks where a request names none (the
    transcription and speech models of audio in chat, the Realtime API's models): the
    configured one (``GATEWAY_VOICE_*_MODEL``), else the first loaded model of that task in
    ``GATEWAY_MODELS`` order, else in the repository's order."""

    def __init__(self, catalog: ModelCatalog, settings: Settings) -> None:
        self.catalog = catalog
        self.configured = {
            "chat": settings.voice_chat_model,
            "transcription": settings.voice_transcription_model,
            "speech": settings.voice_speech_model,
        }
        self.order = {name: i for i, name in enumerate(settings.models)}

    async def info(self, task: str) -> ModelInfo:
        """The model of :meth:`pick`, loaded and serving ``task`` (404 or 400 if not)."""
        return await self.catalog.get(await self.pick(task), task)

    async def pick(self, task: str) -> str:
        """The name of the model for ``task``; 503 ``model_not_loaded`` when none is."""
        configured = self.configured[task]
        if configured:
            return configured
        models = await self.catalog.cached()
        # A LoRA adapter is never the default: only a model the operator loaded.
        ready = [m.name for m in models.values() if m.task == task and m.ready and not m.lora_base]
        if not ready:
            raise BackendUnavailableError(
                f"No {task} model is loaded, and audio needs one: load one with the admin "
                f"API or set GATEWAY_VOICE_{task.upper()}_MODEL.",
                code="model_not_loaded",
            )
        return min(ready, key=lambda name: self.order.get(name, len(self.order)))
