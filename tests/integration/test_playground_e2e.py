"""The playground in a real browser: headless Chromium (Debian's package) driven by
Playwright, on the page nginx serves, against the real stack (Triton with SmolLM2, mock_chat,
Piper and Whisper; Redis). Every test fails on any console error the page did not cause on
purpose (see :func:`tests.support.browser.playground`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types import Batch
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.support.browser import launch, playground, spoken_wav
from tests.support.generation import generated_tokens, generation_stops
from tests.support.stack import GatewayProcess

QUESTION = "What is the capital of France?"
HI = [{"role": "user", "content": "hi"}]
CHAT_QUESTION = "What is the capital city of France? Answer in one word."


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayProcess]:
    """A stack of this module's own, with the models the playground's tabs use (its admin
    tab unloads and loads them): its browser tests, about 50 s, then run on another worker
    than the shared stack's group, which sets the suite's time."""
    models = ["smollm2", "mock_chat", "piper_tts", "whisper_stt"]
    with GatewayProcess(models=models).running() as gateway:
        yield gateway


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = launch(playwright)
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def question_wav(stack: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "question.wav"
    return spoken_wav(stack, QUESTION, path, heard="capital of France")


@pytest.fixture(scope="module")
def microphone_browser(playwright: Playwright, question_wav: Path) -> Iterator[Browser]:
    """Chromium whose microphone says the question once, then is silent."""
    chromium = launch(playwright, microphone=question_wav)
    yield chromium
    chromium.close()


def chat(
    page: Page,
    model: str,
    message: str,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> None:
    page.get_by_test_id("chat-model").select_option(model)
    page.get_by_test_id("chat-temperature").fill("" if temperature is None else str(temperature))
    page.get_by_test_id("chat-max-tokens").fill("" if max_tokens is None else str(max_tokens))
    page.get_by_test_id("chat-input").fill(message)
    page.get_by_test_id("chat-input").press("Enter")  # Enter sends


def last_reply(page: Page) -> str:
    return page.locator('[data-testid="chat-output"] .assistant .text').last.inner_text()


def test_a_reasoning_model_shows_its_reasoning_above_its_answer(
    stack: GatewayProcess, browser: Browser
) -> None:
    loaded = httpx.post(
        f"{stack.base_url}/admin/models/mock_qwen3/load", headers=stack.headers, timeout=60
    )
    assert loaded.status_code == 200, loaded.text
    with playground(browser, stack.base_url, stack.admin_key) as (page, _):
        chat(page, "mock_qwen3", "[mock:think=Paris%20is%20in%20France.]")
        expect(page.get_by_test_id("chat-status")).to_contain_text("completion tokens")
        expect(page.get_by_test_id("chat-reasoning").last).to_contain_text("Paris is in France.")
        assert last_reply(page) == "The quick brown fox jumps over the lazy dog."


def test_page_and_its_files_come_through_nginx_under_a_strict_policy(
    stack: GatewayProcess,
) -> None:
    for path in ("/", "/playground"):
        page = httpx.get(stack.base_url + path, timeout=10)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "connect-src 'self'" in policy
        assert 'data-testid="api-key"' in page.text
    script = httpx.get(stack.base_url + "/playground/assets/main.js", timeout=10)
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]


def test_chat_streams_the_reply_and_stop_cancels_the_generation(
    stack: GatewayProcess, browser: Browser
) -> None:
    with playground(browser, stack.base_url, stack.admin_key) as (page, _):
        expect(page.get_by_test_id("whoami")).to_contain_text("admin")
        # A real answer from SmolLM2, streamed: the reply changes many times as it arrives.
        page.evaluate(
            """() => {
              window.updates = 0;
              new MutationObserver(() => window.updates++).observe(
                document.querySelector('[data-testid="chat-output"]'),
                {subtree: true, characterData: true, childList: true});
            }"""
        )
        # Worded as tests/integration/test_chat_e2e.py asks it, for a 135M model.
        page.get_by_test_id("chat-system").fill("You are a helpful assistant.")
        chat(page, "smollm2", CHAT_QUESTION, max_tokens=24, temperature=0)
        expect(page.get_by_test_id("chat-status")).to_contain_text(
            "completion tokens", timeout=60_000
        )
        assert "paris" in last_reply(page).lower()
        assert page.evaluate("window.updates") > 5, "the reply did not arrive token by token"

        # A generation of 2000 tokens at 20 ms each, stopped after a few words.
        before = generated_tokens(stack, "mock_chat")
        chat(page, "mock_chat", "[mock:delay_ms=20] [mock:words=2000] go on", max_tokens=2000)
        expect(page.locator('[data-testid="chat-output"] .assistant').last).to_contain_text("brown")
        page.get_by_test_id("chat-stop").click()
        expect(page.get_by_test_id("chat-status")).to_have_text("stopped")
        expect(page.get_by_test_id("chat-send")).to_be_enabled()
        settled = generation_stops(stack, "mock_chat")
        assert settled - before < 200

        # The conversation goes on after a stop; an error after the stream began shows the
        # API's message.
        chat(page, "mock_chat", "[mock:fail_after=3]")
        expect(page.get_by_test_id("chat-error")).to_be_visible()
        assert page.get_by_test_id("chat-error").inner_text().strip()


def test_speech_plays_as_it_streams(stack: GatewayProcess, browser: Browser) -> None:
    with playground(browser, stack.base_url, stack.admin_key) as (page, _):
        page.get_by_test_id("tab-speech").click()
        page.get_by_test_id("speech-model").select_option("piper_tts")
        for audio_format in ("mp3", "pcm"):  # streamed into Media Source; complete, as WAV
            page.get_by_test_id("speech-format").select_option(audio_format)
            page.get_by_test_id("speech-input").fill("The playground speaks this sentence aloud.")
            page.get_by_test_id("speech-go").click()
            expect(page.get_by_test_id("speech-status")).to_contain_text(f"of {audio_format}")
            audio = page.get_by_test_id("speech-audio")
            page.wait_for_function(
                "a => a.duration > 1 && isFinite(a.duration) && a.currentTime > 0",
                arg=audio.element_handle(),
                timeout=15_000,
            )
            assert audio.evaluate("a => a.error") is None


def test_transcribes_a_file_and_a_recording(
    stack: GatewayProcess, microphone_browser: Browser, question_wav: Path
) -> None:
    with playground(microphone_browser, stack.base_url, stack.admin_key) as (page, _):
        page.get_by_test_id("tab-transcribe").click()
        page.get_by_test_id("transcribe-model").select_option("whisper_stt")
        page.get_by_test_id("transcribe-file").set_input_files(question_wav)
        page.get_by_test_id("transcribe-go").click()
        output = page.get_by_test_id("transcribe-output")
        expect(output).to_contain_text("capital of France", timeout=30_000)

        page.get_by_test_id("transcribe-format").select_option("srt")
        page.get_by_test_id("transcribe-go").click()
        expect(output).to_contain_text("00:00:0", timeout=30_000)
        assert "capital of France" in output.inner_text()

        # The fake microphone says the question: record it (WebM/Opus) and transcribe that.
        page.get_by_test_id("transcribe-format").select_option("text")
        page.get_by_test_id("transcribe-record").click()
        expect(page.get_by_test_id("transcribe-status")).to_have_text("recording…")
        page.wait_for_timeout(2800)
        page.get_by_test_id("transcribe-record").click()
        expect(page.get_by_test_id("transcribe-recording")).to_be_visible()
        page.get_by_test_id("transcribe-go").click()
        expect(page.get_by_test_id("transcribe-status")).to_contain_text("recording.webm")
        assert "capital of france" in output.inner_text().lower()


def test_voice_tab_hears_the_microphone_and_speaks_the_answer(
    stack: GatewayProcess, microphone_browser: Browser
) -> None:
    with playground(microphone_browser, stack.base_url, stack.admin_key) as (page, _):
        # What Chromium itself sends in the WebSocket handshake (the DevTools protocol).
        handshakes: list[dict[str, str]] = []
        devtools = page.context.new_cdp_session(page)
        devtools.send("Network.enable")
        devtools.on(
            "Network.webSocketWillSendHandshakeRequest",
            lambda event: handshakes.append(
                {k.lower(): v for k, v in event["request"]["headers"].items()}
            ),
        )
        page.get_by_test_id("tab-voice").click()
        page.get_by_test_id("voice-start").click()
        log = page.get_by_test_id("voice-log")
        expect(log.locator(".user")).to_contain_text("capital of France", timeout=30_000)
        # The page connected with a client secret it asked for: the key is not in the
        # handshake.
        assert len(handshakes) == 1
        offered = handshakes[0]["sec-websocket-protocol"]
        assert "openai-insecure-api-key.ek_" in offered and stack.admin_key not in offered
        assert "authorization" not in handshakes[0]
        answer = log.locator(".assistant").first
        expect(answer).to_have_attribute("data-status", "completed", timeout=60_000)
        assert answer.locator(".text").inner_text().strip()
        assert float(answer.get_attribute("data-audio-seconds") or 0) > 0.5
        page.get_by_test_id("voice-stop").click()
        expect(page.get_by_test_id("voice-status")).to_have_text("stopped")
        expect(page.get_by_test_id("voice-start")).to_be_enabled()


def test_admin_console_loads_models_and_manages_keys(
    stack: GatewayProcess, browser: Browser
) -> None:
    sdk = stack.client()
    with playground(browser, stack.base_url, stack.admin_key) as (page, _):
        page.on("dialog", lambda dialog: dialog.accept())  # the revoke confirmation
        page.get_by_test_id("tab-admin").click()
        state = page.get_by_test_id("admin-state-mock_chat")
        expect(state).to_have_text("READY")
        try:
            page.get_by_test_id("admin-unload-mock_chat").click()
            expect(page.get_by_test_id("admin-load-mock_chat")).to_be_visible(timeout=60_000)
            assert "mock_chat" not in [m.id for m in sdk.models.list()]
            with pytest.raises(openai.NotFoundError):
                sdk.chat.completions.create(model="mock_chat", messages=HI)
            # The pickers follow: the chat tab no longer offers it.
            expect(
                page.locator('[data-testid="chat-model"] option[value="mock_chat"]')
            ).to_have_count(0)
        finally:
            page.get_by_test_id("admin-load-mock_chat").click()
            expect(state).to_have_text("READY", timeout=60_000)
        assert "mock_chat" in [m.id for m in sdk.models.list()]
        expect(page.locator('[data-testid="chat-model"] option[value="mock_chat"]')).to_have_count(
            1
        )

        page.get_by_test_id("admin-key-name").fill("made-in-the-console")
        page.get_by_test_id("admin-key-rpm").fill("7")
        page.get_by_test_id("admin-key-models").fill("mock_chat")
        page.get_by_test_id("admin-key-create").click()
        secret = page.get_by_test_id("admin-new-key-value")
        expect(secret).to_contain_text("sk-gw-")
        row = page.locator('[data-testid="admin-keys"] tr[data-name="made-in-the-console"]')
        expect(row).to_contain_text("7 rpm")
        key_id = row.get_attribute("data-key")

        # The secret shown is the real key: it works, sees only its model, and is counted
        # (the list of models and the chat: two requests).
        made = stack.client(secret.inner_text())
        assert [m.id for m in made.models.list()] == ["mock_chat"]
        assert made.chat.completions.create(model="mock_chat", messages=HI).choices
        page.get_by_test_id("admin-refresh").click()
        expect(page.get_by_test_id(f"admin-requests-{key_id}")).to_have_text("2")
        expect(page.get_by_test_id("admin-new-key")).to_be_hidden()  # shown once only
        # This month's spend (docs/budgets.md): the chat, by key, then by model.
        expect(page.get_by_test_id(f"admin-spend-requests-{key_id}")).to_have_text("1")
        page.get_by_test_id("admin-spend-by").select_option("model")
        expect(
            page.locator('[data-testid="admin-spend"] tr[data-group="mock_chat"]')
        ).to_be_visible()

        page.get_by_test_id(f"admin-revoke-{key_id}").click()
        expect(page.get_by_test_id(f"admin-key-state-{key_id}")).to_have_text("revoked")
        # The audit log shows who did it, and what, newest first.
        audit = page.locator('[data-testid="admin-audit"] tbody tr')
        expect(audit.first).to_have_attribute("data-action", "key.revoke")
        expect(audit.first).to_contain_text(f"GATEWAY_ADMIN_KEY (admin)127.0.0.1key.revoke{key_id}")
        with pytest.raises(openai.AuthenticationError):
            made.models.list()


def answered(batch: Batch) -> int:
    counts = batch.request_counts
    return counts.completed + counts.failed if counts else 0


def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Polls ``condition`` (a call to the API, which no ``expect`` can wait on) until true."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_admin_console_lists_the_batches_running(stack: GatewayProcess, browser: Browser) -> None:
    batcher = stack.create_key("batcher", models=["mock_chat"])
    sdk = stack.client(batcher["key"])
    body = {
        "model": "mock_chat",
        "messages": [{"role": "user", "content": "[mock:delay_ms=40] [mock:words=40] story"}],
    }
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(60)
    ]  # 1.6 s each, GATEWAY_BATCH_CONCURRENCY (4) at once per replica: 12 s or more
    data = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = sdk.files.create(file=("b.jsonl", data), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    try:
        with playground(browser, stack.base_url, stack.admin_key) as (page, _):
            page.get_by_test_id("tab-admin").click()
            row = page.locator(f'[data-testid="admin-batches"] tr[data-batch="{batch.id}"]')
            expect(page.get_by_test_id(f"admin-batch-status-{batch.id}")).to_have_text(
                re.compile(r"^(validating|in_progress)$")
            )
            expect(row).to_contain_text("batcher")
            expect(row).to_contain_text("/v1/chat/completions")

            # Once some lines are answered, a refresh shows them.
            until(lambda: answered(sdk.batches.retrieve(batch.id)) >= 1)
            page.get_by_test_id("admin-refresh").click()
            expect(page.get_by_test_id(f"admin-batch-progress-{batch.id}")).to_have_text(
                re.compile(r"^[1-9]\d*/60$")
            )

            # Cancelled, it has ended: it leaves the list.
            sdk.batches.cancel(batch.id)
            until(lambda: sdk.batches.retrieve(batch.id).status == "cancelled")
            page.get_by_test_id("admin-refresh").click()
            expect(row).to_have_count(0)
    finally:
        if sdk.batches.retrieve(batch.id).status not in ("cancelled", "completed", "failed"):
            sdk.batches.cancel(batch.id)


def test_a_wrong_key_and_a_refused_request_show_the_api_error(
    stack: GatewayProcess, browser: Browser
) -> None:
    with playground(browser, stack.base_url, "sk-gw-not-a-key") as (page, console):
        expect(page.get_by_test_id("key-error")).to_have_text("Incorrect API key provided.")
        expect(page.get_by_test_id("tab-admin")).to_be_hidden()
        console.expect("status of 401")

    # A user key: no admin tab; over its rate limit, the chat shows the 429's message. The
    # page's first reads (/v1/me, /v1/models) and the first chat spend its rpm.
    key = stack.create_key("playground-user", rpm=3, models=["mock_chat"])["key"]
    with playground(browser, stack.base_url, key) as (page, console):
        expect(page.get_by_test_id("whoami")).to_have_text("playground-user (user)")
        expect(page.get_by_test_id("tab-admin")).to_be_hidden()
        chat(page, "mock_chat", "hi")
        expect(page.get_by_test_id("chat-status")).to_contain_text("completion tokens")
        chat(page, "mock_chat", "hi again")
        expect(page.get_by_test_id("chat-error")).to_contain_text("Rate limit reached")
        console.expect("status of 429")


def test_keyboard_and_phone_width(stack: GatewayProcess, browser: Browser) -> None:
    with playground(browser, stack.base_url, stack.admin_key, width=390, height=844) as (
        page,
        _,
    ):
        expect(page.get_by_test_id("whoami")).to_contain_text("admin")
        for tab in ("chat", "speech", "transcribe", "voice", "admin"):
            page.get_by_test_id(f"tab-{tab}").click()
            overflow = page.evaluate(
                "() => document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"the {tab} tab is wider than a phone ({overflow} px)"
        # The tabs take arrow keys; the key form takes Enter.
        page.get_by_test_id("tab-chat").click()
        page.keyboard.press("ArrowRight")
        expect(page.get_by_test_id("tab-speech")).to_have_attribute("aria-selected", "true")
        expect(page.get_by_test_id("tab-speech")).to_be_focused()
        page.keyboard.press("End")
        expect(page.get_by_test_id("tab-admin")).to_be_focused()
        page.keyboard.press("Home")
        expect(page.get_by_test_id("tab-chat")).to_have_attribute("aria-selected", "true")
        page.keyboard.press("Tab")
        expect(page.get_by_test_id("chat-model")).to_be_focused()
