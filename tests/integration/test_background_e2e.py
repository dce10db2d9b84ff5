"""Background responses end to end: the official openai client -> one replica or the other
-> real Triton (``mock_chat``, slowed by its ``[mock:delay_ms=N]`` directive), the
response's record and events in the real Redis, so that a response one replica runs is
read, followed and cancelled through the other."""

from __future__ import annotations

import time

import openai
import pytest

from tests.support.generation import generation_stops
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

#: An answer of 12 words, one every 40 ms: about half a second.
SHORT = "[mock:delay_ms=40] [mock:words=12] tell me"
#: An answer of 3000 words, one every 20 ms: a minute, unless cancelled.
LONG = "[mock:delay_ms=20] [mock:words=3000] tell me more"


def replica(stack: GatewayProcess, address: str, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{address}/v1", api_key=key or stack.admin_key, max_retries=0
    )


def until_status(
    client: openai.OpenAI, response_id: str, *statuses: str
) -> openai.types.responses.Response:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        time.sleep(0.05)
    raise AssertionError(f"{response_id} is still {response.status}, not {statuses}")


def first_words(client: openai.OpenAI, response_id: str) -> None:
    """Follows the response until its first text delta: it has said something (a fixed
    sleep was not enough on a busy machine, where Triton may not have answered yet)."""
    with client.responses.retrieve(response_id, stream=True) as events:
        for event in events:
            if event.type == "response.output_text.delta" and event.delta:
                return
    raise AssertionError(f"{response_id} ended without saying anything")


def test_one_replica_runs_it_the_other_follows_it_from_a_sequence_number(
    stack: GatewayProcess,
) -> None:
    first, second = (replica(stack, a) for a in stack.replica_addresses())
    created = first.responses.create(model="mock_chat", input=SHORT, background=True)
    assert created.status == "queued" and created.background is True
    # Replayed from number 3, then followed live until it ends, on the other replica.
    events = list(second.responses.retrieve(created.id, stream=True, starting_after=2))
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(3, 3 + len(events)))
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = first.responses.retrieve(created.id)
    assert done.status == "completed" and len(done.output_text.split()) == 12
    assert done.output_text.endswith(deltas) and deltas
    # Streamed from the start, on the POST itself: the same sequence, numbered from 0.
    stream = second.responses.create(model="mock_chat", input=SHORT, background=True, stream=True)
    live = list(stream)
    assert [e.sequence_number for e in live] == list(range(len(live)))
    assert live[-1].type == "response.completed"
    assert live[-1].response.output_text == done.output_text


def test_cancel_on_the_other_replica_stops_triton(stack: GatewayProcess) -> None:
    first, second = (replica(stack, a) for a in stack.replica_addresses())
    created = first.responses.create(model="mock_chat", input=LONG, background=True)
    running = until_status(second, created.id, "in_progress")
    assert running.background is True
    first_words(second, created.id)  # some output first
    cancelled = second.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    generation_stops(stack, "mock_chat")  # the Triton request was cancelled for real
    stored = first.responses.retrieve(created.id)
    assert stored.status == "cancelled"
    # What it had said stays; far from its 3000 words.
    assert 0 < len(stored.output_text.split()) < 1000
    # Cancelling again returns it unchanged; a response that was not run in the
    # background cannot be cancelled.
    assert first.responses.cancel(created.id).status == "cancelled"
    plain = first.responses.create(model="mock_chat", input="hi", max_output_tokens=3)
    with pytest.raises(openai.BadRequestError) as refused:
        second.responses.cancel(plain.id)
    assert refused.value.code == "response_not_cancellable"


def test_another_key_cannot_see_it_and_each_key_runs_a_bounded_number(
    stack: GatewayProcess,
) -> None:
    key = stack.create_key("background bound")["key"]
    address = stack.replica_addresses()[0]
    mine = replica(stack, address, key)
    other = replica(stack, address)
    started = [
        mine.responses.create(model="mock_chat", input=LONG, background=True) for _ in range(8)
    ]
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            mine.responses.create(model="mock_chat", input=LONG, background=True)
        assert refused.value.code == "too_many_background_responses"
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(started[0].id)
        with pytest.raises(openai.NotFoundError):
            other.responses.cancel(started[0].id)
    finally:
        for response in started:
            mine.responses.cancel(response.id)
    # Their places are free again.
    again = mine.responses.create(model="mock_chat", input=SHORT, background=True)
    assert until_status(mine, again.id, "completed").output_text
    generation_stops(stack, "mock_chat")


def test_a_delete_on_the_other_replica_stops_it_for_good(stack: GatewayProcess) -> None:
    key = stack.create_key("background delete")["key"]
    first, second = (replica(stack, a, key) for a in stack.replica_addresses())
    created = first.responses.create(model="mock_chat", input=LONG, background=True)
    until_status(second, created.id, "in_progress")
    first_words(second, created.id)  # some output first: the run stores it as it goes
    second.responses.delete(created.id)
    generation_stops(stack, "mock_chat")  # the run on the first replica stopped
    # Well past its replica's next renewal: nothing brought it back.
    for client in (first, second):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id, stream=True)
