"""Projects, budgets and spend (docs/budgets.md) on a real redis-server: reserved at
admission, settled to what was used, exact under concurrency, released on failure; 429
budget_exceeded with its reset, 429 budget_held while running requests hold the rest;
prices; the admin API, /v1/me and the metrics."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from gateway.errors import BudgetExceededError
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.admission import Admission
from gateway.state.budgets import counters_key
from gateway.state.keys import ApiKey
from gateway.state.limits import Meter
from tests.support.audio import tone_file
from tests.support.bodies import assert_openai_error, chat_body, sse_json
from tests.support.inprocess import bearer, make_settings, new_key, sdk, serve
from tests.support.waiting import until

CHAT = "/v1/chat/completions"
PRICES = {
    "fake-chat": {"input": 2.0, "output": 10.0},  # per million tokens
    "*": {"input": 1.0, "output": 1.0},
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _seconds_to_midnight() -> float:
    now = _now()
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    return (midnight - now).total_seconds()


async def _project(http: httpx.AsyncClient, project_id: str, **budget: Any) -> None:
    body: dict[str, Any] = {"id": project_id}
    if budget:
        body["budget"] = budget
    response = await http.post("/admin/projects", json=body)
    assert response.status_code == 201, response.text


async def _me(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await http.get("/v1/me", headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _used(me: dict[str, Any], budget: str, scope: str = "key") -> float:
    (use,) = [b for b in me["budgets"] if b["budget"] == budget and b["scope"] == scope]
    return use["used"]  # type: ignore[no-any-return]


async def test_a_token_budget_stops_at_its_figure_with_429_budget_exceeded(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, budget={"tokens_per_day": 100}))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(40))
    # "Hi" in the fake's template is reserved at its bytes + 1 plus max_tokens.
    first = await http.post(CHAT, json=chat_body(max_tokens=40), headers=bearer(key))
    assert first.status_code == 200, first.text
    spent = first.json()["usage"]["total_tokens"]
    assert _used(await _me(http, key), "tokens_per_day") == spent
    calls = len(fake.calls)
    refused = await http.post(CHAT, json=chat_body(max_tokens=100 - spent), headers=bearer(key))
    error = assert_openai_error(
        refused, 429, type="insufficient_quota", code="budget_exceeded", param=None
    )
    assert "tokens per day: limit 100" in error["message"]
    assert f"used {spent}" in error["message"]
    tomorrow = (_now().date() + dt.timedelta(days=1)).isoformat()
    assert f"resets at {tomorrow}T00:00:00Z" in error["message"]
    assert abs(int(refused.headers["retry-after"]) - _seconds_to_midnight()) < 5
    assert refused.headers["x-should-retry"] == "false"  # the SDKs would retry a 429
    assert len(fake.calls) == calls  # refused before the model was asked
    # The SDK's exception, not retried (max_retries stays at its default of 2).
    client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=key, http_client=http)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**chat_body(max_tokens=100))
    assert caught.value.code == "budget_exceeded"
    assert len(fake.calls) == calls


async def test_without_max_tokens_a_request_gets_what_the_budget_has_left(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, budget={"tokens_per_month": 60}))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(200))
    answer = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    assert answer.status_code == 200, answer.text
    prompt = fake.calls[-1].prompt
    granted = fake.calls[-1].options.max_tokens
    assert granted == 60 - (len(prompt.encode()) + 1)  # the prompt's bound, then the rest
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    used = _used(await _me(http, key), "tokens_per_month")
    assert used == answer.json()["usage"]["total_tokens"] <= 60


async def test_concurrent_requests_spend_exactly_and_never_past_the_budget(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, budget={"tokens_per_day": 1000}))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(30))
    fake.token_delay_s = 0.02  # every request still runs when the last one is admitted
    body = chat_body(max_tokens=100, stream=True, stream_options={"include_usage": True})
    responses = await asyncio.gather(
        *(http.post(CHAT, json=body, headers=bearer(key)) for _ in range(20))
    )
    codes = sorted(r.status_code for r in responses)
    # Each reserves its prompt's bound + 100 while it runs: the budget holds 8 at once.
    bound = len(fake.calls[0].prompt.encode()) + 1
    assert codes == [200] * (1000 // (bound + 100)) + [429] * (20 - 1000 // (bound + 100))
    # The others were refused for what the running ones held, not for a spent budget: a
    # 429 the SDKs retry a second later.
    for refused in (r for r in responses if r.status_code == 429):
        assert_openai_error(refused, 429, type="tokens", code="budget_held")
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["x-should-retry"] == "true"
    spent = sum(_stream_usage(r.text) for r in responses if r.status_code == 200)
    assert _used(await _me(http, key), "tokens_per_day") == spent <= 1000
    by_key = (await http.get("/admin/spend", params={"group_by": "key"})).json()["data"]
    (row,) = [r for r in by_key if r["key"] != "admin"]
    assert row["total_tokens"] == spent
    assert row["requests"] == codes.count(200)


async def test_a_request_without_max_tokens_holds_what_is_left_only_while_it_runs(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """It is granted what the budget has left; one arriving meanwhile is refused for what
    the first holds (429 budget_held, which the SDK retries), and once the first has ended
    and released what it did not use, the SDK's retry gets through."""
    key = (await new_key(http, budget={"tokens_per_day": 400}))["key"]
    fake.reply = "a b c"
    fake.token_delay_s = 0.2  # the first request streams for about half a second
    body = chat_body(stream=True, stream_options={"include_usage": True})
    first = asyncio.create_task(http.post(CHAT, json=body, headers=bearer(key)))
    await until(lambda: fake.calls, "the first request never reached the model")
    (use,) = (await _me(http, key))["budgets"]
    assert use["used"] == 0 and use["reserved"] == 400 and use["remaining"] == 0

    refused = await http.post(CHAT, json=chat_body(max_tokens=5), headers=bearer(key))
    error = assert_openai_error(refused, 429, type="tokens", code="budget_held")
    assert "reserved by running requests 400" in error["message"], error
    # The official SDK retries it after Retry-After (1 s): by then the first has ended.
    client = sdk(http, key).with_options(max_retries=2)
    answer = await client.chat.completions.create(
        model="fake-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert answer.choices[0].message.content
    done = await first
    assert done.status_code == 200, done.text
    (use,) = (await _me(http, key))["budgets"]
    assert answer.usage is not None
    spent = _stream_usage(done.text) + answer.usage.total_tokens
    assert use["used"] == spent and use["reserved"] == 0 and use["remaining"] == 400 - spent


def _stream_usage(text: str) -> int:
    (usage,) = [e["usage"] for e in sse_json(text) if e.get("usage")]
    return int(usage["total_tokens"])


async def test_a_failed_request_releases_its_reservation(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http, budget={"tokens_per_day": 500}))["key"]
    fake.up = False
    failed = await http.post(CHAT, json=chat_body(max_tokens=400), headers=bearer(key))
    assert failed.status_code == 503, failed.text
    assert _used(await _me(http, key), "tokens_per_day") == 0
    fake.up = True
    again = await http.post(CHAT, json=chat_body(max_tokens=400), headers=bearer(key))
    assert again.status_code == 200, again.text


