"""The spoken turns of a session as a pure state machine: :func:`step` takes the turn's
state and what just happened (the VAD heard speech start or stop, an append was listened
to, a guess at the transcript came in, the client committed or cleared the buffer) and
returns the new state and what to do (:data:`Effect`): events to send, guesses to start or
drop, a turn to commit, a response to interrupt, an answer to start ahead. Nothing here
touches a socket, a model or the clock, so the rules are tested as plain functions
(``tests/unit/test_realtime_turns.py``); :mod:`~gateway.serving.realtime.audio_events`
carries the effects out.

The rules:

- **Barge-in**: speech that starts while a response plays interrupts it (with
  ``interrupt_response``).
- **A guess while the user is quiet**: once the user has been silent
  :data:`GUESS_AFTER_MS` (one VAD window; half the turn-ending silence, if less), the
  turn so far is transcribed, from its start. If the user goes on, the guess is dropped;
  if the turn ends on the audio it heard, it is the turn's transcript, and its answer may
  already be under way (:class:`Answer`). A pause is guessed at only while the audio the turn's
  guesses sent stays within :data:`EARLY_WORK_FACTOR` times the turn's length, so that a
  speaker who pauses often makes the work grow with the turn, not its square.
- **The turn ends** when the VAD hears the silence out (committed, answered with
  ``create_response``) or the client commits; the guesses share one transcription request
  with the turn's own transcription, recorded once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: How long the user must have been quiet before the turn so far is transcribed (and then
#: answered, ahead: see speculation.py); half of ``silence_duration_ms`` when that is less.
#: One VAD window (32 ms): the guess starts with the first append the VAD hears as quiet.
#: Waiting 200 ms, as before, made the guess (Whisper: about 300 ms on 2 cores) end after
#: the 500 ms that end a turn, so the answer could never start ahead: a turn answered in
#: about 950 ms; now 600 to 750 (``python -m tests.bench.voice``). What a guess heard is
#: the turn's transcript only when no voiced audio came after it (the VAD's count), and
#: the work stays bounded by :data:`EARLY_WORK_FACTOR`.
GUESS_AFTER_MS = 32
#: A turn's guesses send the model at most this many times the turn's audio: with the
#: transcription at its end (when no guess covers it), a turn costs at most one more.
EARLY_WORK_FACTOR = 3


@dataclass(frozen=True)
class Guess:
    number: int
    from_ms: int
    voiced_windows: int
    """The VAD's count of voiced windows when it was made: more since means the user went on."""


@dataclass(frozen=True)
class TurnState:
    speech_item: str | None = None
    """The item id of the speech in progress (None between turns)."""
    speech_start_ms: int = 0
    guess: Guess | None = None
    guesses: int = 0
    """Guesses made in the session (their numbers)."""
    sent_s: float = 0.0
    """Seconds of audio the speech in progress's guesses sent the model."""
    has_request: bool = False
    """The speech in progress has a transcription request (its first guess made it)."""


# --- what happens -----------------------------------------------------------------------


@dataclass(frozen=True)
class SpeechStarted:
    at_ms: int
    item_id: str
    """The id the speech's item will have (made by the caller: this module makes none)."""
    responding: bool
    """A response of the conversation is queued or playing."""
    interrupt: bool
    """``interrupt_response``."""


@dataclass(frozen=True)
class SpeechStopped:
    at_ms: int
    voiced_windows: int
    buffer_start_ms: int
    respond: bool
    """``create_response``: the turn is answered."""
    item_id: str
    """The item's id if no speech start gave one."""


@dataclass(frozen=True)
class Listened:
    """An append went through the VAD: where it stands now."""

    speaking: bool
    silent_ms: int
    """How long the user has been quiet within the speech (0: speaking now)."""
    voiced_windows: int
    position_ms: int
    padding_ms: int
    silence_ms: int
    """The silence that ends a turn (``silence_duration_ms``)."""
    buffer_start_ms: int
    buffer_end_ms: int


@dataclass(frozen=True)
class GuessHeard:
    number: int
    text: str | None
    can_answer: bool
    """The turn, if it ends now, will be answered by itself (``create_response``, no
    response in the way)."""


@dataclass(frozen=True)
class CommitAsked:
    """``input_audio_buffer.commit`` (the buffer holds enough: the caller checked)."""

    item_id: str


@dataclass(frozen=True)
class Cleared:
    """``input_audio_buffer.clear``."""


@dataclass(frozen=True)
class Restarted:
    """New VAD settings: the speech in progress, if any, is forgotten."""


Happening = (
    SpeechStarted | SpeechStopped | Listened | GuessHeard | CommitAsked | Cleared | Restarted
)


# --- what to do -------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerEvent:
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StartGuess:
    number: int
    from_ms: int
    new_request: bool
    """The first guess of the speech: it makes the turn's transcription request."""


@dataclass(frozen=True)
class DropGuess:
    number: int


