"""The turn logic of a Realtime session (:mod:`gateway.serving.realtime.turns`) as plain
functions: barge-in, the guess at the transcript while the user is quiet (when, how often,
dropped when the user goes on), the turn committed with or without it, and what the
client's commit and clear do. No socket, no model, no clock: happenings in, effects out."""

from __future__ import annotations

import pytest

from gateway.serving.realtime.turns import (
    EARLY_WORK_FACTOR,
    GUESS_AFTER_MS,
    Answer,
    Cleared,
    Commit,
    CommitAsked,
    DropGuess,
    Effect,
    EndRequest,
    GuessHeard,
    Happening,
    Interrupt,
    Listened,
    Restarted,
    ServerEvent,
    SpeechStarted,
    SpeechStopped,
    StartGuess,
    Trim,
    TurnState,
    step,
)

ITEM = "item_speech"
SILENCE_MS = 500
"""OpenAI's default ``silence_duration_ms``: the guess comes after GUESS_AFTER_MS."""


def run(*happenings: Happening, state: TurnState | None = None) -> tuple[TurnState, list[Effect]]:
    """Feeds ``happenings`` in order; the last state and every effect, in order."""
    state = TurnState() if state is None else state
    effects: list[Effect] = []
    for happened in happenings:
        state, more = step(state, happened)
        effects += more
    return state, effects


def started(at_ms: int = 0, *, responding: bool = False, interrupt: bool = True) -> SpeechStarted:
    return SpeechStarted(at_ms, ITEM, responding=responding, interrupt=interrupt)


def heard(
    end_ms: int,
    *,
    voiced: int,
    silent_ms: int = 0,
    silence_ms: int = SILENCE_MS,
    buffer_start_ms: int = 0,
) -> Listened:
    """An append heard while the user speaks (``silent_ms``: quiet for that long); the
    buffer ends at ``end_ms``, where the VAD stands."""
    return Listened(
        speaking=True,
        silent_ms=silent_ms,
        voiced_windows=voiced,
        position_ms=end_ms,
        padding_ms=300,
        silence_ms=silence_ms,
        buffer_start_ms=buffer_start_ms,
        buffer_end_ms=end_ms,
    )


def stopped(
    at_ms: int, *, voiced: int, respond: bool = True, buffer_start_ms: int = 0
) -> SpeechStopped:
    return SpeechStopped(at_ms, voiced, buffer_start_ms, respond=respond, item_id="item_unused")


def guesses(effects: list[Effect]) -> list[StartGuess]:
    return [effect for effect in effects if isinstance(effect, StartGuess)]


def guessing(
    start_ms: int = 0, end_ms: int = 2000, voiced: int = 40
) -> tuple[TurnState, list[Effect]]:
    """A user who spoke from ``start_ms`` to ``end_ms`` and has paused long enough for
    the first guess."""
    return run(
        started(start_ms),
        heard(end_ms, voiced=voiced),
        heard(end_ms + GUESS_AFTER_MS, voiced=voiced, silent_ms=GUESS_AFTER_MS),
    )


# --- speech start and barge-in ----------------------------------------------------------


def test_speech_start_is_announced_with_the_items_id() -> None:
    state, effects = run(started(1200))
    assert effects == [
        ServerEvent("input_audio_buffer.speech_started", {"audio_start_ms": 1200, "item_id": ITEM})
    ]
    assert (state.speech_item, state.speech_start_ms) == (ITEM, 1200)