async def test_a_project_budget_is_shared_by_its_keys_and_names_the_project(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    await _project(http, "team-a", tokens_per_day=200)
    await _project(http, "free")  # no budget: never blocks
    first = (await new_key(http, project="team-a"))["key"]
    second = (await new_key(http, project="team-a"))["key"]
    unbudgeted = (await new_key(http, project="free"))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(50))
    ok = await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(first))
    assert ok.status_code == 200, ok.text
    ok = await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(second))
    assert ok.status_code == 200, ok.text
    refused = await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(first))
    error = assert_openai_error(refused, 429, code="budget_exceeded")
    assert "project 'team-a'" in error["message"]
    for _ in range(3):
        free = await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(unbudgeted))
        assert free.status_code == 200, free.text
    me = await _me(http, second)
    assert me["project"] == "team-a"
    assert me["spend"]["project"]["today"]["requests"] == 2
    assert me["spend"]["key"]["today"]["requests"] == 1
    assert _used(me, "tokens_per_day", "project") == me["spend"]["project"]["today"]["total_tokens"]
    # Raised, it applies to the next request at once.
    raised = await http.patch("/admin/projects/team-a", json={"budget": {"tokens_per_day": 1000}})
    assert raised.status_code == 200, raised.text
    ok = await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(first))
    assert ok.status_code == 200, ok.text
    by_project = (await http.get("/admin/spend", params={"group_by": "project"})).json()
    assert {r["project"]: r["requests"] for r in by_project["data"]} == {"team-a": 3, "free": 3}
    team = await http.get("/admin/spend", params={"group_by": "key", "project": "team-a"})
    assert sorted(r["requests"] for r in team.json()["data"]) == [1, 2]


