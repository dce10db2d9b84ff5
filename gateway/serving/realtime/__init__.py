"""The OpenAI Realtime API (GA event names) over one WebSocket: a voice conversation, or
a transcription session.

A :class:`RealtimeSession` owns one connection's session. The router feeds it the client's
events (:meth:`RealtimeSession.handle`); each is parsed once into its pydantic model
(:mod:`.protocol`, the shapes in :mod:`.specs`) and handed to the handler registered for
its type. The handlers work over a narrow :class:`~.context.SessionContext` (the
settings, events out, the work queue, the admission), each given the others it calls:

- :mod:`.audio_events`: ``input_audio_buffer.*``: audio decoded (pcm16 or G.711, in a
  worker thread), heard by Silero VAD, and the turn logic of :mod:`.turns`, a pure state
  machine ``step(state, happened) -> (state, effects)``: barge-in, the guess at the
  transcript while the user is quiet, the turn committed;
- :mod:`.item_events`: ``conversation.item.*`` over the :mod:`.conversation`'s items;
- :mod:`.response_events`: ``response.create`` / ``cancel``, the response of a turn and
  the answer made ahead of it (:mod:`.speculation`);
- the session itself (:mod:`.session`): ``session.update``, applied whole or not at all
  by :mod:`.session_config`'s :class:`~.session_config.Configurator`.

The work (transcriptions, :mod:`.transcriber`; responses, :mod:`.responder`) runs in
order on one task per session (:class:`~.context.Jobs`), so the receive loop never waits
for a model and audio keeps flowing into the VAD. Responder, transcriber and speculation
are given their dependencies (:class:`~.context.Services`, the admission, events out),
never the session.

Every request a session makes of a model is admitted under the key's limits like any
request (one against ``rpm``, no concurrency slot of its own, as the connection holds
one), its models checked against the key, and what it used recorded as usage when it
ends. The models the session's settings make it use are checked when it opens and at
every ``session.update``. What a client can make a session hold is bounded
(:class:`~.items.Bounds`).
"""

from gateway.serving.realtime.items import Bounds, Item
from gateway.serving.realtime.protocol import ClientEventError
from gateway.serving.realtime.session import Admit, RealtimeServices, RealtimeSession, Settle
from gateway.serving.realtime.session_config import SessionConfig

__all__ = [
    "Admit",
    "Bounds",
    "ClientEventError",
    "Item",
    "RealtimeServices",
    "RealtimeSession",
    "SessionConfig",
    "Settle",
]
