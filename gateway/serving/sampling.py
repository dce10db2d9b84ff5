"""What chat and completions share before a request reaches a model: its sampling options
as the model takes them, ``max_tokens`` chosen, the checks of fan-out, ``max_tokens`` and the
prompt against the model's context, and log probabilities asked for and reported."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.backend import OPTION_PARAMETERS, ModelInfo, SamplingOptions, TokenLogprob
from gateway.backend.tokenizer import estimate_tokens
from gateway.errors import InvalidRequestError
from gateway.serving.catalog import model_takes
from gateway.serving.protocol import TokenLogprobItem, TopLogprobItem

#: The most bytes one token of a chat model spans (SmolLM2's longest token is 32 bytes).
#: A prompt of B bytes has at least B / this many tokens: enough to refuse a prompt that
#: cannot fit the context before it reaches the model; the model checks the exact count.
MAX_TOKEN_BYTES = 32


def fit_to_model(
    model: ModelInfo, options: SamplingOptions, params: dict[str, str] | None = None
) -> SamplingOptions:
    """``options`` as the model can take them: a parameter the client set that the model
    cannot take is a 400 naming it (``params`` maps a field to the request's name for it),
    unless the operator lists it in the model's ``openai_ignore``, when it is left out."""
    dropped: dict[str, Any] = {}
    for name in OPTION_PARAMETERS:
        value = getattr(options, name)
        if value is None or value == []:
            continue
        if not model_takes(model, name, (params or {}).get(name)):
            dropped[name] = [] if name == "stop" else None
    return replace(options, **dropped) if dropped else options


def with_max_tokens(
    model: ModelInfo, options: SamplingOptions, prompt: str, fallback: int
) -> SamplingOptions:
    """Always a ``max_tokens`` for a model that takes one (engines' own defaults are tiny,
    vLLM's 16 tokens, or absent): the client's, else the model's ``default_max_tokens``,
    else what fits its context after the prompt (estimated), else ``fallback``."""
    if options.max_tokens is not None or "max_tokens" not in model.takes:
        return options
    chosen = model.default_max_tokens
    if chosen is None and model.context_length:
        chosen = max(model.context_length - estimate_tokens(prompt), 1)
    return replace(options, max_tokens=chosen or fallback)


def check_fan_out(prompts: int, max_prompts: int, n: int, max_choices: int) -> None:
    """400 naming the limit when a request asks for more prompts, or more generations
    (prompts x ``n``), than one request may (``GATEWAY_MAX_PROMPTS``,
    ``GATEWAY_MAX_CHOICES``): each is a Triton request."""
    if prompts > max_prompts:
        raise InvalidRequestError(
            f"The request has {prompts} prompts; at most {max_prompts} are allowed per "
            "request (GATEWAY_MAX_PROMPTS). Send them in several requests.",
            param="prompt",
            code="too_many_prompts",
        )
    if prompts * n > max_choices:
        raise InvalidRequestError(
            f"The request asks for {prompts * n} generations ({prompts} prompt(s) x n={n}); "
            f"at most {max_choices} are allowed per request (GATEWAY_MAX_CHOICES).",
            param="n",
            code="too_many_choices",
        )


def check_max_tokens(model: ModelInfo, max_tokens: int | None, param: str) -> None:
    """400 when ``max_tokens`` alone fills the model's context."""
    if model.context_length and (max_tokens or 0) >= model.context_length:
        # Caught here because an error the model reports mid-stream carries no kind.
        raise InvalidRequestError(
            f"{param} is {max_tokens}, but the model's context length is "
            f"{model.context_length} tokens (prompt included).",
            param=param,
            code="context_length_exceeded",
        )


def check_prompt(model: ModelInfo, prompt: str, max_tokens: int | None, param: str) -> None:
    """400 when the prompt cannot fit the model's context with ``max_tokens`` (judged by
    its size, see :data:`MAX_TOKEN_BYTES`)."""
    if not model.context_length:
        return
    size = len(prompt.encode("utf-8"))
    at_least = -(-size // MAX_TOKEN_BYTES)
    if at_least + (max_tokens or 1) > model.context_length:
        raise InvalidRequestError(
            f"The prompt is {size:,} bytes, so at least {at_least:,} tokens: with "
            f"max_tokens {max_tokens or 1} it exceeds the model's context length of "
            f"{model.context_length:,} tokens.",
            param=param,
            code="context_length_exceeded",
        )


def logprob_options(
    model: ModelInfo, wanted: bool, top: int | None, param: str, top_param: str
) -> int | None:
    """How many alternatives per token to ask the model for, or a 400 it cannot."""
    if not wanted:
        return None
    if not model.logprobs:
        raise InvalidRequestError(
            f"The model '{model.name}' does not report log probabilities.",
            param=param,
            code="unsupported_parameter",
        )
    if (top or 0) > model.max_logprobs:
        raise InvalidRequestError(
            f"The model '{model.name}' reports at most {model.max_logprobs} alternatives "
            "per token.",
            param=top_param,
            code="unsupported_parameter",
        )
    return top or 0


def token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def logprob_items(tokens: list[TokenLogprob], top: int) -> list[TokenLogprobItem]:
    return [
        TokenLogprobItem(
            token=t.token,
            logprob=t.logprob,
            bytes=token_bytes(t.token),
            top_logprobs=[
                TopLogprobItem(token=a.token, logprob=a.logprob, bytes=token_bytes(a.token))
                for a in t.top[:top]
            ],
        )
        for t in tokens
    ]