@pytest.mark.parametrize(
    ("responding", "interrupt", "interrupts"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_speech_interrupts_a_playing_response_only_with_interrupt_response(
    responding: bool, interrupt: bool, interrupts: bool
) -> None:
    _, effects = run(started(0, responding=responding, interrupt=interrupt))
    assert (Interrupt() in effects) is interrupts
    assert isinstance(effects[0], ServerEvent)  # speech_started comes first, then the cancel


# --- the guess at a pause ---------------------------------------------------------------


def test_a_pause_starts_one_guess_from_the_speech_start() -> None:
    state, _ = run(started(700))
    state, effects = run(heard(2000, voiced=40), state=state)
    assert effects == []  # speaking: nothing to guess yet
    state, effects = run(
        heard(2000 + GUESS_AFTER_MS - 1, voiced=40, silent_ms=GUESS_AFTER_MS - 1), state=state
    )
    assert effects == []  # not before GUESS_AFTER_MS
    state, effects = run(
        heard(2000 + GUESS_AFTER_MS, voiced=40, silent_ms=GUESS_AFTER_MS), state=state
    )
    assert effects == [StartGuess(1, 700, new_request=True)]
    _, effects = run(
        heard(2300, voiced=40, silent_ms=300), heard(2400, voiced=40, silent_ms=400), state=state
    )
    assert effects == []  # the same pause is guessed at once


@pytest.mark.parametrize(
    ("silence_ms", "after_ms"), [(40, 20), (50, 25), (1200, GUESS_AFTER_MS), (500, GUESS_AFTER_MS)]
)
def test_the_guess_waits_half_the_turn_ending_silence_when_that_is_less(
    silence_ms: int, after_ms: int
) -> None:
    base = run(started(0), heard(1000, voiced=20, silence_ms=silence_ms))[0]
    early = heard(1000 + after_ms - 1, voiced=20, silent_ms=after_ms - 1, silence_ms=silence_ms)
    on_time = heard(1000 + after_ms, voiced=20, silent_ms=after_ms, silence_ms=silence_ms)
    assert guesses(run(early, state=base)[1]) == []
    assert guesses(run(on_time, state=base)[1]) == [StartGuess(1, 0, new_request=True)]


def test_the_guess_hears_only_the_buffer_that_is_left() -> None:
    # The buffer was trimmed after the speech started: the guess starts where it starts.
    _, effects = run(
        started(100),
        heard(2000, voiced=20, buffer_start_ms=400),
        heard(2200, voiced=20, silent_ms=200, buffer_start_ms=400),
    )
    assert guesses(effects) == [StartGuess(1, 400, new_request=True)]


def test_no_guess_without_speech_in_progress() -> None:
    _, effects = run(heard(2000, voiced=20, silent_ms=400))
    assert effects == []


def test_the_user_going_on_drops_the_guess_and_a_new_pause_guesses_again() -> None:
    state, _ = guessing(voiced=40)
    state, effects = run(heard(2400, voiced=45), state=state)
    assert effects == [DropGuess(1)]
    state, effects = run(heard(3000, voiced=55), state=state)
    assert effects == []  # speaking on: no guess to drop, none to start
    _, effects = run(heard(3200, voiced=55, silent_ms=200), state=state)
    # The second guess reuses the transcription request the first one made.
    assert effects == [StartGuess(2, 0, new_request=False)]


def test_speech_and_a_new_pause_within_one_append_replace_the_guess() -> None:
    state, _ = guessing(voiced=40)
    _, effects = run(heard(2600, voiced=44, silent_ms=250), state=state)
    assert effects == [DropGuess(1), StartGuess(2, 0, new_request=False)]


def _chatty_turn(pause_every_ms: int, turn_ms: int) -> tuple[int, float, int, float]:
    """A speaker who pauses 300 ms (not enough to end the turn) after every
    ``pause_every_ms`` of speech, heard in 100 ms appends. The pauses, the seconds of audio
    the guesses sent (each hears the buffer from its ``from_ms`` to its end), the guesses,
    the turn's length in seconds."""
    state, _ = run(started(0))
    sent_ms, made, pauses, end_ms, voiced = 0, 0, 0, 0, 0
    while end_ms < turn_ms:
        for _ in range(pause_every_ms // 100):
            end_ms += 100
            voiced += 3
            state, effects = step(state, heard(end_ms, voiced=voiced))
        pauses += 1
        for silent_ms in (100, 200, 300):
            end_ms += 100
            state, effects = step(state, heard(end_ms, voiced=voiced, silent_ms=silent_ms))
            for guess in guesses(effects):
                made += 1
                sent_ms += end_ms - guess.from_ms
                # Bounded all along, not only at the turn's end.
                assert sent_ms <= EARLY_WORK_FACTOR * end_ms
    return pauses, sent_ms / 1000, made, end_ms / 1000


@pytest.mark.parametrize("pause_every_ms", [500, 1000, 1300, 3000])
def test_a_speaker_who_pauses_often_makes_the_work_grow_with_the_turn(pause_every_ms: int) -> None:
    pauses, sent_s, made, turn_s = _chatty_turn(pause_every_ms, 60_000)
    assert sent_s <= EARLY_WORK_FACTOR * turn_s
    assert made < pauses  # the bound bites: a guess at every pause would send far more
    assert made >= 3  # ...but the turn is still guessed at as it grows


def test_a_turn_with_few_pauses_is_guessed_at_every_pause() -> None:
    pauses, sent_s, made, _ = _chatty_turn(4000, 12_000)
    assert made == pauses == 3
    # Each guessed at the first append of its pause (100 ms in: past GUESS_AFTER_MS).
    assert sent_s == pytest.approx(4.1 + 8.4 + 12.7)


# --- the turn ends ----------------------------------------------------------------------


def test_a_turn_that_ends_on_the_guessed_audio_is_committed_with_the_guess() -> None:
    state, _ = guessing(start_ms=500, voiced=40)
    state, effects = run(stopped(2500, voiced=40), state=state)
    assert effects == [
        ServerEvent("input_audio_buffer.speech_stopped", {"audio_end_ms": 2500, "item_id": ITEM}),
        Commit(ITEM, 500, guess=1, respond=True, with_request=True),
    ]
    assert state == TurnState(guesses=1)


def test_create_response_false_commits_without_answering() -> None:
    state, _ = guessing(voiced=40)
    _, effects = run(stopped(2500, voiced=40, respond=False), state=state)
    assert effects[-1] == Commit(ITEM, 0, guess=1, respond=False, with_request=True)


def test_a_turn_that_ends_after_more_speech_is_committed_without_the_guess() -> None:
    # The speech after the pause and the silence that ends the turn came in one append.
    state, _ = guessing(start_ms=500, voiced=40)
    _, effects = run(stopped(3500, voiced=52), state=state)
    assert effects == [
        ServerEvent("input_audio_buffer.speech_stopped", {"audio_end_ms": 3500, "item_id": ITEM}),
        DropGuess(1),
        Commit(ITEM, 500, guess=None, respond=True, with_request=True),
    ]


def test_a_turn_without_a_guess_is_transcribed_on_its_own() -> None:
    state, _ = run(started(300), heard(1000, voiced=20))
    _, effects = run(stopped(1500, voiced=20), state=state)
    assert effects[-1] == Commit(ITEM, 300, guess=None, respond=True, with_request=False)


def test_a_stop_with_no_start_heard_uses_the_id_it_brings() -> None:
    _, effects = run(stopped(900, voiced=10, buffer_start_ms=200))
    assert effects == [
        ServerEvent(
            "input_audio_buffer.speech_stopped", {"audio_end_ms": 900, "item_id": "item_unused"}
        ),
        Commit("item_unused", 200, guess=None, respond=True, with_request=False),
    ]


def test_after_a_turn_the_next_starts_afresh_and_guess_numbers_go_on() -> None:
    # A first turn so chatty that its guesses reached the bound...
    state, _ = run(started(0))
    voiced = 0
    for end_ms in range(1000, 30_001, 1000):
        voiced += 10
        state, _ = run(
            heard(end_ms, voiced=voiced),
            heard(end_ms + 200, voiced=voiced, silent_ms=200),
            state=state,
        )
    state, _ = run(stopped(31_000, voiced=voiced), state=state)
    made = state.guesses
    assert state == TurnState(guesses=made)
    # ...does not hold back the next one's first guess, which makes its own request.
    _, effects = run(
        started(32_000),
        heard(33_000, voiced=voiced + 10),
        heard(33_200, voiced=voiced + 10, silent_ms=200),
        state=state,
    )
    assert guesses(effects) == [StartGuess(made + 1, 32_000, new_request=True)]


# --- the guess's transcript -------------------------------------------------------------


def test_a_guess_heard_starts_the_answer_ahead() -> None:
    state, _ = guessing()
    after, effects = run(GuessHeard(1, "What time is it?", can_answer=True), state=state)
    assert effects == [Answer(1, "What time is it?")]
    assert after == state


@pytest.mark.parametrize(
    ("text", "can_answer"), [(None, True), ("", True), ("What time is it?", False)]
)
def test_no_answer_ahead_without_text_or_when_the_turn_will_not_answer_itself(
    text: str | None, can_answer: bool
) -> None:
    state, _ = guessing()
    assert run(GuessHeard(1, text, can_answer=can_answer), state=state)[1] == []


def test_a_stale_guess_gets_no_answer_ahead() -> None:
    state, _ = guessing(voiced=40)
    state, _ = run(heard(2400, voiced=45), state=state)  # the user went on: guess 1 dropped
    assert run(GuessHeard(1, "What time", can_answer=True), state=state)[1] == []
    state, _ = run(heard(2600, voiced=45, silent_ms=200), state=state)  # guess 2
    assert run(GuessHeard(1, "What time", can_answer=True), state=state)[1] == []
    assert run(GuessHeard(2, "What time is it?", can_answer=True), state=state)[1] == [
        Answer(2, "What time is it?")
    ]
    committed, _ = run(stopped(2700, voiced=45), state=state)
    assert run(GuessHeard(2, "What time is it?", can_answer=True), state=committed)[1] == []


# --- the client's commit and clear, new VAD settings ------------------------------------


def test_the_clients_commit_takes_the_whole_buffer_under_the_guesses_request() -> None:
    state, _ = guessing(start_ms=500)
    state, effects = run(CommitAsked("item_unused"), state=state)
    assert effects == [
        DropGuess(1),
        Commit(ITEM, None, guess=None, respond=False, with_request=True),
    ]
    assert state == TurnState(guesses=1)
    # The rest of that pause is not guessed at: no speech is in progress any more.
    assert run(heard(2600, voiced=40, silent_ms=400), state=state)[1] == []


def test_the_clients_commit_between_turns() -> None:
    _, effects = run(CommitAsked("item_client"))
    assert effects == [Commit("item_client", None, guess=None, respond=False, with_request=False)]


def test_clear_drops_the_guess_and_ends_its_request() -> None:
    state, _ = guessing()
    state, effects = run(Cleared(), state=state)
    assert effects == [DropGuess(1), EndRequest(), ServerEvent("input_audio_buffer.cleared")]
    assert state == TurnState(guesses=1)
    assert run(Cleared())[1] == [ServerEvent("input_audio_buffer.cleared")]


def test_clear_after_the_user_went_on_still_ends_the_request() -> None:
    state, _ = guessing(voiced=40)
    state, _ = run(heard(2400, voiced=45), state=state)
    assert run(Cleared(), state=state)[1] == [
        EndRequest(),
        ServerEvent("input_audio_buffer.cleared"),
    ]


def test_new_vad_settings_forget_the_speech_without_a_word_to_the_client() -> None:
    state, _ = guessing()
    state, effects = run(Restarted(), state=state)
    assert effects == [DropGuess(1), EndRequest()]
    assert state == TurnState(guesses=1)
    assert run(Restarted())[1] == []
    # No speech is in progress any more: the pause it was in is not guessed at again.
    assert run(heard(3000, voiced=60, silent_ms=300), state=state)[1] == []


def test_speech_starting_again_forgets_the_speech_in_progress() -> None:
    state, _ = guessing()
    state, effects = run(started(4000), state=state)
    assert effects[:2] == [DropGuess(1), EndRequest()]
    assert state == TurnState(ITEM, 4000, guesses=1)


# --- silence between turns --------------------------------------------------------------


def test_silence_between_turns_trims_the_buffer_up_to_the_padding() -> None:
    quiet = Listened(
        speaking=False,
        silent_ms=0,
        voiced_windows=0,
        position_ms=5000,
        padding_ms=300,
        silence_ms=SILENCE_MS,
        buffer_start_ms=0,
        buffer_end_ms=5000,
    )
    state, effects = run(quiet)
    assert effects == [Trim(4700)]
    assert state == TurnState()