async def test_keys_and_projects_are_refused_what_does_not_exist(http: httpx.AsyncClient) -> None:
    missing = await http.post("/admin/keys", json={"name": "k", "project": "nope"})
    assert_openai_error(missing, 400, param="project", code="project_not_found")
    await _project(http, "p1")
    again = await http.post("/admin/projects", json={"id": "p1"})
    assert_openai_error(again, 400, param="id", code="project_exists")
    bad = await http.post("/admin/projects", json={"id": "Has Spaces"})
    assert_openai_error(bad, 400, param="id")
    typo = await http.post("/admin/keys", json={"name": "k", "budget": {"token_per_day": 5}})
    assert_openai_error(typo, 400, param="budget.token_per_day")
    key = await new_key(http)
    moved = await http.patch(f"/admin/keys/{key['id']}", json={"project": "p1"})
    assert moved.status_code == 200 and moved.json()["project"] == "p1"
    assert (await http.patch("/admin/keys/000000000000", json={})).status_code == 404
    assert (await http.get("/admin/projects/nope")).status_code == 404


async def test_money_budgets_at_the_price_table_and_unpriced_models() -> None:
    fake = FakeBackend()
    settings = make_settings(prices={"fake-chat": {"input": 2.0, "output": 10.0}})
    async with serve(settings, fake) as (_, http, _client):
        fake.reply = " ".join(f"w{i}" for i in range(100))
        # 0.002 buys 200 output tokens at 10 per million, less the prompt's.
        key = (await new_key(http, budget={"cost_per_day": 0.002}))["key"]
        answer = await http.post(CHAT, json=chat_body(max_tokens=100), headers=bearer(key))
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        cost = (usage["prompt_tokens"] * 2.0 + usage["completion_tokens"] * 10.0) / 1e6
        assert _used(await _me(http, key), "cost_per_day") == pytest.approx(cost, abs=1e-12)
        refused = await http.post(CHAT, json=chat_body(max_tokens=100), headers=bearer(key))
        error = assert_openai_error(refused, 429, code="budget_exceeded")
        assert "money per day: limit 0.002" in error["message"]
        # Flexible: what is left buys fewer tokens.
        answer = await http.post(CHAT, json=chat_body(), headers=bearer(key))
        assert answer.status_code == 200, answer.text
        assert 0 < fake.calls[-1].options.max_tokens < 100
        spend = (await http.get("/admin/spend", params={"group_by": "model"})).json()["data"]
        assert spend[0]["model"] == "fake-chat" and spend[0]["cost"] <= 0.002

        unpriced = await http.post(
            CHAT, json=chat_body(model="fake-plain", max_tokens=5), headers=bearer(key)
        )
        assert_openai_error(unpriced, 403, param="model", code="model_not_priced")
        tokens_only = (await new_key(http, budget={"tokens_per_day": 100}))["key"]
        fine = await http.post(
            CHAT, json=chat_body(model="fake-plain", max_tokens=5), headers=bearer(tokens_only)
        )
        assert fine.status_code == 200, fine.text


