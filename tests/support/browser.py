"""Headless Chromium (Debian's ``chromium`` package, installed by ``make``) driven by
Playwright for Python, for the playground's browser tests and its README screenshots.

Playwright's own browser download is not reachable from these machines, so the browser is
the system one, passed as ``executable_path``. Chromium's fake media flags stand in for a
microphone: it hears the WAV file given as ``microphone``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright

from tests.support.audio import wav_bytes
from tests.support.stack import GatewayProcess

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

#: Quiet, offline Chromium: no background connections to Google's hosts (refused on these
#: machines), autoplay allowed (the tests check that audio plays).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    # Containers often give /dev/shm only 64 MB, which a renderer outgrows.
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]


def launch(playwright: Playwright, microphone: Path | None = None) -> Browser:
    """Chromium; with ``microphone``, getUserMedia is granted and hears that WAV file once
    (then silence)."""
    args = list(ARGS)
    if microphone is not None:
        args += [
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}%noloop",
        ]
    return playwright.chromium.launch(executable_path=CHROMIUM, args=args)


class Console:
    """What a page wrote to its console at level error, and its uncaught exceptions."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def _message(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def expect(self, *fragments: str) -> None:
        """Removes the errors a test caused on purpose (each must contain one of
        ``fragments``, and each fragment must match one): the browser logs every refused
        request itself."""
        for fragment in fragments:
            matching = [e for e in self.errors if fragment in e]
            assert matching, f"expected a console error with {fragment!r}: {self.errors}"
            self.errors = [e for e in self.errors if fragment not in e]


@contextmanager
def playground(
    browser: Browser, base_url: str, key: str | None, *, width: int = 1100, height: int = 800
) -> Iterator[tuple[Page, Console]]:
    """A fresh page (own sessionStorage) on the playground, with ``key`` typed in and taken
    (its name shown) when given. Fails if the page logged an unexpected console error."""
    context = browser.new_context(base_url=base_url, viewport={"width": width, "height": height})
    page = context.new_page()
    console = Console(page)
    try:
        page.goto("/")
        if key is not None:
            page.get_by_test_id("api-key").fill(key)
            page.get_by_test_id("api-key").press("Enter")
        yield page, console
        assert not console.errors, f"console errors: {console.errors}"
    finally:
        context.close()


def spoken_wav(stack: GatewayProcess, text: str, path: Path, heard: str) -> Path:
    """``text`` spoken by Piper through the stack (a rendition Whisper hears as ``heard``),
    as a WAV file for the fake microphone or an upload: half a second of silence, the words,
    then three seconds of silence (so that the server VAD hears the turn end)."""
    spoken = stack.clear_speech(text, heard, voice="joe")
    rate = 24000  # OpenAI's pcm
    path.write_bytes(wav_bytes(bytes(rate) + spoken + bytes(2 * rate * 3), rate))
    return path
