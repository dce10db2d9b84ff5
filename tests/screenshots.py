"""The README's screenshots of the playground, one per tab, taken from the running stack so
they show what the page really does.

    python -m tests.screenshots            # starts its own stack (about a minute)
    make screenshots                       # the same

Each tab is used first (a chat answered by SmolLM2, a sentence spoken by Piper, a WAV file
transcribed by Whisper, a spoken question answered over /v1/realtime, keys with usage), then
captured into docs/playground/<tab>.png.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

from tests.support.browser import launch, playground, spoken_wav
from tests.support.stack import ROOT, GatewayProcess

OUT = ROOT / "docs" / "playground"
QUESTION = "What is the capital of France?"


def shoot(page: Page, out: Path, tab: str) -> None:
    path = out / f"{tab}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"wrote {path.relative_to(ROOT)}")


def chat(page: Page, out: Path) -> None:
    page.get_by_test_id("tab-chat").click()
    page.get_by_test_id("chat-model").select_option("smollm2")
    page.get_by_test_id("chat-max-tokens").fill("60")
    page.get_by_test_id("chat-input").fill("Give me three tips for a good night's sleep.")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("chat-status")).to_contain_text("tokens", timeout=120_000)
    shoot(page, out, "chat")


def speech(page: Page, out: Path) -> None:
    page.get_by_test_id("tab-speech").click()
    page.get_by_test_id("speech-input").fill("Hello! This sentence was spoken by Piper on Triton.")
    page.get_by_test_id("speech-go").click()
    expect(page.get_by_test_id("speech-status")).to_contain_text("KiB", timeout=60_000)
    shoot(page, out, "speech")


def transcribe(page: Page, out: Path, wav: Path) -> None:
    page.get_by_test_id("tab-transcribe").click()
    page.get_by_test_id("transcribe-file").set_input_files(wav)
    page.get_by_test_id("transcribe-format").select_option("srt")
    page.get_by_test_id("transcribe-go").click()
    expect(page.get_by_test_id("transcribe-output")).to_contain_text("-->", timeout=60_000)
    shoot(page, out, "transcribe")


def voice(page: Page, out: Path) -> None:
    page.get_by_test_id("tab-voice").click()
    page.get_by_test_id("voice-start").click()
    answer = page.locator('[data-testid="voice-log"] .assistant').first
    expect(answer).to_have_attribute("data-status", "completed", timeout=120_000)
    shoot(page, out, "voice")
    page.get_by_test_id("voice-stop").click()


def admin(page: Page, out: Path, stack: GatewayProcess) -> None:
    for name, limits in (("mobile-app", {"rpm": 60, "tpm": 20000}), ("batch-jobs", {})):
        key = stack.create_key(name, **limits)["key"]
        stack.client(key).chat.completions.create(
            model="mock_chat", messages=[{"role": "user", "content": "hi"}]
        )
    page.get_by_test_id("tab-admin").click()
    expect(page.locator('[data-testid="admin-keys"] tbody tr')).to_have_count(2)
    shoot(page, out, "admin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gateway = GatewayProcess(
        models=["smollm2", "mock_chat", "piper_tts", "whisper_stt"],
        run_dir=ROOT / ".run" / "screenshots",
    )
    with (
        gateway.running(clean_exit=True) as stack,
        tempfile.TemporaryDirectory() as tmp,
        sync_playwright() as p,
    ):
        wav = spoken_wav(stack, QUESTION, Path(tmp) / "question.wav", heard="capital of")
        browser = launch(p, microphone=wav)
        with playground(browser, stack.base_url, stack.admin_key, height=720) as (page, _):
            expect(page.get_by_test_id("whoami")).to_contain_text("admin")
            chat(page, args.out)
            speech(page, args.out)
            transcribe(page, args.out, wav)
            voice(page, args.out)
            admin(page, args.out, stack)
        browser.close()


if __name__ == "__main__":
    main()
