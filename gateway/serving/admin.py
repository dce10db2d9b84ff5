"""The admin service: Triton model control with the catalog kept in step, keys, usage."""

from __future__ import annotations

from typing import Any

from gateway.backend import Backend, RepositoryModel
from gateway.errors import InvalidRequestError
from gateway.serving.catalog import ModelCatalog
from gateway.state.keys import KeyStore
from gateway.state.limits import Limits


class AdminService:
    def __init__(
        self, backend: Backend, catalog: ModelCatalog, keys: KeyStore, limits: Limits
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.keys = keys
        self.limits = limits

    async def repository(self) -> list[dict[str, Any]]:
        """Every model of the repository: its state, and the OpenAI task of a loaded one."""
        tasks = {m.name: m.task for m in (await self.catalog.refresh()).values()}
        return [_entry(m, tasks.get(m.name)) for m in await self.backend.repository()]

    async def _state(self, name: str) -> dict[str, Any]:
        # repository() re-reads the catalog too: inference on this replica follows at once.
        for model in await self.repository():
            if model["id"] == name:
                return model
        return _entry(RepositoryModel(name, ""), None)

    async def _not_adapter(self, name: str, action: str) -> None:
        """400 for a LoRA adapter's id: its base model is what Triton loads."""
        model = (await self.catalog.cached()).get(name)
        if model is not None and model.lora_base is not None:
            base = model.lora_base
            raise InvalidRequestError(
                f"'{name}' is the LoRA adapter '{model.lora_adapter}' of the model '{base}', "
                f"not a Triton model: {action} '{base}' (its adapters come and go with it).",
                param="name",
                code="lora_adapter",
            )

    async def load(self, name: str) -> dict[str, Any]:
        await self._not_adapter(name, "load")
        await self.backend.load_model(name)
        return await self._state(name)

    async def unload(self, name: str) -> dict[str, Any]:
        await self._not_adapter(name, "unload")
        await self.backend.unload_model(name)
        return await self._state(name)

    async def usage(self, key_id: str) -> dict[str, Any]:
        key = await self.keys.get(key_id)  # 404 for an unknown key
        return {"object": "usage", "key_id": key.id, **await self.limits.usage(key.id)}


def _entry(model: RepositoryModel, task: str | None) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "state": model.state,
        "version": model.version,
        "reason": model.reason,
        "task": task,
    }
