"""Chat completions: OpenAI request in, backend generation, OpenAI response or SSE out.

Streaming follows the OpenAI wire format: every chunk has the same ``id`` and ``created``,
each choice's first delta carries the role, its last one ``finish_reason``, an optional
usage chunk (``stream_options.include_usage``) comes before ``data: [DONE]``, which is
always sent. The first backend chunk of every choice is awaited before the HTTP response
starts, so a request that fails up front (Triton down, the model rejects it) gets a real
error status; a failure after that is sent as an SSE ``error`` event followed by
``[DONE]``. Closing the stream (the client went away) closes the backend iterators, which
cancels the requests in Triton.

Tool calls are read out of the text by a parser (see :mod:`gateway.serving.tools`) as it
streams, and sent as ``delta.tool_calls`` (``delta.function_call`` for legacy
``functions``); a non-streamed reply is read by the same parser. A parser that stops after
the first call (``parallel_tool_calls: false``) ends its choice there, and the generation
with it once every choice ended. A strict tool's call is checked against its schema when
the choice ends, and its arguments generated again under the schema when they do not match
(see :meth:`ChatService.strict_arguments`).

A reasoning model's text is read apart first (:mod:`gateway.serving.reasoning`): its
reasoning goes out as ``reasoning_content`` and ``reasoning`` (``delta.reasoning_content``
when streaming), and only the answer after it is read for calls; its tokens are counted as
``usage.completion_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.backend import (
    OPTION_PARAMETERS,
    Backend,
    ChatImage,
    ModelInfo,
    SamplingOptions,
    TokenLogprob,
)
from gateway.backend.tokenizer import estimate_tokens
from gateway.errors import BackendError, InvalidRequestError
from gateway.metrics import ChatTimer, Metrics
from gateway.serving import generation
from gateway.serving.catalog import ModelCatalog, model_takes
from gateway.serving.images import ImageLimits, ImageReader, template_messages
from gateway.serving.json_shape import JsonLimits
from gateway.serving.protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChoiceLogprobs,
    FunctionCall,
    ParamNames,
    SamplingRequest,
    TokenLogprobItem,
    ToolCall,
    TopLogprobItem,
)
from gateway.serving.reasoning import parser_of, template_switches
from gateway.serving.reasoning_parsers import ReasoningParser, ReasoningTokens
from gateway.serving.request_bounds import RequestBounds
from gateway.serving.sse import ChunkWriter, with_done
from gateway.serving.structured import DEFAULT_MAX_SCHEMA_KB, response_constraint
from gateway.serving.templating import render_chat
from gateway.serving.tool_parsers import ParsedCall, ParserDelta, ToolCallDelta, assemble
from gateway.serving.tools import (
    ToolPlan,
    for_template,
    from_functions,
    openai_messages,
    setup,
)
from gateway.state.limits import Meter
from gateway.state.sessions import SessionPlan, SessionStore, plan

logger = logging.getLogger("gateway.chat")

#: The most bytes one token of a chat model spans (SmolLM2's longest token is 32 bytes).
#: A prompt of B bytes has at least B / this many tokens: enough to refuse a prompt that
#: cannot fit the context before it reaches the model; the model checks the exact count.
MAX_TOKEN_BYTES = 32


@dataclass(frozen=True)
class PreparedChat:
    """A validated request, ready for the backend."""

    id: str
    created: int
    model: str
    runs_on: str
    """The Triton model that generates (the base of a LoRA adapter's id, else ``model``)."""
    prompt: str
    options: SamplingOptions
    include_usage: bool
    n: int = 1
    tools: ToolPlan | None = None
    logprobs: int | None = None
    """How many alternatives per token to report; None: no log probabilities."""
    session: SessionPlan | None = None
    """Set when the request continues a session: the reply is stored when it completes."""
    flexible: bool = False
    """The client set no ``max_tokens``: fewer may be granted under the key's ``tpm``."""
    reasoner: type[ReasoningParser] | None = None
    """A reasoning model's parser: its text is read apart into reasoning and answer."""
    answer_after: str | None = None
    """A reasoning model's constrained answer: see ``generation.Generation.answer_after``."""
    started: float = field(default_factory=time.monotonic)
    images: tuple[ChatImage, ...] = ()
    """The images of the messages, in the order of their placeholders in the prompt."""

    def reasoning(self) -> ReasoningParser | None:
        """A new parser for one choice of a reasoning model."""
        return self.reasoner(self.prompt) if self.reasoner is not None else None


def sampling_options(request: SamplingRequest, max_tokens: int | None = None) -> SamplingOptions:
    """OpenAI parameters (and vLLM's own) -> vLLM sampling parameters."""
    temperature, top_p = request.temperature, request.top_p
    if top_p == 0.0:
        # OpenAI accepts top_p=0 (keep only the likeliest token); engines want top_p > 0.
        temperature, top_p = 0.0, None
    if request.min_tokens and max_tokens and request.min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens ({request.min_tokens}) must not exceed max_tokens ({max_tokens}).",
            param="min_tokens",
        )
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=request.seed,
        stop=request.stop_list(),
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        # vLLM releases before 0.11 refuse 0 for "no cut"; all take -1.
        top_k=-1 if request.top_k == 0 else request.top_k,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
    )


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


