"""A chat request validated against its model and ready for the backend
(:class:`PreparedChat`), as :meth:`~gateway.serving.chat.service.ChatService.prepare` makes it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.backend import ChatImage, ModelInfo, SamplingOptions
from gateway.errors import InvalidRequestError
from gateway.serving.protocol import ParamNames
from gateway.serving.reasoning_parsers import ReasoningParser
from gateway.serving.tools import ToolPlan
from gateway.state.sessions import SessionPlan


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


def answer_marker(
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
