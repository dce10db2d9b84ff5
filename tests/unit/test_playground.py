"""The playground page: served at / and /playground without a key, under a strict
Content-Security-Policy, with every file it loads shipped in the package; and the two small
API additions it reads (GET /v1/me, a speech model's voices in /v1/models)."""

from __future__ import annotations

import re

import httpx

from gateway.api.routers.playground import ASSETS
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import bearer, new_key


async def test_page_is_public_html_under_a_strict_policy(anon: httpx.AsyncClient) -> None:
    for path in ("/", "/playground"):
        page = await anon.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        policy = dict(
            part.strip().split(" ", 1)
            for part in page.headers["content-security-policy"].split(";")
        )
        assert policy["default-src"] == "'none'"
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
        assert policy["connect-src"] == "'self'"
        assert policy["frame-ancestors"] == "'none'"
        assert page.headers["x-content-type-options"] == "nosniff"
    assert (await anon.head("/")).status_code == 200


async def test_every_file_the_page_loads_is_served_from_the_package(
    anon: httpx.AsyncClient,
) -> None:
    html = (await anon.get("/")).text
    # Nothing from elsewhere: every src/href of the page (and every import of its scripts)
    # is one of the package's own files.
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    for script in ASSETS.glob("*.js"):
        linked += [
            f"/playground/assets/{name.removeprefix('./')}"
            for name in re.findall(r'from "([^"]+)"', script.read_text())
        ]
    assert linked, "the page links nothing"
    for url in linked:
        assert url.startswith("/playground/assets/"), url
        served = await anon.get(url)
        assert served.status_code == 200, url
        assert served.content == (ASSETS / url.rsplit("/", 1)[1]).read_bytes()
        assert "content-security-policy" in served.headers
    missing = await anon.get("/playground/assets/nothing.js")
    assert missing.status_code == 404


async def test_me_shows_the_callers_own_key(http: httpx.AsyncClient) -> None:
    created = await new_key(http, name="alice", rpm=3, models=["fake-chat"])
    me = await http.get("/v1/me", headers=bearer(created["key"]))
    assert me.status_code == 200
    body = me.json()
    assert (body["id"], body["name"], body["role"], body["rpm"]) == (
        created["id"],
        "alice",
        "user",
        3,
    )
    assert body["models"] == ["fake-chat"]
    assert created["key"] not in me.text
    assert (await http.get("/v1/me")).json()["role"] == "admin"
    assert_openai_error(
        await http.get("/v1/me", headers=bearer("sk-gw-wrong")), 401, type="invalid_request_error"
    )


async def test_models_list_a_speech_models_voices(http: httpx.AsyncClient) -> None:
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert models["fake-tts"]["voices"] == ["joe", "amy"]
    assert models["fake-chat"]["voices"] is None
