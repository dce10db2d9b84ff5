"""What the OpenAI schemas of several endpoints share: the strict base model, hints and
enums, sampling parameters (chat and completions), stream options, parameter names,
log probabilities and usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from gateway.backend import SamplingOptions
from gateway.backend.scheduling import MAX_PRIORITY, MIN_PRIORITY
from gateway.errors import InvalidRequestError


class Strict(BaseModel):
    """A request object: a field it does not declare is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")


#: What the openai SDKs put on a message, part or call a client sends back as it got it:
#: accepted, never read (``exclude``: not passed on), and never anything else unknown.
Echoed = Annotated[Any, Field(exclude=True)]


def list_page(data: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    """One page of an OpenAI list (``object: list``, ``data``, the first and last ids,
    ``has_more``)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def bracketed(data: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A multipart form's fields, and the object the SDKs send as ``name[key]`` fields
    (taken out of the fields; empty when there are none)."""
    fields = dict(data)
    prefix = f"{name}["
    nested = {
        key[len(prefix) : -1]: fields.pop(key)
        for key in data
        if isinstance(key, str) and key.startswith(prefix) and key.endswith("]")
    }
    return fields, nested


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None
    """OpenAI pads stream events with random text unless this is false; nothing here pads
    them, so ``false`` is honoured and ``true`` refused."""


#: OpenAI's rule for function names.
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class JsonSchemaFormat(Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    """``text``, ``json_object`` or ``json_schema`` (with ``json_schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


#: A hint string (``user``, ``prompt_cache_key``): accepted (the latter routes, see
#: ``docs/scheduling.md``), echoed and stored with a response, so bounded.
Hint = Annotated[str, Field(max_length=256)]


#: vLLM's ``priority``: lower goes first, 0 by default; honoured by the gateway's own queue
#: (:mod:`gateway.backend.scheduling`), never before the key's own priority.
Priority = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]


#: OpenAI's ``safety_identifier`` (at most 64 characters).
SafetyIdentifier = Annotated[str, Field(max_length=64)]


#: OpenAI's processing tiers (chat's): accepted as a hint. There is one tier here, so an
#: answer always says it was served by ``default``.
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]


#: The Responses API's tiers (``ultrafast`` besides), accepted the same way.
ResponsesServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]


#: OpenAI's ``reasoning_effort`` values, lowest first (``max``: the model's highest, see
#: :func:`gateway.serving.reasoning.template_switches`).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


#: ``chat_template_kwargs``: at most 16 variables.
TemplateKwargs = Annotated[dict[str, Any], Field(max_length=16)]


#: The longest stop string: engines match each against every new token (and the gateway
#: holds back text that may still become one), so its length is bounded.
MAX_STOP_CHARS = 256


class SamplingRequest(Strict):
    """What chat and legacy completions share: the model, sampling and how many choices."""

    model: str = Field(min_length=1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=128)
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: (
        Annotated[str, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=4)]
        | None
    ) = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    user: Hint | None = None
    """A hint (OpenAI's abuse monitoring): accepted, nothing here depends on it."""
    # vLLM's sampling parameters (clients send them in the openai SDK's extra_body):
    # honoured by a model whose profile takes them, else refused naming them.
    top_k: int | None = Field(None, ge=-1)
    """0 or -1: no top-k cut."""
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    priority: Priority | None = None
    """vLLM's scheduling priority (lower first; see :data:`Priority`)."""

    @field_validator("n", mode="before")
    @classmethod
    def _n_default(cls, value: object) -> object:
        return 1 if value is None else value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if any(s == "" for s in strings):
            raise ValueError("stop sequences must not be empty strings")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> tuple[str, str] | None:
        """The first requested feature the gateway cannot honour, as (param, message)."""
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this gateway."
        return stream_options_problem(self.stream, self.stream_options)

    def to_sampling_options(self, max_tokens: int | None = None) -> SamplingOptions:
        """The request's sampling as the engine takes it (vLLM's ``to_sampling_params``):
        OpenAI's parameters and vLLM's own; ``max_tokens`` as the service chose it."""
        temperature, top_p = self.temperature, self.top_p
        if top_p == 0.0:
            # OpenAI accepts top_p=0 (keep only the likeliest token); engines want top_p > 0.
            temperature, top_p = 0.0, None
        if self.min_tokens and max_tokens and self.min_tokens > max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({max_tokens}).",
                param="min_tokens",
            )
        return SamplingOptions(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=self.seed,
            stop=self.stop_list(),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            # vLLM releases before 0.11 refuse 0 for "no cut"; all take -1.
            top_k=-1 if self.top_k == 0 else self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
        )


class _StreamOptions(Protocol):
    include_obfuscation: bool | None


def stream_options_problem(
    stream: bool | None, options: _StreamOptions | None
) -> tuple[str, str] | None:
    """Why a request's ``stream_options`` (chat's or Responses') cannot be taken, if it
    cannot: they need ``stream``, and nothing here pads events (``include_obfuscation``)."""
    if options is not None and not stream:
        return "stream_options", "stream_options is only allowed when stream is true."
    if options is not None and options.include_obfuscation:
        return (
            "stream_options.include_obfuscation",
            "Stream obfuscation is not supported by this gateway; set it to false.",
        )
    return None


class CacheOptions(Strict):
    """OpenAI's ``prompt_cache_options``: hints about its prompt cache, accepted and not
    read (vLLM's and TensorRT-LLM's prefix caches keep what they keep)."""

    comparison_response_id: str | None = Field(None, max_length=256)
    mode: Literal["implicit", "explicit"] | None = None
    prewarm: bool | None = None
    ttl: Literal["30m", "12h"] | None = None


@dataclass(frozen=True)
class ParamNames:
    """What a request calls the parameters the chat path checks (see
    :meth:`gateway.serving.chat.ChatService.prepare`), so that an error names the one the
    client sent: a chat request's own names (:meth:`ChatCompletionRequest.param_names`), or
    those of the request it was converted from (a Responses or Messages request's)."""

    max_tokens: str = "max_tokens"
    logprobs: str = "logprobs"
    top_logprobs: str = "top_logprobs"
    tools: str = "tools"
    tool: str = "tools.[{}].function"
    """One tool's function (its ``name``, ``parameters``, ``strict``); ``{}``: its index."""
    tool_choice: str = "tool_choice"
    response_format: str = "response_format"
    json_schema: str = "response_format.json_schema"
    """The ``json_schema`` format (its ``schema`` below it)."""
    messages: str = "messages"
    reasoning_effort: str = "reasoning_effort"
    effort_is_hint: bool = False
    """An effort a model cannot take is passed over, not refused (Anthropic's
    ``output_config.effort``, which Claude Code sends whatever the model)."""
    image_parts: tuple[str, ...] = ()
    """The request's image parts, in order (a converted request's names for them; empty:
    ``messages.[i].content.[j]``)."""
    image_url: str = "image_url"
    """What a converted image part calls its URL (Responses' ``image_url``, Messages'
    ``source``)."""


class TopLogprobItem(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobItem(TopLogprobItem):
    top_logprobs: list[TopLogprobItem] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobItem] | None = None
    refusal: None = None


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int
    """Of the completion tokens, those of the reasoning (a reasoning model's)."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None
    """Sent for a reasoning model (OpenAI sends it always; clients read it as optional)."""
    estimated: bool | None = None
    """True when a count was made by the gateway, because the model reports none (with the
    model's tokenizer, or at four bytes a token without one): an extension field, left out
    when the counts are the model's own."""

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("estimated", "completion_tokens_details"):
            if data.get(name) is None:
                data.pop(name, None)
        return data
