"""Chat templates: Hugging Face conventions, errors mapped to 400/500, and the sandbox."""

from __future__ import annotations

import pytest

from gateway.backend import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE
from gateway.errors import BackendError, InvalidRequestError
from gateway.serving.templating import render_chat
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import make_settings, serve

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
#: What a client reads of a template that failed (Jinja's words go to the log).
BROKEN = (
    "The model's chat template failed on these messages; the operator can see why in the "
    "gateway's log."
)

NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def test_chatml_rendering() -> None:
    assert render_chat(CHATML_TEMPLATE, MESSAGES) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_hugging_face_conventions() -> None:
    # trim_blocks/lstrip_blocks, tojson without ASCII escapes, loop controls, extra variables.
    template = (
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
        "{{ m | tojson }}|{{ bos_token }}\n"
        "{% endfor %}\n"
    )
    rendered = render_chat(
        template, [*MESSAGES, {"role": "user", "content": "héllo"}], bos_token="<s>"
    )
    assert rendered == (
        '{"role": "user", "content": "Hi"}|<s>\n{"role": "user", "content": "héllo"}|<s>\n'
    )


def test_raise_exception_is_the_clients_error() -> None:
    """The template's own message is its author's words to the caller: kept (bounded)."""
    assert render_chat(NO_SYSTEM_TEMPLATE, MESSAGES[1:]) == "[user] Hi\n[assistant] "
    with pytest.raises(InvalidRequestError) as raised:
        render_chat(NO_SYSTEM_TEMPLATE, MESSAGES)
    assert raised.value.status_code == 400
    assert (raised.value.param, raised.value.code) == ("messages", "chat_template_rejected")
    assert raised.value.message == (
        "The model's chat template rejected the messages: System role not supported"
    )
    with pytest.raises(InvalidRequestError) as raised:
        render_chat("{{ raise_exception(messages[0].content * 1000) }}", MESSAGES)
    assert len(raised.value.message) < 600


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ messages | no_such_filter }}", "no_such_filter"),  # fails to compile
        ("{% for m in messages %}", "endfor"),  # syntax error
        ("{{ messages[0].content.nope.deeper }}", "nope"),  # undefined at render time
        ("{{ messages[0].content + 1 }}", "concatenate"),  # Python's TypeError in a template
        ("{{ messages[0] | tojson(indent=messages) }}", "TypeError"),
    ],
)
def test_broken_template_is_a_server_error_without_jinjas_words(template: str, said: str) -> None:
    with pytest.raises(BackendError) as raised:
        render_chat(template, MESSAGES)
    assert raised.value.status_code == 500
    assert raised.value.code == "chat_template_error"
    # What Jinja or Python said is for the log (the error's detail), never the client.
    assert said in (raised.value.detail or "")
    assert said not in raised.value.message
    assert raised.value.message == BROKEN


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",  # immutable sandbox
        "{{ messages[0].update({'content': 'x'}) }}",
    ],
)
def test_sandbox_blocks_unsafe_access(template: str) -> None:
    with pytest.raises(BackendError) as raised:
        render_chat(template, MESSAGES)
    assert raised.value.code == "chat_template_error"
    assert "unsafe" in (raised.value.detail or "")
    assert raised.value.message == BROKEN


def test_user_content_is_not_evaluated_as_a_template() -> None:
    messages = [{"role": "user", "content": "{{ 7 * 7 }} {% raise %}"}]
    assert "{{ 7 * 7 }} {% raise %}" in render_chat(CHATML_TEMPLATE, messages)


async def test_model_template_rejection_is_400_through_the_api() -> None:
    backend = FakeBackend(model_list=[ModelInfo("strict-chat", "chat", True, NO_SYSTEM_TEMPLATE)])
    async with serve(make_settings(models=[]), backend) as (_, http, _sdk):
        ok = await http.post(
            "/v1/chat/completions", json=chat_body(model="strict-chat", messages=MESSAGES[1:])
        )
        assert ok.status_code == 200, ok.text
        assert backend.calls[-1].prompt == "[user] Hi\n[assistant] "

        response = await http.post(
            "/v1/chat/completions", json=chat_body(model="strict-chat", messages=MESSAGES)
        )
        error = assert_openai_error(response, 400, type="invalid_request_error", param="messages")
        assert "System role not supported" in error["message"]
        assert len(backend.calls) == 1


async def test_broken_model_template_is_500_through_the_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    template = "{{ messages[0].nope.deeper }}"
    backend = FakeBackend(model_list=[ModelInfo("broken", "chat", True, template)])
    async with serve(make_settings(models=[]), backend) as (_, http, _sdk):
        response = await http.post("/v1/chat/completions", json=chat_body(model="broken"))
    error = assert_openai_error(response, 500, type="server_error", code="chat_template_error")
    assert backend.calls == []
    # The client reads a fixed message and its request id; the log has Jinja's words.
    rid = response.headers["x-request-id"]
    assert error["message"] == f"{BROKEN} (request id: {rid})"
    logged = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
    assert any("UndefinedError" in line and "nope" in line for line in logged), logged


async def test_default_template_is_used_when_the_model_has_none() -> None:
    backend = FakeBackend(model_list=[ModelInfo("plain", "chat", True, None)])
    settings = make_settings(models=[], default_chat_template="{{ messages[-1]['content'] }}!")
    async with serve(settings, backend) as (_, http, _sdk):
        response = await http.post("/v1/chat/completions", json=chat_body(model="plain"))
    assert response.status_code == 200, response.text
    assert backend.calls[-1].prompt == "Hi!"