async def test_a_period_gone_counts_nothing_and_a_month_resets_on_the_first(
    http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    made = await new_key(http, budget={"tokens_per_day": 100, "tokens_per_month": 200})
    key = made["key"]
    first = await http.post(CHAT, json=chat_body(max_tokens=5), headers=bearer(key))
    assert first.status_code == 200, first.text
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as store:
        counters = counters_key("key", made["id"])
        today = int(store.hget(counters, "day") or 0)
        assert today == (_now().date() - dt.date(1970, 1, 1)).days  # Redis's clock, UTC
        assert int(store.hget(counters, "month") or 0) == _now().year * 12 + _now().month - 1
        # Yesterday spent the whole day's budget: today's is untouched by it.
        store.hset(counters, mapping={"day": today - 1, "day_tokens": 100})
    ok = await http.post(CHAT, json=chat_body(max_tokens=40), headers=bearer(key))
    assert ok.status_code == 200, ok.text
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as store:
        store.hset(counters, "month_tokens", 150)
    refused = await http.post(CHAT, json=chat_body(max_tokens=30), headers=bearer(key))
    error = assert_openai_error(refused, 429, code="budget_exceeded")
    assert "tokens per month: limit 200, used 150" in error["message"]
    now = _now()
    first_day = dt.datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=dt.UTC)
    assert f"resets at {first_day.date().isoformat()}T00:00:00Z" in error["message"]
    assert abs(int(refused.headers["retry-after"]) - (first_day - now).total_seconds()) < 5


