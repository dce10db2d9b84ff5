"""API keys: who gets in, what they may use, and how keys are kept."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi import FastAPI

from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import ADMIN_KEY, BASE_URL, bearer, make_settings, new_key, sdk, serve

CHAT = "/v1/chat/completions"


async def test_no_key_is_401_with_the_openai_error_and_bearer_challenge(
    anon: httpx.AsyncClient,
) -> None:
    response = await anon.post(CHAT, json=chat_body())
    error = assert_openai_error(response, 401, code="invalid_api_key")
    assert "API key" in error["message"]
    assert response.headers["www-authenticate"] == "Bearer"
    for path in ("/v1/models", "/v1/sessions/x", "/admin/keys", "/admin/models"):
        assert_openai_error(await anon.get(path), 401, code="invalid_api_key")


async def test_health_stays_open(anon: httpx.AsyncClient) -> None:
    assert (await anon.get("/health/live")).status_code == 200
    assert (await anon.get("/health/ready")).status_code == 200


@pytest.mark.parametrize(
    "key",
    [
        "sk-wrong",
        "sk-gw-000000000000-notarealsecret",
        ADMIN_KEY + "x",
        "sk-gw-zzzzzzzzzzzz-x",
    ],
)
async def test_unknown_keys_raise_the_sdks_authentication_error(
    http: httpx.AsyncClient, key: str
) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk(http, key).chat.completions.create(**chat_body())
    assert caught.value.code == "invalid_api_key"


async def test_a_created_key_works_once_and_is_never_shown_again(
    http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    created = await new_key(http, name="my app")
    key = created["key"]
    assert key.startswith("sk-gw-") and len(key) > 40
    completion = await sdk(http, key).chat.completions.create(**chat_body())
    assert completion.choices[0].message.content
    listed = (await http.get("/admin/keys")).json()["data"]
    assert [k["name"] for k in listed] == ["my app"]
    assert key not in str(listed)
    assert "secret_hash" not in listed[0]
    assert listed[0]["redacted_value"] == f"sk-gw-{created['id']}-****"
    # Redis holds a hash, never the key itself.
    with redis.Redis.from_url(redis_server.url) as store:
        dump = " ".join(
            str(store.dump(name)) for name in store.scan_iter("*") if store.type(name) == b"string"
        )
    assert key not in dump
    assert key.split("-", 3)[3] not in dump


async def test_a_user_key_may_not_use_the_admin_api(http: httpx.AsyncClient) -> None:
    user = (await new_key(http))["key"]
    with pytest.raises(openai.PermissionDeniedError):
        await sdk(http, user).get(f"{BASE_URL}/admin/keys", cast_to=object)
    assert_openai_error(
        await http.post("/admin/keys", json={"name": "x"}, headers=bearer(user)),
        403,
        code="permission_denied",
    )


async def test_an_admin_key_from_redis_may_use_the_admin_api(http: httpx.AsyncClient) -> None:
    admin = (await new_key(http, role="admin"))["key"]
    response = await http.get("/admin/keys", headers=bearer(admin))
    assert response.status_code == 200
    assert len(response.json()["data"]) == 1


async def test_a_key_limited_to_some_models_sees_and_uses_only_those(
    http: httpx.AsyncClient,
) -> None:
    key = (await new_key(http, models=["fake-chat"]))["key"]
    client = sdk(http, key)
    assert [m.id for m in (await client.models.list()).data] == ["fake-chat"]
    await client.chat.completions.create(**chat_body())
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await client.audio.speech.create(model="fake-tts", voice="alloy", input="Hi.")
    assert caught.value.code == "model_not_allowed"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("fake-tts")


async def test_a_revoked_key_is_refused_at_once(http: httpx.AsyncClient) -> None:
    created = await new_key(http)
    client = sdk(http, created["key"])
    await client.models.list()
    revoked = await http.delete(f"/admin/keys/{created['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    with pytest.raises(openai.AuthenticationError) as caught:
        await client.models.list()
    assert "revoked" in caught.value.message
    # Revoking again is fine; the record stays listed.
    assert (await http.delete(f"/admin/keys/{created['id']}")).status_code == 200
    assert len((await http.get("/admin/keys")).json()["data"]) == 1


async def test_an_expired_key_is_refused(http: httpx.AsyncClient) -> None:
    created = await new_key(http, expires_at=int(time.time()) - 1)
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk(http, created["key"]).models.list()
    assert "expired" in caught.value.message
    fresh = await new_key(http, expires_in_days=1)
    assert fresh["expires_at"] > time.time() + 86_000
    await sdk(http, fresh["key"]).models.list()


async def test_key_admin_errors(http: httpx.AsyncClient) -> None:
    assert_openai_error(await http.delete("/admin/keys/nope"), 404, code="key_not_found")
    assert_openai_error(
        await http.post("/admin/keys", json={"name": "x", "role": "root"}), 400, param="role"
    )
    assert_openai_error(await http.post("/admin/keys", json={"name": "x", "rpm": 0}), 400)


@pytest.mark.parametrize(
    "weak",
    [
        "short",
        "changeme-changeme-changeme-changeme-1",
        "a" * 40,
        "sk-admin-" + "x1y2" * 8,
        "0123456789abcdefghijklmnopqrstuvwxyz",
        "qwertyuiopasdfghjklzxcvbnm1234567890",
        "correcthorsebatterystaplecorrecthorse",
    ],
)
def test_a_weak_or_guessable_admin_key_is_refused_at_start(weak: str) -> None:
    with pytest.raises(ValueError, match="GATEWAY_ADMIN_KEY is refused"):
        make_settings(admin_key=weak)


@pytest.mark.parametrize("word", ["test", "admin", "secret", "example"])
def test_a_random_admin_key_is_accepted_whatever_word_it_contains(word: str) -> None:
    # Judged by how hard it is to guess, not by the words in it: a random key that happens
    # to contain "test" or "admin" is as strong as any other.
    key = f"sk-gw-{secrets.token_urlsafe(8)}{word}{secrets.token_urlsafe(24)}"
    settings: Settings = make_settings(admin_key=key)
    assert settings.admin_key is not None and settings.admin_key.get_secret_value() == key


def test_a_strong_admin_key_is_accepted() -> None:
    settings: Settings = make_settings()
    assert settings.admin_key is not None
    assert ADMIN_KEY not in repr(settings)  # a SecretStr: never printed


async def test_inference_routes_refuse_bad_keys_without_counting_them(
    http: httpx.AsyncClient,
) -> None:
    # On inference routes the key check and the admission are one Redis script: a refused
    # key gets the same 401s as elsewhere, and nothing is counted against the real key.
    created = await new_key(http, rpm=2)
    wrong = created["key"][:-4] + ("AAAA" if not created["key"].endswith("AAAA") else "BBBB")
    for _ in range(3):
        refused = await http.post(CHAT, json=chat_body(), headers=bearer(wrong))
        error = assert_openai_error(refused, 401, code="invalid_api_key")
        assert "Incorrect API key" in error["message"]
    served = await http.post(CHAT, json=chat_body(), headers=bearer(created["key"]))
    assert served.status_code == 200
    assert served.headers["x-ratelimit-remaining-requests"] == "1"
    expired = await new_key(http, expires_at=int(time.time()) - 1, rpm=100)
    refused = await http.post(CHAT, json=chat_body(), headers=bearer(expired["key"]))
    assert "expired" in assert_openai_error(refused, 401)["message"]
    await http.delete(f"/admin/keys/{created['id']}")
    refused = await http.post(CHAT, json=chat_body(), headers=bearer(created["key"]))
    assert "revoked" in assert_openai_error(refused, 401)["message"]
    usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
    assert usage["requests"] == 1, usage


async def test_a_key_revoked_on_one_replica_is_refused_on_the_other_at_once() -> None:
    async with serve() as (_, first, _), serve() as (_, second, _):
        created = await new_key(first)
        user = sdk(second, created["key"])
        for _ in range(3):  # the second replica has seen (and parsed) the key's record
            await user.chat.completions.create(**chat_body())
        assert (await first.delete(f"/admin/keys/{created['id']}")).status_code == 200
        with pytest.raises(openai.AuthenticationError) as caught:
            await user.chat.completions.create(**chat_body())
        assert "revoked" in caught.value.message


async def test_a_key_is_checked_or_admitted_in_one_redis_round_trip(
    app: FastAPI, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One Lua script reads the key's record, checks it and (on /v1) admits the request.
    admin = (await new_key(http, role="admin"))["key"]
    user = (await new_key(http, rpm=100))["key"]
    redis = app.state.services.redis
    commands: list[str] = []
    send = redis.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await send(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counted)
    for _ in range(2):  # the first run of a script on a server may load it first
        commands.clear()
        assert (await http.get("/admin/models", headers=bearer(admin))).status_code == 200
    assert commands == ["EVALSHA"]
    for _ in range(2):
        commands.clear()
        served = await http.post(CHAT, json=chat_body(), headers=bearer(user))
        assert served.status_code == 200
    assert commands == ["EVALSHA", "EVALSHA"]  # admitted; settled once the answer was sent
    commands.clear()
    assert (await http.get("/v1/models", headers=bearer(user))).status_code == 200
    assert commands == ["EVALSHA", "EVALSHA"]


def _operations(app: FastAPI, prefix: str) -> list[tuple[str, str]]:
    """Every HTTP operation under ``prefix``, with ``x`` for each path parameter."""
    paths = app.openapi()["paths"]
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, operations in paths.items()
        if path.startswith(prefix)
        for method in operations
    ]


async def test_every_v1_route_is_admitted_so_a_key_over_its_rpm_gets_429_on_each(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    # OpenAI counts every request against the limits, reads included.
    key = (await new_key(http, rpm=1))["key"]
    assert (await http.get("/v1/models", headers=bearer(key))).status_code == 200
    refused = await http.get("/v1/models", headers=bearer(key))
    assert_openai_error(refused, 429, code="rate_limit_exceeded", type="requests")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    operations = _operations(app, "/v1/")
    assert len(operations) >= 15
    for method, path in operations:
        response = await http.request(method, path, headers=bearer(key))
        if path.startswith("/v1/messages"):  # Anthropic's routes answer in its shape
            assert response.status_code == 429, (path, response.text)
            assert response.json()["error"]["type"] == "rate_limit_error", response.text
        else:
            assert_openai_error(response, 429, code="rate_limit_exceeded")
    assert (await http.get(f"/admin/keys/{key.split('-')[2]}/usage")).json()["requests"] == 1


async def test_admin_routes_check_the_key_without_admitting_it(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    user = (await new_key(http))["key"]
    for method, path in _operations(app, "/admin/"):
        response = await http.request(method, path, headers=bearer(user))
        assert_openai_error(response, 403, code="permission_denied")
    operator = (await new_key(http, role="admin", rpm=1))["key"]
    for _ in range(3):  # an operator's calls do not count against the key's limits
        assert (await http.get("/admin/models", headers=bearer(operator))).status_code == 200
    assert (await http.get("/v1/models", headers=bearer(operator))).status_code == 200
    assert (await http.get("/v1/models", headers=bearer(operator))).status_code == 429
