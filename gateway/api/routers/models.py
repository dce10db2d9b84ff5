"""GET /v1/models and /v1/models/{id}: the loaded models that serve an OpenAI task (in
Anthropic's shape, its chat models only, for a client that sends ``anthropic-version``: the
Anthropic SDKs do); and GET /v1/me: the caller's own key."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header

from gateway.api.auth import CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.backend import ModelInfo
from gateway.errors import ModelNotFoundError, StoreUnavailableError
from gateway.serving.protocol import Model, ModelCapabilities, ModelList
from gateway.state.keys import ApiKey

router = APIRouter(prefix="/v1", tags=["models"])


def _capabilities(info: ModelInfo) -> ModelCapabilities | None:
    if info.task != "chat":
        return None
    formats = [
        f
        for f in ("json_object", "json_schema")
        if f.removesuffix("_schema") in info.structured_outputs
    ]
    return ModelCapabilities(
        tool_calling=info.tool_call_parser is not None,
        forced_tool_calls="json" in info.structured_outputs,
        structured_outputs=formats,
        logprobs=info.logprobs,
        max_logprobs=info.max_logprobs if info.logprobs else 0,
        reasoning=info.reasoning_parser,
        images=info.image_input is not None,
        max_images=info.image_input.max_images if info.image_input is not None else None,
    )


def _public(info: ModelInfo, created: int) -> Model:
    return Model(
        id=info.name,
        created=created,
        task=info.task,
        context_length=info.context_length or info.max_input_tokens,
        capabilities=_capabilities(info),
        dimensions=info.dimensions if info.task == "embeddings" else None,
        voices=list(info.voices) if info.task == "speech" else None,
        profile=info.profile or None,
        backend_release=info.release or None,
        parameters=sorted(info.takes),
        ignored_parameters=sorted(info.ignores),
        chat_template=info.chat_template is not None if info.task == "chat" else None,
        root=info.runs_on,
        parent=info.lora_base,
        languages=list(info.languages) if info.task == "transcription" else None,
        translates=info.translates if info.task == "transcription" else None,
    )


#: Anthropic's SDKs send their API version on every request: its clients get its shapes.
AnthropicVersion = Annotated[str | None, Header(alias="anthropic-version")]


def _anthropic(info: ModelInfo, created: int) -> dict[str, Any]:
    """A model as Anthropic's ``ModelInfo``."""
    at = datetime.fromtimestamp(created, UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": info.name, "display_name": info.name, "created_at": at}


@router.get("/models", response_model=None, responses={200: {"model": ModelList}})
async def list_models(
    services: ServicesDep, caller: CallerDep, anthropic_version: AnthropicVersion = None
) -> Any:
    """The loaded models the caller's key may use, read from Triton now (not from the cache
    inference requests use), so every replica shows a load or unload at once."""
    catalog = services.catalog
    models = [
        m
        for m in (await catalog.refresh()).values()
        if m.ready and m.task is not None and caller.may_use(m.name)
    ]
    if anthropic_version is not None:
        data = [_anthropic(m, catalog.created) for m in models if m.task == "chat"]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return {"data": data, "has_more": False, "first_id": first, "last_id": last}
    return ModelList(data=[_public(m, catalog.created) for m in models])


class Me(ApiKey):
    """``/v1/me``: the caller's key, with what it (and its project) spent today and this
    month and each of their budgets' use (docs/budgets.md), and the bytes they keep stored
    with their quotas (docs/keys-and-admin.md); ``null`` while Redis is down (the bootstrap
    admin key is still answered)."""

    spend: dict[str, Any] | None = None
    budgets: list[dict[str, Any]] | None = None
    storage: dict[str, Any] | None = None
    batches: dict[str, int] | None = None
    """The key's batches not yet ended, and how many it may have (docs/batches.md)."""


@router.get("/me")
async def me(caller: CallerDep, services: ServicesDep) -> Me:
    """The caller's own key: its id, name, role, allowed models and limits (never the key),
    its spend and budgets, its stored bytes. The playground asks it to know whether to show
    its admin console."""
    try:
        status = await services.spend.status(caller)
        status["storage"] = await services.stored_bytes.usage(caller.id, caller.project)
        batches = services.batches
        status["batches"] = {"live": await batches.live(caller.id), "limit": batches.max_per_key}
    except StoreUnavailableError:
        status = {}
    return Me(**caller.model_dump(), **status)


@router.get("/models/{model_id:path}", response_model=None, responses={200: {"model": Model}})
async def retrieve_model(
    model_id: str,
    services: ServicesDep,
    caller: CallerDep,
    anthropic_version: AnthropicVersion = None,
) -> Any:
    catalog = services.catalog
    model = (await catalog.refresh()).get(model_id)
    if model is None or not model.ready or model.task is None or not caller.may_use(model_id):
        raise ModelNotFoundError(model_id)
    if anthropic_version is not None and model.task == "chat":
        return _anthropic(model, catalog.created)
    return _public(model, catalog.created)