@dataclass(frozen=True)
class EndRequest:
    """The speech will not be committed: its transcription request is recorded with what
    its guesses transcribed."""


@dataclass(frozen=True)
class Interrupt:
    """Barge-in: the conversation's response is cancelled (``turn_detected``)."""


@dataclass(frozen=True)
class Commit:
    item_id: str
    from_ms: int | None
    """Where the turn's audio starts in the buffer (None: all of it)."""
    guess: int | None
    """The guess that is its transcript (and whose answer it takes), if one heard it all."""
    respond: bool
    with_request: bool
    """The turn's transcription is made under the request its guesses made."""


@dataclass(frozen=True)
class Answer:
    """Start the answer to a guess ahead (see speculation.py)."""

    number: int
    text: str


@dataclass(frozen=True)
class Trim:
    """Forget the buffer's audio before ``before_ms``: silence no turn will include."""

    before_ms: int


Effect = ServerEvent | StartGuess | DropGuess | EndRequest | Interrupt | Commit | Answer | Trim


def step(state: TurnState, happened: Happening) -> tuple[TurnState, list[Effect]]:
    """The turn's new state after ``happened``, and what to do, in order."""
    if isinstance(happened, Listened):
        return _listened(state, happened)
    if isinstance(happened, GuessHeard):
        guess = state.guess
        if happened.text and happened.can_answer and guess and guess.number == happened.number:
            return state, [Answer(guess.number, happened.text)]
        return state, []
    if isinstance(happened, SpeechStarted):
        effects = _forget(state)
        effects.append(
            ServerEvent(
                "input_audio_buffer.speech_started",
                {"audio_start_ms": happened.at_ms, "item_id": happened.item_id},
            )
        )
        if happened.interrupt and happened.responding:
            effects.append(Interrupt())
        speaking = TurnState(happened.item_id, happened.at_ms, guesses=state.guesses)
        return speaking, effects
    if isinstance(happened, SpeechStopped):
        return _stopped(state, happened)
    if isinstance(happened, CommitAsked):
        effects = [] if state.guess is None else [DropGuess(state.guess.number)]
        item_id = state.speech_item or happened.item_id
        effects.append(Commit(item_id, None, None, False, state.has_request))
        return TurnState(guesses=state.guesses), effects
    if isinstance(happened, Cleared):
        effects = [*_forget(state), ServerEvent("input_audio_buffer.cleared")]
        return TurnState(guesses=state.guesses), effects
    return TurnState(guesses=state.guesses), _forget(state)  # Restarted


def _forget(state: TurnState) -> list[Effect]:
    """The speech in progress is forgotten: its guess dropped, its request recorded."""
    effects: list[Effect] = []
    if state.guess is not None:
        effects.append(DropGuess(state.guess.number))
    if state.has_request:
        effects.append(EndRequest())
    return effects


def _listened(state: TurnState, heard: Listened) -> tuple[TurnState, list[Effect]]:
    if not heard.speaking:
        return state, [Trim(heard.position_ms - heard.padding_ms)]
    effects: list[Effect] = []
    guess = state.guess
    if guess is not None and guess.voiced_windows != heard.voiced_windows:
        # The user went on after a pause: the guess, and the answer to it, are stale.
        effects.append(DropGuess(guess.number))
        state = replace(state, guess=None)
    if state.guess is not None or state.speech_item is None or not heard.silent_ms:
        return state, effects
    if heard.silent_ms < min(GUESS_AFTER_MS, heard.silence_ms // 2):
        return state, effects
    from_ms = max(state.speech_start_ms, heard.buffer_start_ms)
    seconds = max(0, heard.buffer_end_ms - from_ms) / 1000
    if state.sent_s + seconds > EARLY_WORK_FACTOR * seconds:
        return state, effects  # unguessed (the turn is transcribed at its end if it ends)
    number = state.guesses + 1
    effects.append(StartGuess(number, from_ms, not state.has_request))
    guessing = replace(
        state,
        guess=Guess(number, from_ms, heard.voiced_windows),
        guesses=number,
        sent_s=state.sent_s + seconds,
        has_request=True,
    )
    return guessing, effects


def _stopped(state: TurnState, stopped: SpeechStopped) -> tuple[TurnState, list[Effect]]:
    item_id = state.speech_item or stopped.item_id
    effects: list[Effect] = [
        ServerEvent(
            "input_audio_buffer.speech_stopped",
            {"audio_end_ms": stopped.at_ms, "item_id": item_id},
        )
    ]
    from_ms = max(state.speech_start_ms, stopped.buffer_start_ms)
    guess = state.guess
    if guess is not None and (
        guess.from_ms != from_ms or guess.voiced_windows != stopped.voiced_windows
    ):
        effects.append(DropGuess(guess.number))
        guess = None
    number = guess.number if guess is not None else None
    effects.append(Commit(item_id, from_ms, number, stopped.respond, state.has_request))
    return TurnState(guesses=state.guesses), effects
