"""Chat completions (``/v1/chat/completions``), by job: :mod:`.endpoint`
(:class:`~.endpoint.ChatCompletions`, which the router calls: which service answers a
request), :mod:`.prepared` (a request checked against its model, ready for the backend),
:mod:`.service` (:class:`ChatService`: prepare, generate, read each choice, strict tool
arguments), :mod:`.stream` (a streamed completion's SSE events), :mod:`.answers` (a choice
as OpenAI's shapes). What chat and completions share is :mod:`gateway.serving.sampling`."""

from gateway.serving.chat.answers import Answer
from gateway.serving.chat.prepared import PreparedChat
from gateway.serving.chat.service import ChatService

__all__ = ["Answer", "ChatService", "PreparedChat"]