async def test_audio_is_refused_once_a_budget_is_spent(
    http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    made = await new_key(http, budget={"tokens_per_day": 100})
    key = made["key"]
    speech = {"model": "fake-tts", "input": "hello", "voice": "alloy"}
    spoken = await http.post("/v1/audio/speech", json=speech, headers=bearer(key))
    assert spoken.status_code == 200, spoken.text
    assert _used(await _me(http, key), "tokens_per_day") == 0  # speech is no tokens
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as store:
        store.hset(counters_key("key", made["id"]), "day_tokens", 100)  # spent to the token
    refused = await http.post("/v1/audio/speech", json=speech, headers=bearer(key))
    assert_openai_error(refused, 429, code="budget_exceeded")


async def test_spend_reports_by_day_and_model_and_bounds_the_range(
    http: httpx.AsyncClient,
) -> None:
    key = (await new_key(http))["key"]
    for _ in range(2):
        assert (await http.post(CHAT, json=chat_body(), headers=bearer(key))).status_code == 200
    today = _now().date().isoformat()
    by_day = (await http.get("/admin/spend", params={"group_by": "day"})).json()
    assert [r["day"] for r in by_day["data"]] == [today]
    assert by_day["data"][0]["requests"] == 2
    by_model = (await http.get("/admin/spend", params={"group_by": "model"})).json()["data"]
    assert [(r["model"], r["requests"]) for r in by_model] == [("fake-chat", 2)]
    assert by_model[0]["cost"] == 0  # no price table
    old = await http.get("/admin/spend", params={"start": "2020-01-01", "end": "2020-12-31"})
    assert_openai_error(old, 400, param="start")
    bad = await http.get("/admin/spend", params={"start": "yesterday"})
    assert_openai_error(bad, 400, param="start")
    wrong = await http.get("/admin/spend", params={"group_by": "week"})
    assert_openai_error(wrong, 400, param="group_by")


async def test_the_metrics_show_spend_budget_use_and_refusals() -> None:
    fake = FakeBackend()
    settings = make_settings(prices={"*": {"input": 1000.0, "output": 1000.0}})
    async with serve(settings, fake) as (_, http, _client):
        await _project(http, "team-m", tokens_per_day=100)
        key = (await new_key(http, project="team-m"))["key"]
        assert (
            await http.post(CHAT, json=chat_body(max_tokens=5), headers=bearer(key))
        ).status_code == 200
        assert (
            await http.post(CHAT, json=chat_body(max_tokens=50), headers=bearer(key))
        ).status_code == 429
        text = (await http.get("/metrics")).text
    assert 'gateway_budget_exceeded_total{scope="project"} 1.0' in text
    assert 'gateway_spend_total{model="fake-chat",project="team-m"}' in text
    ratio = [
        line
        for line in text.splitlines()
        if line.startswith('gateway_budget_used_ratio{name="team-m",period="day",scope="project"}')
    ]
    assert ratio and 0 < float(ratio[0].split()[-1]) <= 1


async def test_a_key_without_a_budget_is_never_blocked_and_its_spend_counts(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    key = (await new_key(http))["key"]
    fake.reply = " ".join(f"w{i}" for i in range(100))
    client = sdk(http, key)
    for _ in range(3):
        assert (await client.chat.completions.create(**chat_body(max_tokens=1000))).choices
    me = await _me(http, key)
    assert me["budgets"] == []
    assert me["spend"]["key"]["today"]["requests"] == 3
    assert me["spend"]["key"]["this_month"]["completion_tokens"] == 300


async def test_a_transcription_reserves_the_price_of_its_audio() -> None:
    settings = make_settings(prices={"fake-stt": {"audio_input": 60.0}})  # 1 a second
    async with serve(settings, FakeBackend()) as (_, http, _client):
        key = (await new_key(http, budget={"cost_per_day": 2.5}))["key"]
        upload = {"file": ("a.wav", tone_file(1.0), "audio/wav")}
        form = {"model": "fake-stt"}
        for _ in range(2):
            done = await http.post(
                "/v1/audio/transcriptions", data=form, files=upload, headers=bearer(key)
            )
            assert done.status_code == 200, done.text
        assert _used(await _me(http, key), "cost_per_day") == pytest.approx(2.0, abs=1e-6)
        refused = await http.post(
            "/v1/audio/transcriptions", data=form, files=upload, headers=bearer(key)
        )
        error = assert_openai_error(refused, 429, code="budget_exceeded")
        assert "this request needs 1" in error["message"]


async def test_audio_waits_while_running_requests_hold_all_that_is_left(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """Speech is counted when it ends: while a request without max_tokens holds all that
    is left, it would spend past the budget, so it is refused for the hold (retryable)."""
    key = (await new_key(http, budget={"tokens_per_day": 400}))["key"]
    fake.reply = "a b c"
    fake.token_delay_s = 0.2
    body = chat_body(stream=True, stream_options={"include_usage": True})
    first = asyncio.create_task(http.post(CHAT, json=body, headers=bearer(key)))
    await until(lambda: fake.calls, "the first request never reached the model")
    speech = {"model": "fake-tts", "input": "hello", "voice": "alloy"}
    refused = await http.post("/v1/audio/speech", json=speech, headers=bearer(key))
    assert_openai_error(refused, 429, code="budget_held")
    assert (await first).status_code == 200
    spoken = await http.post("/v1/audio/speech", json=speech, headers=bearer(key))
    assert spoken.status_code == 200, spoken.text


def _admission(api_key: ApiKey) -> Admission:
    return Admission(key=api_key, headers={}, meter=Meter(), model="fake-chat")


async def test_what_a_request_holds_itself_cannot_make_room_so_it_is_budget_exceeded(
    http: httpx.AsyncClient, app: FastAPI
) -> None:
    """A request that reserves twice (audio chat: its audio, then its answer) is refused
    for good when the second cannot fit beside the first, not asked to retry."""
    made = await new_key(http, budget={"tokens_per_day": 400})
    budgets = app.state.services.budgets
    request = _admission(await app.state.services.keys.get(made["id"]))
    assert (
        await budgets.reserve(request.key, request.model, request.meter, 10, 290, 1, False) == 290
    )
    with pytest.raises(BudgetExceededError):
        await budgets.reserve(request.key, request.model, request.meter, 10, 150, 1, False)
    await budgets.settle(request.key, request.model, request.meter)
    assert (await _me(http, made["key"]))["budgets"][0]["reserved"] == 0


async def test_a_settle_run_twice_counts_once_and_leaves_the_others_holds(
    http: httpx.AsyncClient, app: FastAPI
) -> None:
    """Redis may run a settle whose reply was lost, and the client send it again: the
    second run changes nothing, so it neither counts the spend twice nor releases what
    other running requests hold."""
    made = await new_key(http, budget={"tokens_per_day": 400})
    budgets = app.state.services.budgets
    api_key = await app.state.services.keys.get(made["id"])
    running, ended = _admission(api_key), _admission(api_key)
    await budgets.reserve(running.key, running.model, running.meter, 10, 190, 1, False)  # holds 200
    await budgets.reserve(ended.key, ended.model, ended.meter, 10, 40, 1, False)  # holds 50
    ended.meter.add_tokens(8, 12)
    await budgets.settle(ended.key, ended.model, ended.meter)
    await budgets.settle(ended.key, ended.model, ended.meter)  # again
    (use,) = (await _me(http, made["key"]))["budgets"]
    assert (use["used"], use["reserved"], use["remaining"]) == (20, 200, 180)
    await budgets.settle(running.key, running.model, running.meter)
    (use,) = (await _me(http, made["key"]))["budgets"]
    assert (use["used"], use["reserved"]) == (20, 0)


async def test_a_client_gone_while_its_reservation_is_made_still_has_it_released(
    http: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the reserving script runs, the request still records what the
    script reserved, so its settle releases it (else it would be held all day)."""
    made = await new_key(http, budget={"tokens_per_day": 400})
    budgets = app.state.services.budgets
    script = budgets._reserve
    started = asyncio.Event()

    async def slow(**kwargs: Any) -> Any:
        started.set()
        await asyncio.sleep(0.2)  # the client leaves meanwhile
        return await script(**kwargs)

    monkeypatch.setattr(budgets, "_reserve", slow)
    request = _admission(await app.state.services.keys.get(made["id"]))
    reserving = asyncio.create_task(
        budgets.reserve(request.key, request.model, request.meter, 10, 290, 1, True)
    )
    await started.wait()
    reserving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reserving
    assert [r[3] for r in request.meter.budget_reservations] == [300]
    await budgets.settle(request.key, request.model, request.meter)
    assert (await _me(http, made["key"]))["budgets"][0]["reserved"] == 0


async def test_holds_of_a_period_gone_count_nothing(
    http: httpx.AsyncClient, fake: FakeBackend, redis_server: EmbeddedRedis
) -> None:
    """What was held is stamped with its own day: once that day is not today (a writer
    that knew only the spend moved the counters on), it holds nothing."""
    made = await new_key(http, budget={"tokens_per_day": 100})
    key = made["key"]
    assert (await http.post(CHAT, json=chat_body(max_tokens=5), headers=bearer(key))).is_success
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as store:
        counters = counters_key("key", made["id"])
        store.hset(counters, mapping={"held_day_tokens": 100, "held_day": 1})
    (use,) = (await _me(http, key))["budgets"]
    assert use["reserved"] == 0 and use["remaining"] == 100 - use["used"]
    answer = await http.post(CHAT, json=chat_body(max_tokens=5), headers=bearer(key))
    assert answer.status_code == 200, answer.text
