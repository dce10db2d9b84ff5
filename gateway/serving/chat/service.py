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
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from gateway.backend import Backend, ChatImage
from gateway.errors import BackendError, InvalidRequestError
from gateway.metrics import Metrics
from gateway.serving import generation
from gateway.serving.catalog import ModelCatalog
from gateway.serving.chat.answers import (
    UNSTORED,
    Answer,
    finish_reason,
    in_text,
    legacy_choice,
    tool_calls_of,
)
from gateway.serving.chat.prepared import PreparedChat, answer_marker
from gateway.serving.chat.stream import ChatStream
from gateway.serving.images import ImageLimits, ImageReader, template_messages
from gateway.serving.json_shape import JsonLimits
from gateway.serving.protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ParamNames,
)
from gateway.serving.reasoning import parser_of, template_switches
from gateway.serving.reasoning_parsers import ReasoningTokens
from gateway.serving.request_bounds import RequestBounds
from gateway.serving.sampling import (
    check_fan_out,
    check_max_tokens,
    check_prompt,
    fit_to_model,
    logprob_items,
    logprob_options,
    with_max_tokens,
)
from gateway.serving.sse import with_done
from gateway.serving.structured import DEFAULT_MAX_SCHEMA_KB, response_constraint
from gateway.serving.templating import render_chat
from gateway.serving.tool_parsers import ParsedCall, assemble
from gateway.serving.tools import for_template, from_functions, openai_messages, setup
from gateway.state.limits import Meter
from gateway.state.sessions import SessionStore, plan

logger = logging.getLogger("gateway.chat")


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
        :mod:`gateway.serving.responses.truncation`, or a Messages ``count_tokens``; never a
        request that is sent)."""
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
            fit_to_model(model, request.to_sampling_options(max_tokens), {"max_tokens": param}),
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
            answer_after = answer_marker(model, reasoner, tools.constraint is not None, names)
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
            call.at = in_text(call.at, reasoner)
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
        calls = tool_calls_of(reply.calls) or None
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
            finish_reason=finish_reason(reply.finish_reason, len(calls or ()), chat.tools),
            logprobs=logprobs,
        )

    async def complete(self, chat: PreparedChat, meter: Meter | None = None) -> ChatCompletion:
        run = await self.reserve_run(chat, meter)
        results = await run.collect(pieces=chat.reasoner is not None)
        choices = [await self._choice(chat, run, i, r) for i, r in enumerate(results)]
        message = choices[0].message.model_dump(exclude_none=True, exclude=UNSTORED)
        await self.remember(chat, message, results[0].completion_tokens)
        if chat.tools is not None and chat.tools.legacy:
            choices = [legacy_choice(choice) for choice in choices]
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
        writer = ChatStream(self.metrics, self.strict_arguments, self.remember)
        events = writer.events(chat, pieces, run)
        return with_done(events, "chat")
