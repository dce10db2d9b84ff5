"""Reasoning sealed for stateless clients: ``include: ["reasoning.encrypted_content"]``.

A client that stores nothing on the server (``store: false``, as Codex runs) sends each
turn's reasoning items back on the next. The gateway gives them a reasoning item's
reasoning as ``encrypted_content``: the text, the key that asked and the model, sealed with
Fernet (AES-128-CBC and HMAC-SHA256 over it, from ``cryptography``) under a key only the
gateway holds. Sent back, it is opened and given to the model as the reasoning before the
assistant's message; a tampered one, one sealed by another gateway (or under a key since
dropped) or for another API key is a 400 ``invalid_encrypted_content``.

Keys (``GATEWAY_REASONING_KEYS``): comma-separated Fernet keys; the first seals, every one
opens (:class:`cryptography.fernet.MultiFernet`). To rotate, put a new key first and keep
the old one until what it sealed is no longer sent back (a client's conversation), then
drop it. Unset, one key is derived from the admin key (HKDF-SHA256), which every replica
shares: changing the admin key then voids what was sealed before.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.serving.responses.protocol import ContentPart, InputItem

#: HKDF's ``info`` for the key derived from the admin key (a version, should it change).
_DERIVED = b"gateway reasoning.encrypted_content v1"
#: The largest reasoning the gateway opens (its sealed form is a third larger): bounds the
#: work a hostile ``encrypted_content`` can make.
MAX_SEALED_CHARS = 4 * 1024 * 1024


def _derived(secret: str) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_DERIVED).derive(
        secret.encode()
    )
    return base64.urlsafe_b64encode(key)


class ReasoningSeal:
    """Seals and opens reasoning for one gateway (every replica with the same keys)."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("at least one key")
        self._fernet = MultiFernet([Fernet(key) for key in keys])

    @staticmethod
    def new_key() -> bytes:
        """A new random key (``GATEWAY_REASONING_KEYS`` takes keys of this form)."""
        return Fernet.generate_key()

    @classmethod
    def from_settings(cls, settings: Settings) -> ReasoningSeal:
        """The keys of ``GATEWAY_REASONING_KEYS``, else one derived from the admin key
        (else a random one: a gateway with neither has no replica to share it with)."""
        if settings.reasoning_keys is not None:
            raw = settings.reasoning_keys.get_secret_value()
            return cls([key.strip().encode() for key in raw.split(",") if key.strip()])
        if settings.admin_key is not None:
            return cls([_derived(settings.admin_key.get_secret_value())])
        return cls([Fernet.generate_key()])

    def sealer(self, owner: str, model: str) -> Callable[[str], str]:
        """What seals a reasoning made for ``owner`` (a key id) by ``model``."""

        def seal(reasoning: str) -> str:
            payload = json.dumps({"k": owner, "m": model, "r": reasoning})
            return self._fernet.encrypt(payload.encode()).decode()

        return seal

    def open(self, sealed: str, owner: str, param: str) -> str:
        """The reasoning sealed in ``sealed``; a 400 naming ``param`` when it was not sealed
        here, was changed, or was sealed for another key."""
        refused = InvalidRequestError(
            "This encrypted_content was not made by this gateway for this API key (or it was "
            "changed, or sealed under a key since dropped): send the reasoning item as "
            "received, or leave it out.",
            param=param,
            code="invalid_encrypted_content",
        )
        if len(sealed) > MAX_SEALED_CHARS:
            raise refused
        try:
            payload = json.loads(self._fernet.decrypt(sealed.encode()))
        except (InvalidToken, ValueError) as exc:
            raise refused from exc
        if not isinstance(payload, dict) or payload.get("k") != owner:
            raise refused
        reasoning = payload.get("r")
        if not isinstance(reasoning, str):
            raise refused
        return reasoning


def opened(items: str | list[InputItem], seal: ReasoningSeal, owner: str) -> str | list[InputItem]:
    """The input with each sealed reasoning item opened: its ``encrypted_content`` given
    back as its ``reasoning_text`` (a 400 naming the item for one not sealed here)."""
    if isinstance(items, str) or not any(item.encrypted_content for item in items):
        return items
    out = []
    for index, item in enumerate(items):
        if item.type == "reasoning" and item.encrypted_content:
            text = seal.open(item.encrypted_content, owner, f"input[{index}].encrypted_content")
            part = ContentPart(type="reasoning_text", text=text)
            item = item.model_copy(update={"content": [part], "encrypted_content": None})
        out.append(item)
    return out