def _answer_after(
    model: ModelInfo, reasoner: type[ReasoningParser], forced: bool, names: ParamNames
) -> str:
    """The marker after which a reasoning model's answer is constrained; a 400 for a model
    that cannot be stopped there (it takes no ``stop``)."""
    if "stop" not in model.takes:
        param = names.tool_choice if forced else names.response_format
        raise InvalidRequestError(
            f"The model '{model.name}' reasons before it answers, and its answer can only be "
            f"held to {param} once its reasoning has ended, which needs stop strings: the "
            "model takes no 'stop'.",
            param=param,
            code="unsupported_parameter",
        )
    return reasoner.end


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


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def logprob_items(tokens: list[TokenLogprob], top: int) -> list[TokenLogprobItem]:
    return [
        TokenLogprobItem(
            token=t.token,
            logprob=t.logprob,
            bytes=_token_bytes(t.token),
            top_logprobs=[
                TopLogprobItem(token=a.token, logprob=a.logprob, bytes=_token_bytes(a.token))
                for a in t.top[:top]
            ],
        )
        for t in tokens
    ]


def _finish(backend_reason: str, calls: int, plan: ToolPlan | None) -> str:
    """The choice's ``finish_reason``: a call the request named (``tool_choice`` or
    ``function_call`` naming a function) ends with ``stop``, as OpenAI answers; calls the
    model chose (``auto``, ``required``) with ``tool_calls`` (``function_call`` for legacy
    functions)."""
    if not calls or backend_reason != "stop" or (plan is not None and plan.mode == "named"):
        return backend_reason
    return "function_call" if plan is not None and plan.legacy else "tool_calls"


def _tool_calls(calls: list[ParsedCall]) -> list[ToolCall]:
    return [
        ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ]


def _legacy(choice: ChatCompletionChoice) -> ChatCompletionChoice:
    """A choice in the shape of legacy function calling: its one call as ``function_call``."""
    message = choice.message
    if message.tool_calls:
        message.function_call, message.tool_calls = message.tool_calls[0].function, None
    return choice


def _call_delta(pieces: list[ToolCallDelta], legacy: bool) -> dict[str, Any]:
    """The ``delta`` that sends ``pieces`` of calls: ``tool_calls``, or for legacy
    ``functions`` the one call's ``function_call``."""
    if legacy:
        function: dict[str, str] = {"arguments": ""}
        for piece in pieces:
            if piece.id is not None:
                function["name"] = piece.name or ""
            function["arguments"] += piece.arguments
        return {"function_call": function}
    calls = []
    for piece in pieces:
        if piece.id is not None:
            calls.append(
                {
                    "index": piece.index,
                    "id": piece.id,
                    "type": "function",
                    "function": {"name": piece.name, "arguments": piece.arguments},
                }
            )
        else:
            calls.append({"index": piece.index, "function": {"arguments": piece.arguments}})
    return {"tool_calls": calls}


@dataclass
class Answer:
    """One choice generated whole, read (:meth:`ChatService.answer`)."""

    content: str | None
    finish_reason: str
    reasoning: str | None = None
    calls: list[ParsedCall] = field(default_factory=list)


#: What a session does not store of an answer: the next turn's template gets its content
#: and calls (templates of reasoning models leave earlier reasoning out).
_UNSTORED = {"refusal", "reasoning_content", "reasoning"}


