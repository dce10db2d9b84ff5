"""Keys, admin API, rate limits and sessions on the real stack: real Redis, real Triton, two
gateway processes sharing them, and the official openai client."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.item_index import ENTRY_OVERHEAD
from gateway.state.stored_bytes import MB, RECORD_OVERHEAD
from tests.support.generation import generated_tokens
from tests.support.stack import ROOT, GatewayProcess

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "hi"}]


#: GATEWAY_STORED_MB_PER_KEY of the second gateway process: 64 KB, a few stored responses.
REPLICA_STORED_MB = 0.0625


@pytest.fixture(scope="module")
def replica(stack: GatewayProcess, redis_store: EmbeddedRedis) -> Iterator[GatewayProcess]:
    """A second gateway process on the same Triton and Redis, with a small quota of stored
    bytes per key (what the other tests here store through it is far below it)."""
    gateway = GatewayProcess(
        triton_url=stack.triton_grpc,
        redis_url=redis_store.url,
        env={"GATEWAY_STORED_MB_PER_KEY": str(REPLICA_STORED_MB)},
    )
    with gateway.running(120, clean_exit=True):
        yield gateway


def keys_cli(redis: EmbeddedRedis, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *args],
        cwd=ROOT,
        # Not the embedded Redis: its password file (.run/) is not the test Redis's.
        env={**os.environ, "GATEWAY_REDIS_URL": redis.url, "GATEWAY_EMBEDDED_REDIS": "false"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_auth_failure_is_the_sdks_exception(stack: GatewayProcess) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        stack.client("sk-gw-0123456789ab-not-a-real-key").models.list()
    assert caught.value.code == "invalid_api_key"
    missing = httpx.get(stack.base_url + "/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"

    user = stack.client(stack.create_key("e2e", models=["mock_chat"])["key"])
    with pytest.raises(openai.PermissionDeniedError):
        user.get(stack.base_url + "/admin/keys", cast_to=object)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        user.chat.completions.create(model="smollm2", messages=HI, max_tokens=2)
    assert denied.value.code == "model_not_allowed"
    assert [m.id for m in user.models.list().data] == ["mock_chat"]
    assert user.chat.completions.create(model="mock_chat", messages=HI).choices[0].message.content


def test_the_keys_cli_creates_lists_and_revokes(
    stack: GatewayProcess, redis_store: EmbeddedRedis
) -> None:
    created = keys_cli(redis_store, "create", "--name", "from the cli", "--rpm", "100", "--json")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    client = stack.client(key["key"])
    assert client.chat.completions.create(model="mock_chat", messages=HI).choices
    listed = keys_cli(redis_store, "list")
    assert key["id"] in listed.stdout and "from the cli" in listed.stdout
    assert key["key"] not in listed.stdout
    revoked = keys_cli(redis_store, "revoke", key["id"])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    unknown = keys_cli(redis_store, "revoke", "000000000000")
    assert unknown.returncode == 1 and "No API key" in unknown.stderr


def test_two_gateway_processes_enforce_one_combined_rpm(
    stack: GatewayProcess, replica: GatewayProcess
) -> None:
    key = stack.create_key("e2e", rpm=6)["key"]
    body = {"model": "mock_chat", "messages": HI, "max_tokens": 2}

    def call(index: int) -> tuple[int, int]:
        gateway = (stack, replica)[index % 2]
        response = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        return index % 2, response.status_code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(20)))
    codes = sorted(code for _, code in results)
    assert codes == [200] * 6 + [429] * 14
    # Both processes served some and refused some: one limit, not one per process.
    assert {gateway for gateway, code in results if code == 429} == {0, 1}
    with pytest.raises(openai.RateLimitError):
        replica.client(key).chat.completions.create(**body)


def test_a_project_budget_spent_through_two_gateways_stops_at_its_exact_figure(
    stack: GatewayProcess, replica: GatewayProcess
) -> None:
    """docs/budgets.md: concurrent requests of two keys of one project, through nginx's two
    replicas and a third gateway process, never spend past the project's budget; the
    gateways' figure is the sum of what the clients were told they used, and the last
    request is refused only because what is left cannot hold one more."""
    budget = 300
    made = httpx.post(
        stack.base_url + "/admin/projects",
        json={"id": "e2e-budget", "budget": {"tokens_per_day": budget}},
        headers=stack.headers,
        timeout=10,
    )
    assert made.status_code == 201, made.text
    keys = [stack.create_key(f"budget {i}", project="e2e-budget")["key"] for i in range(2)]
    clients = [gateway.client(key) for gateway in (stack, replica) for key in keys]
    # mock_chat waits 10 ms a token: requests overlap on every process.
    slow = [{"role": "user", "content": "[mock:delay_ms=10] hi"}]

    def call(index: int, max_tokens: int | None) -> int | openai.RateLimitError:
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        try:
            answer = clients[index % 4].chat.completions.create(
                model="mock_chat", messages=slow, **extra
            )
        except openai.RateLimitError as exc:
            return exc
        assert answer.usage is not None
        return answer.usage.total_tokens

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: call(i, 20), range(24)))
    assert any(isinstance(r, openai.RateLimitError) for r in results)

    def settled() -> None:
        """Waits until the spend recorded is what the clients were told: a request is
        settled just after its response (until then its reservation, which for a request
        with no max_tokens is all that was left, holds the budget)."""
        told = sum(r for r in results if isinstance(r, int))
        deadline = time.monotonic() + 10
        while True:
            me = httpx.get(
                stack.base_url + "/v1/me", headers={"Authorization": f"Bearer {keys[0]}"}
            ).json()
            if me["spend"]["project"]["today"]["total_tokens"] == told:
                return
            assert time.monotonic() < deadline, (me["spend"], told)
            time.sleep(0.02)

    # Then, one at a time, requests with no max_tokens (given what is left) to the end.
    last: int | openai.RateLimitError = 0
    for index in range(40):
        settled()
        last = call(index, None)
        results.append(last)
        if isinstance(last, openai.RateLimitError):
            break
    assert isinstance(last, openai.RateLimitError), "the budget never ran out"
    assert last.code == "budget_exceeded"
    assert last.type == "insufficient_quota"
    assert last.response.headers["x-should-retry"] == "false"
    spent = sum(r for r in results if isinstance(r, int))
    assert 0 < spent <= budget
    # The refusal names the exact figure: used = what the clients were told, and the
    # smallest request (its prompt and one token) no longer fits what is left.
    found = re.search(r"limit (\d+), used (\d+), this request needs (\d+)", last.message)
    assert found, last.message
    limit, used, needs = (int(g) for g in found.groups())
    assert (limit, used) == (budget, spent)
    assert needs > budget - spent
    me = httpx.get(
        replica.base_url + "/v1/me", headers={"Authorization": f"Bearer {keys[0]}"}, timeout=10
    ).json()
    assert me["spend"]["project"]["today"]["total_tokens"] == spent
    report = httpx.get(
        stack.base_url + "/admin/spend",
        params={"project": "e2e-budget", "group_by": "key"},
        headers=stack.headers,
        timeout=10,
    ).json()
    assert sum(row["total_tokens"] for row in report["data"]) == spent
    assert len(report["data"]) == 2


def test_a_session_continues_on_another_process_and_stays_private(
    stack: GatewayProcess, replica: GatewayProcess
) -> None:
    created = stack.create_key("e2e")
    session = {"X-Session-ID": f"e2e-{time.time_ns()}"}
    first = stack.client(created["key"]).chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "Remember the word marmalade."}],
        extra_headers=session,
    )
    second = replica.client(created["key"]).chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "Which word?"}],
        extra_headers=session,
    )
    assert first.usage is not None and second.usage is not None
    # The second prompt carried the first turn: the model counted its tokens.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    stored = replica.client(created["key"]).get(
        f"{replica.base_url}/v1/sessions/{session['X-Session-ID']}", cast_to=object
    )
    assert isinstance(stored, dict)
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"] * 2
    assert stored["messages"][0]["content"] == "Remember the word marmalade."
    assert stored["messages"][1]["content"] == first.choices[0].message.content

    other = stack.client(stack.create_key("e2e")["key"])
    with pytest.raises(openai.NotFoundError):
        other.get(f"{stack.base_url}/v1/sessions/{session['X-Session-ID']}", cast_to=object)

    usage = httpx.get(
        f"{stack.base_url}/admin/keys/{created['id']}/usage", headers=stack.headers
    ).json()
    assert usage["requests"] == 3  # the two turns and the read of the session
    assert usage["prompt_tokens"] == first.usage.prompt_tokens + second.usage.prompt_tokens
    assert usage["completion_tokens"] == (
        first.usage.completion_tokens + second.usage.completion_tokens
    )


def test_redis_stopped_and_restarted_mid_test(
    stack: GatewayProcess, replica: GatewayProcess, redis_store: EmbeddedRedis
) -> None:
    created = stack.create_key("e2e")
    session = {"X-Session-ID": f"outage-{time.time_ns()}"}
    client = stack.client(created["key"])
    client.chat.completions.create(model="mock_chat", messages=HI, extra_headers=session)
    redis_store.stop()
    try:
        # The probes answer at once: not ready, alive.
        assert httpx.get(stack.base_url + "/health/ready").status_code == 503
        assert httpx.get(stack.base_url + "/health/live").status_code == 200

        def ask(gateway: GatewayProcess) -> str | None:
            reply = gateway.client(created["key"]).chat.completions.create(
                model="mock_chat", messages=HI
            )
            return reply.choices[0].message.content

        # Requests sent while Redis restarts wait for it (GATEWAY_BACKEND_WAIT_S, 5 s), on
        # either gateway; past the wait they would get a 503 (tests/unit/test_outages.py).
        # Redis starts again from this thread: its life follows the thread that started it.
        with ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            answers = [pool.submit(ask, gateway) for gateway in (stack, replica)]
            time.sleep(1.5)
            redis_store.start()
            assert all(answer.result(timeout=30) for answer in answers)
        assert 1.5 < time.monotonic() - started < 5  # they waited; nothing hangs
    finally:
        if not redis_store.answers():
            redis_store.start()
    # Both recover by themselves; the session survived Redis's restart.
    for gateway in (stack, replica):
        reply = gateway.client(created["key"]).chat.completions.create(
            model="mock_chat", messages=HI, extra_headers=session
        )
        assert reply.choices[0].message.content
    stored = client.get(f"{stack.base_url}/v1/sessions/{session['X-Session-ID']}", cast_to=object)
    assert isinstance(stored, dict) and len(stored["messages"]) == 6
    assert httpx.get(stack.base_url + "/health/ready").status_code == 200
    # No key and no key hash ever reaches the logs.
    for gateway in (stack, replica):
        assert created["key"] not in gateway.output()
        assert "sk-gw-" not in gateway.output()
        assert hashlib.sha256(created["key"].encode()).hexdigest() not in gateway.output()


def stored_records(redis_store: EmbeddedRedis, owner: str) -> dict[str, int]:
    """The records ``owner`` keeps in Redis, each with the bytes the quota counts."""
    with redis.Redis.from_url(redis_store.url, decode_responses=True) as client:
        names = [
            name
            for pattern in (f"gw:response:{owner}:*", f"gw:session:{owner}:*")
            for name in client.scan_iter(pattern)
        ]
        records = {name: int(client.strlen(name)) + RECORD_OVERHEAD for name in names}
        # A response's items' index entries (item_reference), one record per response.
        index: dict[str, int] = {}
        for name in client.scan_iter(f"gw:item:{owner}:*"):
            location = str(client.get(name))
            index[location] = index.get(location, RECORD_OVERHEAD) + len(name) + len(location)
            index[location] += ENTRY_OVERHEAD
        return records | {f"items:{location}": size for location, size in index.items()}


def test_a_key_that_fills_its_storage_is_refused_while_another_key_stores(
    stack: GatewayProcess, replica: GatewayProcess, redis_store: EmbeddedRedis
) -> None:
    """The attack: one key stores until Redis's room for conversations is gone. With a
    quota per key (the replica's: 64 KB), it is refused before generating, and only it."""
    filler, neighbour = stack.create_key("fills storage"), stack.create_key("neighbour")
    client = replica.client(filler["key"])
    text = "lorem ipsum " * 900  # 10.8 KB, stored twice per response (input and message)
    stored: list[str] = []
    for _ in range(10):
        try:
            answer = client.responses.create(model="mock_chat", input=text, max_output_tokens=2)
        except openai.PermissionDeniedError as exc:
            refused = exc
            break
        stored.append(answer.id)
    else:
        pytest.fail("the key stored past its quota")
    assert refused.code == "storage_quota_exceeded"
    assert f"GATEWAY_STORED_MB_PER_KEY={REPLICA_STORED_MB} MB" in refused.message
    assert len(stored) >= 2
    # Refused before the model was asked: no token was generated for it.
    before = generated_tokens(stack, "mock_chat")
    with pytest.raises(openai.PermissionDeniedError):
        client.responses.create(model="mock_chat", input=text, max_output_tokens=2)
    assert generated_tokens(stack, "mock_chat") == before

    # The neighbour stores responses and sessions on the same replica.
    other = replica.client(neighbour["key"])
    kept = other.responses.create(model="mock_chat", input=text, max_output_tokens=2)
    assert other.responses.retrieve(kept.id).id == kept.id
    other.chat.completions.create(
        model="mock_chat", messages=HI, max_tokens=2, extra_headers={"X-Session-ID": "mine"}
    )
    assert other.get(f"{replica.base_url}/v1/sessions/mine", cast_to=object)

    # /v1/me shows what the key keeps, exactly what its records take in Redis.
    def storage() -> dict[str, Any]:
        me = httpx.get(
            replica.base_url + "/v1/me",
            headers={"Authorization": f"Bearer {filler['key']}"},
            timeout=10,
        )
        return me.json()["storage"]["key"]  # type: ignore[no-any-return]

    records = stored_records(redis_store, filler["id"])
    assert len([name for name in records if not name.startswith("items:")]) == len(stored)
    quota = int(REPLICA_STORED_MB * MB)
    assert storage() == {"used_bytes": sum(records.values()), "quota_bytes": quota}
    assert quota - sum(records.values()) < max(records.values())  # it was full

    # Deleting a response frees its bytes at once: the key stores again.
    client.responses.delete(stored[0])
    assert storage()["used_bytes"] == sum(stored_records(redis_store, filler["id"]).values())
    assert client.responses.create(model="mock_chat", input=text, max_output_tokens=2).id
