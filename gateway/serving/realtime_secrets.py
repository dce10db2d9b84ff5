"""``POST /v1/realtime/client_secrets``: a client secret (``ek_...``) for one Realtime session,
created by a server that holds an API key and handed to a browser, which then connects to
``/v1/realtime`` with the secret instead of the key.

The session configuration is checked when the secret is created, as a ``session.update``
would check it (a 400 naming the field, 403 for a model the key may not use, 404 for an
unknown one), and the answer shows the session it will open. The secret is stored by
:mod:`gateway.state.client_secrets`; :meth:`RealtimeSecrets.session_of` says what session
it opens when it is used.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.errors import InvalidRequestError
from gateway.serving.protocol import Strict
from gateway.serving.realtime import RealtimeServices
from gateway.state.client_secrets import ClientSecret, ClientSecretStore
from gateway.state.keys import ApiKey

#: OpenAI's bounds and default of ``expires_after.seconds``.
MIN_EXPIRY_S, MAX_EXPIRY_S, DEFAULT_EXPIRY_S = 10, 7200, 600


class ExpiresAfter(Strict):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(DEFAULT_EXPIRY_S, ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)


class ClientSecretRequest(Strict):
    """``client.realtime.client_secrets.create(expires_after=..., session=...)``."""

    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    session: dict[str, Any] | None = None
    """A ``session.update``'s session: checked field by field by the Realtime session's own
    checks, which name each field ``session.<path>``."""


class ClientSecretCreated(BaseModel):
    """The SDK's ``ClientSecretCreateResponse``."""

    value: str
    expires_at: int
    session: dict[str, Any]
    """The session the secret opens, as ``session.created`` will show it."""


class RealtimeSecrets:
    def __init__(self, realtime: RealtimeServices, store: ClientSecretStore) -> None:
        self.realtime = realtime
        self.store = store

    async def create(
        self, key: ApiKey, presented: str, request: ClientSecretRequest
    ) -> tuple[ClientSecretCreated, str]:
        """A secret that opens one session of ``key`` (``presented``: that key as the
        caller sent it; only its hash is kept) with ``request.session`` applied to the
        defaults, and the model the request is counted under. A refused field raises
        before anything is stored."""
        config = await self.realtime.configure(None, key, request.session)
        value, record = await self.store.create(
            key.id, presented, config.model, request.session, request.expires_after.seconds
        )
        session = config.to_json(f"sess_{secrets.token_hex(24)}")
        created = ClientSecretCreated(value=value, expires_at=record.expires_at, session=session)
        return created, config.usage_model

    async def session_of(
        self, secret: ClientSecret, requested_model: str | None
    ) -> tuple[str | None, dict[str, Any] | None]:
        """The model and session configuration of the session ``secret`` opens; a 400
        naming ``model`` when the connection's ``?model=`` means another model (an OpenAI
        name such as ``gpt-realtime`` means the secret's)."""
        if requested_model is not None and secret.model:  # (a transcription session: none)
            requested = await self.realtime.model_for(
                "chat", requested_model, "model", secret.model
            )
            if requested != secret.model:
                raise InvalidRequestError(
                    f"This client secret opens a session of the model '{secret.model}', not "
                    f"'{requested}': connect with ?model={secret.model} or without a model.",
                    param="model",
                    code="invalid_value",
                )
        return secret.model or None, secret.session
