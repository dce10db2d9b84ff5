"""Renders chat prompts from a model's Jinja chat template, in a sandbox.

Templates come from model configs (operators' files, not users'), but they run over user
messages, so they run in Jinja's immutable sandbox with the conventions of Hugging Face
chat templates (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError, meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.errors import BackendError, InvalidRequestError

#: The most of a template's own rejection message a client reads.
_MAX_REJECTION_CHARS = 500


class TemplateRejected(TemplateError):
    """The template itself refused the conversation (``raise_exception`` in the template)."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRejected(message)


def _strftime_now(format: str) -> str:
    """The current date, as Hugging Face templates ask for it (Llama 3.2's)."""
    return datetime.now().strftime(format)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


_ENV = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], autoescape=False
)
_ENV.globals["raise_exception"] = _raise_exception
_ENV.globals["strftime_now"] = _strftime_now
_ENV.filters["tojson"] = _tojson


@lru_cache(maxsize=64)
def _compile(source: str) -> Any:
    return _ENV.from_string(source)


@lru_cache(maxsize=64)
def template_variables(source: str) -> frozenset[str]:
    """The variables ``source`` reads from whoever renders it (those it does not set
    itself); an unparsable template reads none (rendering it fails as the operator's
    error)."""
    try:
        return frozenset(meta.find_undeclared_variables(_ENV.parse(source)))
    except TemplateError:
        return frozenset()


def render_chat(
    template: str, messages: list[dict[str, str]], *, param: str = "messages", **extra: Any
) -> str:
    """Renders ``messages`` (``role``/``content`` dicts) with a generation prompt;
    ``extra`` are further template variables (``tools``, ``bos_token``, ``eos_token``).

    A conversation the template rejects (``raise_exception``) is the client's error: a 400
    naming ``param`` (the request's name for the messages) with the template's own message,
    which its author wrote for the caller ("Conversation roles must alternate"). A template
    that fails otherwise is the operator's (500): the client reads a fixed message, and
    what Jinja or Python said (which may quote the template or the gateway's objects) is
    only logged, with the request's id."""
    try:
        compiled = _compile(template)
        return str(compiled.render(messages=messages, add_generation_prompt=True, **extra))
    except TemplateRejected as exc:
        said = " ".join(str(exc).split())[:_MAX_REJECTION_CHARS]
        raise InvalidRequestError(
            f"The model's chat template rejected the messages: {said}",
            param=param,
            code="chat_template_rejected",
        ) from exc
    except Exception as exc:  # Jinja's errors, and Python's raised inside a template
        raise BackendError(
            "The model's chat template failed on these messages; the operator can see why "
            "in the gateway's log.",
            code="chat_template_error",
            detail=f"chat template: {type(exc).__name__}: {exc}",
        ) from exc