def _in_text(at: int | None, reasoner: ReasoningParser | None) -> int | None:
    """A position in a reasoning model's answer as one in its whole text."""
    if at is None or reasoner is None:
        return at
    return at + (reasoner.content_at or 0)


@dataclass
class _ChoiceState:
    """One streamed choice: its parsers and what it has told so far."""

    parser: Any
    reasoner: ReasoningParser | None = None
    reasoning_tokens: ReasoningTokens = field(default_factory=ReasoningTokens)
    finish: str | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    calls: list[ParsedCall] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    """The text sent as content (with tools: what the parser left as text)."""
    text: list[str] = field(default_factory=list)
    """With tools: all the text generated (where strict arguments start again), the
    reasoning included."""
    ended: bool = False
    """Its last chunk was sent (the parser may end it before the model does)."""


class ChatService:
    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        default_template: str | None = None,
        sessions: SessionStore | None = None,
        metrics: Metrics | None = None,
        default_max_tokens: int = 1024,
        in_flight: int = 16,
        max_choices: int = 128,
        max_schema_kb: int = DEFAULT_MAX_SCHEMA_KB,
        images: ImageReader | None = None,
        bounds: RequestBounds | None = None,
        json_limits: JsonLimits | None = None,
    ) -> None:
        self.bounds = bounds or RequestBounds()
        self.backend = backend
        self.catalog = catalog
        self.default_template = default_template
        self.sessions = sessions
        self.metrics = metrics
        self.default_max_tokens = default_max_tokens
        self.in_flight = in_flight
        self.max_choices = max_choices
        self.max_schema_kb = max_schema_kb
        self.json_limits = json_limits or JsonLimits.defaults()
        self.images = images or ImageReader(ImageLimits())

    async def prepare(
        self,
        request: ChatCompletionRequest,
        session_id: str | None = None,
        owner: str = "",
        names: ParamNames | None = None,
        read_images: bool = True,
    ) -> PreparedChat:
        """Validates the request and renders its prompt. With ``session_id`` the stored
        conversation of ``owner`` (a key id) comes first. Errors name parameters as
        ``names`` do: by default the request's own, else those of the request it was
        converted from. ``read_images`` false: the request's images are neither fetched
        nor checked (a trial of what fits the context, see
        :mod:`gateway.serving.responses.truncation`; never a request that is sent)."""
        problem = request.unsupported()
        if problem is not None:
            param, message = problem
            raise InvalidRequestError(message, param=param, code="unsupported_parameter")
        check_fan_out(1, 1, request.n, self.max_choices)
        names = names or request.param_names()
        self.bounds.check(request, names)
        legacy = request.functions is not None or request.function_call is not None
        if legacy:
            request = from_functions(request)
        model = await self.catalog.get(request.model, "chat")
        template = model.chat_template or self.default_template
        if template is None:
            raise InvalidRequestError(
                f"The model '{model.name}' has no chat template, so chat messages cannot be "
                "turned into its prompt. The operator can give it one (a chat_template "
                "parameter in its Triton config, or its tokenizer in GATEWAY_TOKENIZERS); "
                "/v1/completions takes a raw prompt meanwhile.",
                param="model",
                code="chat_template_missing",
            )
        switches = template_switches(request, model, template, names)
        reasoner = parser_of(model)
        max_tokens = request.max_completion_tokens or request.max_tokens
        param = names.max_tokens
        check_max_tokens(model, max_tokens, param)
        top = logprob_options(
            model, bool(request.logprobs), request.top_logprobs, names.logprobs, names.top_logprobs
        )
        tools = setup(request, model, names, legacy, self.max_schema_kb)
        formatted = response_constraint(request.response_format, model, self.max_schema_kb, names)
        if tools.constraint is not None and formatted is not None:
            raise InvalidRequestError(
                f"{names.response_format} cannot be combined with a forced tool call "
                "(tool_choice 'required' or a named function).",
                param=names.response_format,
            )
        options = replace(
            fit_to_model(model, sampling_options(request, max_tokens), {"max_tokens": param}),
            logprobs=top,
            constraint=tools.constraint or formatted,
            constraint_key=model.structured_outputs_key,
            lora_name=model.lora_adapter,
        )
        messages = openai_messages(request.messages, self.json_limits, names)
        session = None
        if session_id is not None:
            if self.sessions is None:
                raise InvalidRequestError("Sessions are not enabled.", param="X-Session-ID")
            if request.n > 1:
                raise InvalidRequestError(
                    "A session stores one reply: n must be 1 with X-Session-ID.", param="n"
                )
            stored = await self.sessions.open(session_id, owner)
            session = plan(
                stored, messages, model.context_length, max_tokens, self.sessions.max_stored_kb
            )
            messages = session.messages
        shown = for_template(messages, self.json_limits)
        prompt = render_chat(
            template,
            template_messages(shown, request.messages, model, template, names),
            param=names.messages,
            tools=tools.template_tools,
            bos_token=model.bos_token or "",
            eos_token=model.eos_token or "",
            **switches,
        )
        check_prompt(model, prompt, max_tokens, names.messages)
        # The history is checked (a call's arguments nested too deep is a 400) and the
        # prompt measured against the context before any image is fetched or decoded.
        images: tuple[ChatImage, ...] = ()
        if read_images:
            images = await self.images.read(
                request.messages, model, names, session_id is not None, request.n
            )
        answer_after = None
        if reasoner is not None and options.constraint is not None and reasoner(prompt).reasoning:
            answer_after = _answer_after(model, reasoner, tools.constraint is not None, names)
        options = with_max_tokens(model, options, prompt, self.default_max_tokens)
        return PreparedChat(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=request.model,
            runs_on=model.runs_on,
            prompt=prompt,
            options=options,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            n=request.n,
            tools=tools.plan,
            logprobs=top,
            session=session,
            flexible=max_tokens is None,
            reasoner=reasoner,
            answer_after=answer_after,
            images=images,
        )

    async def reserve_run(
        self, chat: PreparedChat, meter: Meter | None
    ) -> generation.GenerationRun:
        """The request's generations (one backend request per choice), their tokens
        reserved under the key's limits; its ``collect`` or ``stream`` runs them."""
        return await generation.reserve_run(
            self.backend,
            chat.runs_on,
            meter or Meter(),
            [chat.prompt],
            chat.options,
            chat.n,
            chat.flexible,
            self.in_flight,
            chat.answer_after,
            chat.images,
        )

    async def remember(
        self, chat: PreparedChat, message: dict[str, Any], completion_tokens: int
    ) -> None:
        if chat.session is not None and self.sessions is not None:
            await self.sessions.save_turn(chat.session, message, completion_tokens)

    async def strict_arguments(
        self,
        chat: PreparedChat,
        run: generation.GenerationRun,
        index: int,
        call: ParsedCall,
        text: str,
        used: int,
    ) -> str:
        """``call``'s arguments as they match its strict schema: as the model wrote them, or
        generated again under the schema, continuing ``text`` (the choice's whole text,
        ``used`` tokens) from where the arguments started. A choice that used all its
        tokens keeps them (its finish reason, ``length``, says they were cut)."""
        assert chat.tools is not None
        problem = chat.tools.mismatch(call.name, call.arguments)
        budget = run.generations[index].options.max_tokens
        if problem is None or (budget is not None and used >= budget):
            return call.arguments
        logger.info("strict call to %s generated again: %s", call.name, problem)
        options = replace(
            run.generations[index].options,
            max_tokens=budget - used if budget is not None else None,
            logprobs=None,
            constraint={"json": chat.tools.strict[call.name]},
        )
        prefix = text[: call.at] if call.at is not None else ""
        again = await generation.reserve_run(
            self.backend,
            chat.runs_on,
            run.meter,
            [chat.prompt + prefix],
            options,
            flexible=True,
            images=chat.images,
        )
        [result] = await again.collect()
        run.include(again)
        arguments = result.text.strip()
        problem = chat.tools.mismatch(call.name, arguments)
        if problem is not None and result.finish_reason != "length":
            raise BackendError(
                f"The model '{chat.model}' wrote arguments for '{call.name}' that break its "
                f"strict schema even when constrained: {problem}.",
                code="model_error",
            )
        return arguments

    async def answer(
        self,
        chat: PreparedChat,
        run: generation.GenerationRun,
        index: int,
        result: generation.Generated,
        max_calls: int | None = None,
    ) -> Answer:
        """A choice generated whole, read: a reasoning model's reasoning apart (its tokens
        counted into ``run``), then the answer's calls (the first ``max_calls``), a strict
        call's arguments checked and made again if need be."""
        reply = Answer(content=result.text, finish_reason=result.finish_reason)
        reasoner = chat.reasoning()
        if reasoner is not None:
            tokens = ReasoningTokens()
            told = [tokens.add(reasoner, text, used) for text, used in result.pieces]
            told.append(reasoner.finish())
            reply.reasoning = "".join(d.reasoning for d in told) or None
            reply.content = "".join(d.content for d in told) or None
            run.reasoning_tokens = (run.reasoning_tokens or 0) + tokens.count
        if chat.tools is None:
            return reply
        parser = chat.tools.new_parser()
        reply.content, calls = assemble(parser, reply.content or "")
        if parser.closed:
            reply.finish_reason = "stop"  # the answer ends with its call; the rest was dropped
        reply.calls = calls[:max_calls]
        for call in reply.calls:
            call.at = _in_text(call.at, reasoner)
            call.arguments = await self.strict_arguments(
                chat, run, index, call, result.text, result.completion_tokens
            )
        return reply

    async def _choice(
        self,
        chat: PreparedChat,
        run: generation.GenerationRun,
        index: int,
        result: generation.Generated,
    ) -> ChatCompletionChoice:
        reply = await self.answer(chat, run, index, result)
        calls = _tool_calls(reply.calls) or None
        logprobs = None
        if chat.logprobs is not None:
            logprobs = ChoiceLogprobs(content=logprob_items(result.logprobs, chat.logprobs))
        return ChatCompletionChoice(
            index=index,
            message=ChatCompletionMessage(
                content=reply.content,
                tool_calls=calls,
                reasoning_content=reply.reasoning,
                reasoning=reply.reasoning,
            ),
            finish_reason=_finish(reply.finish_reason, len(calls or ()), chat.tools),
            logprobs=logprobs,
        )

    async def complete(self, chat: PreparedChat, meter: Meter | None = None) -> ChatCompletion:
        run = await self.reserve_run(chat, meter)
        results = await run.collect(pieces=chat.reasoner is not None)
        choices = [await self._choice(chat, run, i, r) for i, r in enumerate(results)]
        message = choices[0].message.model_dump(exclude_none=True, exclude=_UNSTORED)
        await self.remember(chat, message, results[0].completion_tokens)
        if chat.tools is not None and chat.tools.legacy:
            choices = [_legacy(choice) for choice in choices]
        return ChatCompletion(
            id=chat.id,
            created=chat.created,
            model=chat.model,
            choices=choices,
            usage=run.usage(),
        )

    async def stream(self, chat: PreparedChat, meter: Meter | None = None) -> AsyncIterator[str]:
        """Starts generating and returns the SSE body. Raises (for a real HTTP error status)
        if the backend fails before the first chunk of any choice."""
        run = await self.reserve_run(chat, meter)
        pieces = await run.stream()
        return with_done(self._events(chat, pieces, run), "chat")

    def _logprobs_json(self, chat: PreparedChat, state: _ChoiceState) -> str:
        if chat.logprobs is None or not state.logprobs:
            return "null"
        items = logprob_items(state.logprobs, chat.logprobs)
        state.logprobs = []
        return ChoiceLogprobs(content=items).model_dump_json()

    async def _events(
        self,
        chat: PreparedChat,
        pieces: AsyncGenerator[generation.ChoiceChunk, None],
        run: generation.GenerationRun,
    ) -> AsyncGenerator[str, None]:
        writer = ChunkWriter.chat(chat.id, chat.created, chat.model, chat.include_usage)
        timer = ChatTimer(self.metrics, chat.model, chat.started)
        states = [
            _ChoiceState(
                chat.tools.new_parser() if chat.tools is not None else None, chat.reasoning()
            )
            for _ in range(chat.n)
        ]
        async with aclosing(pieces):
            for index in range(chat.n):
                yield writer.delta(index, {"role": "assistant", "content": ""})
            async for index, chunk in pieces:
                state = states[index]
                if chunk is None:
                    if not state.ended:
                        for event in await self._close_choice(chat, writer, run, index, state):
                            yield event
                    continue
                # Counted before the text is sent: what was generated counts even for a
                # client that leaves mid-stream (the generator may never be resumed).
                run.add(index, chunk)
                state.completion_tokens += chunk.completion_tokens
                state.finish = chunk.finish_reason or state.finish
                state.logprobs.extend(chunk.logprobs)
                if state.reasoner is not None and not chunk.text:
                    state.reasoning_tokens.add(state.reasoner, "", chunk.completion_tokens)
                if not chunk.text or state.ended:
                    continue
                timer.piece()
                text = chunk.text
                if state.parser is not None:
                    state.text.append(text)
                if state.reasoner is not None:
                    told = state.reasoning_tokens.add(state.reasoner, text, chunk.completion_tokens)
                    if told.reasoning:
                        yield self._reasoning(chat, writer, index, state, told.reasoning)
                    text = told.content
                    if not text:
                        continue
                for event in self._answer(chat, writer, index, state, text):
                    yield event
                if state.parser is not None and state.parser.closed:
                    for event in await self._close_choice(chat, writer, run, index, state):
                        yield event
                    if all(s.ended for s in states):
                        break  # leaving closes the generations still running
        first = states[0]
        content = "".join(first.content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if chat.tools is not None and not content:
            message["content"] = None
        if first.calls:
            message["tool_calls"] = [call.model_dump() for call in _tool_calls(first.calls)]
        await self.remember(chat, message, first.completion_tokens)
        if chat.reasoner is not None:
            run.reasoning_tokens = sum(s.reasoning_tokens.count for s in states)
        if chat.include_usage:
            yield writer.usage(run.usage())

    def _answer(
        self, chat: PreparedChat, writer: ChunkWriter, index: int, state: _ChoiceState, text: str
    ) -> list[str]:
        """Events for a piece of the answer: content, or what the tool parser reads in it."""
        if state.parser is None:
            state.content.append(text)
            return [writer.content(index, text, self._logprobs_json(chat, state))]
        return self._parsed(chat, writer, index, state, state.parser.feed(text))

    def _reasoning(
        self, chat: PreparedChat, writer: ChunkWriter, index: int, state: _ChoiceState, text: str
    ) -> str:
        delta = {"reasoning_content": text, "reasoning": text}
        return writer.delta(index, delta, None, self._logprobs_json(chat, state))

    def _parsed(
        self,
        chat: PreparedChat,
        writer: ChunkWriter,
        index: int,
        state: _ChoiceState,
        delta: ParserDelta,
    ) -> list[str]:
        events = []
        if delta.content:
            state.content.append(delta.content)
            events.append(writer.content(index, delta.content, self._logprobs_json(chat, state)))
        assert chat.tools is not None
        sent = []
        for piece in delta.calls:
            if piece.id is not None:
                at = _in_text(piece.at, state.reasoner)
                state.calls.append(ParsedCall(piece.id, piece.name or "", "", at))
            call = state.calls[piece.index]
            call.arguments += piece.arguments
            if call.name in chat.tools.strict:
                piece = replace(piece, arguments="")  # sent once checked (_close_choice)
            if piece.id is not None or piece.arguments:
                sent.append(piece)
        if sent:
            events.append(
                writer.delta(
                    index,
                    _call_delta(sent, chat.tools.legacy),
                    None,
                    self._logprobs_json(chat, state),
                )
            )
        return events

    async def _close_choice(
        self,
        chat: PreparedChat,
        writer: ChunkWriter,
        run: generation.GenerationRun,
        index: int,
        state: _ChoiceState,
    ) -> list[str]:
        state.ended = True
        events = []
        finish = state.finish or "stop"
        if state.reasoner is not None:
            told = state.reasoner.finish()
            if told.reasoning:
                events.append(self._reasoning(chat, writer, index, state, told.reasoning))
            if told.content:
                events += self._answer(chat, writer, index, state, told.content)
        if state.parser is not None:
            assert chat.tools is not None
            events += self._parsed(chat, writer, index, state, state.parser.finish())
            if state.parser.closed:
                finish = "stop"  # the answer ends with its call; the rest was dropped
            text = "".join(state.text)
            for number, call in enumerate(state.calls):
                if call.name not in chat.tools.strict:
                    continue
                call.arguments = await self.strict_arguments(
                    chat, run, index, call, text, state.completion_tokens
                )
                piece = ToolCallDelta(number, arguments=call.arguments)
                events.append(writer.delta(index, _call_delta([piece], chat.tools.legacy)))
        finish = _finish(finish, len(state.calls), chat.tools)
        events.append(writer.delta(index, {}, finish, self._logprobs_json(chat, state)))
        return events
