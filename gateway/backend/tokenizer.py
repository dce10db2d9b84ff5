"""A model's Hugging Face tokenizer files, mounted on the gateway (``GATEWAY_TOKENIZERS``).

Triton does not hand out a model's tokenizer, and a chat model's config rarely carries its
chat template, so the operator points the gateway at the tokenizer the model was trained
with (a directory, or its ``tokenizer_config.json``), as Triton's own OpenAI frontend takes
``--tokenizer``. From it the gateway takes:

- the chat template (``chat_template.jinja`` beside it, else ``chat_template`` of
  ``tokenizer_config.json``, a string or the ``default`` of a named list) and the
  ``bos_token`` / ``eos_token`` the template refers to;
- token counts (``tokenizer.json``, read by the ``tokenizers`` library: Rust, no torch) for
  models that report none.

Without a tokenizer a count is estimated at four bytes a token; either way usage says the
count is an estimate.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("gateway")

#: Bytes per token of the estimate used without a tokenizer (OpenAI's rule of thumb).
BYTES_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


class TokenizerError(ValueError):
    """The files a setting names cannot be read."""


def _token(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _template(config: dict[str, Any]) -> str | None:
    value = config.get("chat_template")
    if isinstance(value, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True)
class Tokenizer:
    """What the gateway uses of one model's tokenizer files."""

    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    encoder: Any = None
    """A ``tokenizers.Tokenizer`` when ``tokenizer.json`` is there."""

    def count(self, text: str) -> int:
        """Tokens in ``text`` (without special tokens); the estimate without an encoder."""
        if self.encoder is None:
            return estimate_tokens(text)
        return len(self.encoder.encode(text, add_special_tokens=False).ids)

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        """Reads a tokenizer directory, or a ``tokenizer_config.json`` (whose directory
        may hold ``tokenizer.json``)."""
        folder = path if path.is_dir() else path.parent
        config_file = path if path.is_file() else folder / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot read {config_file}: {exc}") from exc
        if not isinstance(config, dict):
            raise TokenizerError(f"{config_file} is not a JSON object")
        template = _template(config)
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():  # what transformers writes since 4.43, and prefers
            template = jinja.read_text()
        encoder = None
        vocabulary = folder / "tokenizer.json"
        if vocabulary.is_file():
            from tokenizers import Tokenizer as Encoder

            try:
                encoder = Encoder.from_file(str(vocabulary))
            except Exception as exc:  # the library raises its own untyped errors
                raise TokenizerError(f"cannot read {vocabulary}: {exc}") from exc
        if not config and encoder is None and template is None:
            raise TokenizerError(f"{path} has no tokenizer_config.json or tokenizer.json")
        return cls(
            chat_template=template,
            bos_token=_token(config.get("bos_token")),
            eos_token=_token(config.get("eos_token")),
            encoder=encoder,
        )


class Tokenizers:
    """The tokenizers of ``GATEWAY_TOKENIZERS`` (model name -> path), each read once, when
    its model is first seen. A path that cannot be read is logged and left out: the model
    is then served as if it had none (no chat template: chat refused with a 400)."""

    def __init__(self, paths: dict[str, Path] | None = None) -> None:
        self.paths = dict(paths or {})
        self._loaded: dict[str, Tokenizer | None] = {}

    def get(self, model: str) -> Tokenizer | None:
        if model not in self._loaded:
            path = self.paths.get(model)
            found = None
            if path is not None:
                try:
                    found = Tokenizer.load(path)
                except TokenizerError as exc:
                    logger.error("tokenizer of model '%s' not used: %s", model, exc)
            self._loaded[model] = found
        return self._loaded[model]
