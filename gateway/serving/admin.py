"""The admin service: Triton model control with the catalog kept in step, keys, usage,
projects and spend."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from gateway.backend import Backend, RepositoryModel
from gateway.errors import InvalidRequestError
from gateway.serving.catalog import ModelCatalog
from gateway.state.admission import BOOTSTRAP_ADMIN
from gateway.state.keys import ApiKey, CreatedKey, KeyCreate, KeyStore, KeyUpdate
from gateway.state.limits import Limits
from gateway.state.projects import ProjectStore
from gateway.state.spend import MAX_SPEND_DAYS, Spend


class AdminService:
    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        keys: KeyStore,
        limits: Limits,
        projects: ProjectStore,
        spend: Spend,
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.keys = keys
        self.limits = limits
        self.projects = projects
        self.spend_reports = spend

    async def repository(self) -> list[dict[str, Any]]:
        """Every model of the repository: its state (Triton's, and in this API's words:
        ``status``, ``failed`` for a load that failed), Triton's reason for it (a failed
        load's error: files and tracebacks, for admins only), and the OpenAI task of a
        loaded one."""
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

    # --- projects, budgets and spend (docs/budgets.md) -------------------------------

    async def create_key(self, spec: KeyCreate) -> CreatedKey:
        """A new key; 400 naming ``project`` for a project that does not exist."""
        if spec.project is not None:
            await self.projects.get(spec.project, param="project")
        return await self.keys.create(spec)

    async def update_key(self, key_id: str, change: KeyUpdate) -> ApiKey:
        await self.keys.get(key_id)  # 404 first
        if change.project is not None:
            await self.projects.get(change.project, param="project")
        return await self.keys.update(key_id, change)

    async def spend(
        self,
        group_by: str,
        start: str | None,
        end: str | None,
        key_id: str | None,
        project: str | None,
    ) -> dict[str, Any]:
        """``GET /admin/spend``: from ``start`` to ``end`` (UTC days, both included; by
        default this month to today), at most :data:`MAX_SPEND_DAYS` days."""
        today = dt.datetime.fromtimestamp(time.time(), dt.UTC).date()
        first = _date(start, "start") if start else today.replace(day=1)
        last = _date(end, "end") if end else today
        if last < first:
            raise InvalidRequestError("end is before start.", param="end", code="invalid_value")
        if (last - first).days + 1 > MAX_SPEND_DAYS:
            raise InvalidRequestError(
                f"At most {MAX_SPEND_DAYS} days at once.", param="start", code="invalid_value"
            )
        if key_id is not None and (project is not None or group_by == "project"):
            param = "project" if project is not None else "group_by"
            raise InvalidRequestError(
                "key_id picks one key's spend: it cannot be grouped by project or combined "
                "with a project.",
                param=param,
                code="invalid_value",
            )
        if key_id is not None:
            keys = (
                [BOOTSTRAP_ADMIN] if key_id == BOOTSTRAP_ADMIN.id else [await self.keys.get(key_id)]
            )
        else:
            keys = [*await self.keys.all(), BOOTSTRAP_ADMIN]
        if project is not None:
            await self.projects.get(project)  # 404 for an unknown one
        rows = await self.spend_reports.report(keys, group_by, first, last, key_id, project)
        return {
            "object": "list",
            "group_by": group_by,
            "start": first.isoformat(),
            "end": last.isoformat(),
            "data": rows,
        }


def _date(value: str, param: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InvalidRequestError(
            f"{param} must be a day as YYYY-MM-DD, got {value!r}.",
            param=param,
            code="invalid_value",
        ) from None


def _entry(model: RepositoryModel, task: str | None) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "status": model.status,
        "state": model.state,
        "version": model.version,
        "reason": model.reason,
        "task": task,
    }
