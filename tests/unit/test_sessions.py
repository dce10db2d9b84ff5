"""Chat sessions stored in Redis: continued, owned by their key, trimmed to the context and
to the stored-size bound."""

from __future__ import annotations

import httpx
import pytest

from gateway.backend import ModelInfo
from gateway.backend.fake import TOOLS_TEMPLATE, FakeBackend
from gateway.errors import InvalidRequestError
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.redis import connect
from gateway.state.sessions import Message, Session, SessionStore, Turn, estimate_tokens, plan
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import REPLY, bearer, new_key

CHAT = "/v1/chat/completions"


def _say(text: str, **fields: object) -> dict[str, object]:
    return chat_body(messages=[{"role": "user", "content": text}], **fields)


async def test_a_session_continues_the_conversation(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    first = await http.post(CHAT, json=_say("My name is Ann."), headers={"X-Session-ID": "s1"})
    assert first.status_code == 200
    assert first.headers["x-session-id"] == "s1"
    await http.post(CHAT, json=_say("What is my name?"), headers={"X-Session-ID": "s1"})
    prompt = fake.calls[-1].prompt
    # The stored turn comes first, then the new message.
    assert prompt.index("My name is Ann.") < prompt.index(REPLY) < prompt.index("What is my")
    stored = (await http.get("/v1/sessions/s1")).json()
    assert stored["object"] == "chat.session"
    assert [(m["role"], m["content"]) for m in stored["messages"]] == [
        ("user", "My name is Ann."),
        ("assistant", REPLY),
        ("user", "What is my name?"),
        ("assistant", REPLY),
    ]


async def test_without_the_header_nothing_is_remembered(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    await http.post(CHAT, json=_say("My name is Ann."))
    await http.post(CHAT, json=_say("What is my name?"))
    assert "Ann" not in fake.calls[-1].prompt


async def test_a_streamed_reply_is_stored_too(http: httpx.AsyncClient) -> None:
    response = await http.post(
        CHAT, json=_say("Hello there.", stream=True), headers={"X-Session-ID": "st"}
    )
    assert response.status_code == 200
    assert response.headers["x-session-id"] == "st"
    messages = (await http.get("/v1/sessions/st")).json()["messages"]
    assert messages[-1] == {"role": "assistant", "content": REPLY}


async def test_a_failed_stream_leaves_the_session_as_it_was(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    await http.post(CHAT, json=_say("One."), headers={"X-Session-ID": "f"})
    fake.fail_after_tokens = 2
    response = await http.post(CHAT, json=_say("Two.", stream=True), headers={"X-Session-ID": "f"})
    assert '"error"' in response.text
    contents = [m["content"] for m in (await http.get("/v1/sessions/f")).json()["messages"]]
    assert contents == ["One.", REPLY]


async def test_the_system_message_is_kept_once_and_can_be_replaced(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    head = {"X-Session-ID": "sys"}
    system = {"role": "system", "content": "Be brief."}
    await http.post(
        CHAT, json=chat_body(messages=[system, {"role": "user", "content": "A"}]), headers=head
    )
    await http.post(CHAT, json=_say("B"), headers=head)
    assert fake.calls[-1].prompt.count("Be brief.") == 1
    messages = (await http.get("/v1/sessions/sys")).json()["messages"]
    assert messages[0] == system
    assert [m["role"] for m in messages].count("system") == 1
    other = {"role": "developer", "content": "Be verbose."}
    await http.post(
        CHAT, json=chat_body(messages=[other, {"role": "user", "content": "C"}]), headers=head
    )
    assert "Be brief." not in fake.calls[-1].prompt
    assert (await http.get("/v1/sessions/sys")).json()["messages"][0]["content"] == "Be verbose."


async def test_another_key_cannot_see_use_or_delete_a_session(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    owner = (await new_key(http, name="owner"))["key"]
    other = (await new_key(http, name="other"))["key"]
    head = {"X-Session-ID": "private", **bearer(owner)}
    assert (await http.post(CHAT, json=_say("Secret."), headers=head)).status_code == 200
    for response in (
        await http.get("/v1/sessions/private", headers=bearer(other)),
        await http.delete("/v1/sessions/private", headers=bearer(other)),
        await http.get("/v1/sessions/private"),  # the admin key is another key too
    ):
        assert_openai_error(response, 404, code="session_not_found")
    # The same id is free for the other key: its own, empty session (nothing to probe).
    theirs = {"X-Session-ID": "private", **bearer(other)}
    assert (await http.post(CHAT, json=_say("Tell me."), headers=theirs)).status_code == 200
    assert "Secret." not in fake.calls[-1].prompt
    mine = (await http.get("/v1/sessions/private", headers=bearer(owner))).json()["messages"]
    assert [m["content"] for m in mine] == ["Secret.", REPLY]


async def test_delete_forgets_the_session(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    await http.post(CHAT, json=_say("Remember me."), headers={"X-Session-ID": "d"})
    deleted = await http.delete("/v1/sessions/d")
    assert deleted.json() == {"id": "d", "object": "chat.session.deleted", "deleted": True}
    assert_openai_error(await http.get("/v1/sessions/d"), 404)
    assert_openai_error(await http.delete("/v1/sessions/d"), 404)
    await http.post(CHAT, json=_say("Hi again."), headers={"X-Session-ID": "d"})
    assert "Remember me." not in fake.calls[-1].prompt


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "../etc", "a/b"])
async def test_an_invalid_session_id_is_a_400(http: httpx.AsyncClient, bad: str) -> None:
    response = await http.post(CHAT, json=_say("Hi"), headers={"X-Session-ID": bad})
    assert_openai_error(response, 400, param="X-Session-ID")


async def test_the_oldest_turns_are_dropped_to_fit_the_context(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # fake-chat has a 2,048-token context; each message here is estimated at ~600 tokens.
    head = {"X-Session-ID": "long"}
    for index in range(6):
        text = f"turn{index} " + "lorem ipsum " * 150
        response = await http.post(CHAT, json=_say(text, max_tokens=20), headers=head)
        assert response.status_code == 200
    prompt = fake.calls[-1].prompt
    assert "turn5" in prompt and "turn4" in prompt
    assert "turn0" not in prompt and "turn1" not in prompt
    stored = (await http.get("/v1/sessions/long")).json()["messages"]
    assert stored[0]["content"].startswith("turn3") or stored[0]["content"].startswith("turn4")
    assert stored[-2]["content"].startswith("turn5")


def test_plan_keeps_the_newest_turns_within_the_budget() -> None:
    turns = [
        Turn(messages=[], tokens=400),
        Turn(messages=[], tokens=300),
        Turn(messages=[], tokens=200),
    ]
    session = Session(id="p", owner="k", created_at=0, updated_at=0, turns=turns)
    new = [{"role": "user", "content": "x" * 30}]  # 10 + 4 tokens
    # 1,000 context - 100 reply - 14 new = 886: the 200 and 300 turns fit, the 400 one not.
    result = plan(session, new, context_length=1000, max_tokens=100)
    assert result.dropped == 1
    assert estimate_tokens("x" * 30) == 14
    # Without max_tokens a quarter of the context is kept for the reply.
    assert plan(session, new, context_length=1000, max_tokens=None).dropped == 1
    assert plan(session, new, context_length=4000, max_tokens=None).dropped == 0


def _turn(text: str) -> Turn:
    return Turn(messages=[Message(role="user", content=text)], tokens=1)


def test_plan_keeps_the_newest_turns_that_fit_the_stored_size() -> None:
    # A context that never binds: here only the store's bound (1 KB) drops turns.
    turns = [_turn(f"{i}" * 200) for i in range(4)]
    session = Session(id="p", owner="k", created_at=0, updated_at=0, turns=turns)
    new = [{"role": "user", "content": "n" * 200}]
    result = plan(session, new, context_length=10**6, max_tokens=10, max_stored_kb=1)
    assert result.dropped == 2
    assert [m["content"][0] for m in result.history] == ["2", "3"]
    assert plan(session, new, context_length=10**6, max_tokens=10).dropped == 0
    with pytest.raises(InvalidRequestError) as refused:
        plan(session, [{"role": "user", "content": "n" * 1100}], 10**6, 10, max_stored_kb=1)
    assert refused.value.param == "messages" and "GATEWAY_MAX_STORED_KB" in refused.value.message


async def test_a_saved_session_never_exceeds_the_stored_size(redis_server: EmbeddedRedis) -> None:
    redis = connect(redis_server.url, 1.0, 8)
    sessions = SessionStore(redis, ttl_s=60, max_stored_kb=1)
    try:
        for index in range(4):
            stored = await sessions.open("s", "k")
            turn = plan(stored, [{"role": "user", "content": f"{index}" * 200}], 10**6, 10)
            await sessions.save_turn(turn, {"role": "assistant", "content": "ok"}, 1)
            saved = await sessions.get("s", "k")
            assert len(saved.model_dump_json().encode()) <= 1024
        kept = (await sessions.get("s", "k")).public()["messages"]
        assert [m["content"][0] for m in kept] == ["2", "o", "3", "o"]
        stored = await sessions.open("s", "k")
        huge = plan(stored, [{"role": "user", "content": "h" * 2000}], 10**6, 10)
        with pytest.raises(InvalidRequestError):
            await sessions.save_turn(huge, {"role": "assistant", "content": "ok"}, 1)
        assert (await sessions.get("s", "k")).public()["messages"] == kept  # nothing written
    finally:
        await redis.aclose()


async def test_a_turn_too_large_to_store_is_a_400_and_leaves_the_session_as_it_was(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # A model whose config states no context length: only the store bounds the session.
    fake.model_list.append(ModelInfo("fake-long", "chat", True, TOOLS_TEMPLATE))
    head = {"X-Session-ID": "big"}
    first = chat_body(model="fake-long", messages=[{"role": "user", "content": "One."}])
    assert (await http.post(CHAT, json=first, headers=head)).status_code == 200
    huge = chat_body(model="fake-long", messages=[{"role": "user", "content": "x" * 1_100_000}])
    error = assert_openai_error(await http.post(CHAT, json=huge, headers=head), 400)
    assert error["param"] == "messages" and "GATEWAY_MAX_STORED_KB" in error["message"]
    contents = [m["content"] for m in (await http.get("/v1/sessions/big")).json()["messages"]]
    assert contents == ["One.", REPLY]
