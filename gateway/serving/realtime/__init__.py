"""The OpenAI Realtime API (GA event names) over one WebSocket: a voice conversation.

A :class:`RealtimeSession` owns one connection's conversation. The router feeds it the
client's events (:meth:`RealtimeSession.handle`) and it sends server events through the
``send`` callback it was given. What happens to a spoken turn:

1. ``input_audio_buffer.append``: the base64 is decoded, 24 kHz pcm16 resampled to 16 kHz
   (PyAV) and kept; with ``server_vad`` it also goes through Silero VAD
   (:mod:`gateway.serving.vad`), which reports ``speech_started`` / ``speech_stopped``.
   That is CPU work (seconds for minutes of audio), so it runs in a worker thread, one
   append after the other: the other streams of the process go on meanwhile. Speech that
   starts while a response plays cancels it (barge-in, ``interrupt_response``).
2. The turn is committed (silence after speech, or ``input_audio_buffer.commit``): a user
   item is added and its audio transcribed by the transcription model. While the VAD waits
   for the silence to last ``silence_duration_ms``, the audio so far is already being
   transcribed; if the user goes on speaking that guess is dropped, else it is the
   transcript, so the wait hides the transcription.
3. A response (automatic after a VAD turn, or ``response.create``): the conversation (or
   the response's own ``input``) is rendered with the chat model's template and
   generated; its text streams as transcript (or text) deltas and is spoken sentence by
   sentence (:mod:`gateway.serving.voice`). ``response.cancel``, barge-in or a closed
   connection stop the Triton requests. A response with ``conversation: "none"`` is
   out of band: its answer is not added to the conversation.

Work runs in order on one worker task (a transcription, then the response that needs it),
so the receive loop never waits for a model and audio keeps flowing into the VAD.

Every request a session makes of a model is admitted under the key's limits like any
request (:meth:`RealtimeSession._admit`, through the :data:`Admit` callable the API layer
opened the session with: one against ``rpm``, no concurrency slot of its own, as the
connection holds one), its models checked against the key, and what it used recorded as
usage when it ends: each response, and each transcription (a turn's, with the
guesses made while it was spoken). The models the session's settings make it use (chat,
transcription and, for spoken answers, speech) are checked when it opens and at every
``session.update``, which applies whole or not at all.

Every field of a client event is honoured or refused by name, as OpenAI refuses them:
``unknown_parameter`` for a field the API does not define, ``unsupported_parameter`` for
one this gateway does not implement (tools, noise reduction...; ``semantic_vad`` is server
VAD with the silence its ``eagerness`` maps to). What a client can make a session hold is
bounded (:class:`Bounds`).

The package, each module importing only those listed before it (``transcription``,
``responder`` and ``turns`` name :class:`RealtimeSession`, and ``config``
:class:`RealtimeServices`, for type checking only):

- :mod:`~gateway.serving.realtime.events`: item and event shapes, the bounds, the client
  event field checks and :class:`ClientEventError`;
- :mod:`~gateway.serving.realtime.buffer`: the input audio buffer and the audio a client
  sends;
- :mod:`~gateway.serving.realtime.config`: the session's settings (:class:`SessionConfig`)
  and the checks of ``session.update`` (:class:`~.config.Configurator`);
- :mod:`~gateway.serving.realtime.conversation`: the conversation's items: a client's
  messages checked, bounded, deleted, retrieved, truncated;
- :mod:`~gateway.serving.realtime.transcription`: a session's transcription requests, and
  the transcription of a turn or an item;
- :mod:`~gateway.serving.realtime.responder`: a session's responses (built, queued,
  cancelled) and one response, generated and spoken;
- :mod:`~gateway.serving.realtime.turns`: the spoken turns: the audio appended, the VAD's
  events, commits, barge-in;
- :mod:`~gateway.serving.realtime.session`: the state machine that dispatches the client's
  events and runs the work, and :class:`RealtimeServices`, which opens sessions.
"""

from gateway.serving.realtime.config import SessionConfig
from gateway.serving.realtime.events import Bounds, ClientEventError, Item
from gateway.serving.realtime.session import Admit, RealtimeServices, RealtimeSession, Settle

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
