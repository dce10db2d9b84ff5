"""Multilingual speech benchmark: ``whisper_base`` through ``/v1/audio/transcriptions`` on
Spanish, French and Hindi sentences spoken by espeak-ng (tests/support/espeak.py).

Run with ``make bench`` (or ``python -m tests.bench.multilingual``). It starts the real
stack with ``whisper_base`` and, per language, prints: how often the language was detected
(no ``language`` sent), the word error rate with the language detected and with it given
(jiwer, over the sentences together, after lower-casing and dropping punctuation), the
median time of one transcription through the gateway and its real-time factor, and the
median time of one translation into English.

Everything shares one 2-core machine; espeak-ng's speech is synthetic, so the word error
rates say how the pieces fit together more than how the model does on people.
"""

from __future__ import annotations

import argparse
import statistics
import time
import unicodedata
from collections import defaultdict

import httpx
import jiwer

from gateway.serving.audio import decode_to_pcm
from tests.bench import write_table
from tests.support.espeak import SENTENCES, speak
from tests.support.stack import GatewayProcess

MODEL = "whisper_base"
NAMES = {"es": "Spanish", "fr": "French", "hi": "Hindi"}


def normalized(text: str) -> str:
    """Lower case, punctuation and symbols as spaces (Devanagari's marks kept)."""
    kept = (" " if unicodedata.category(c)[0] in "PS" else c for c in text.lower())
    return " ".join("".join(kept).split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per sentence")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    stack = GatewayProcess(models=[MODEL], nginx=False).start()
    rows = [
        "| language | sentences | detected | WER, detected | WER, given | "
        "transcription (median) | real-time factor | translation (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    try:
        stack.wait_ready()
        refs: dict[str, list[str]] = defaultdict(list)
        heard: dict[str, list[str]] = defaultdict(list)
        told: dict[str, list[str]] = defaultdict(list)
        detected: dict[str, int] = defaultdict(int)
        times: dict[str, list[float]] = defaultdict(list)
        factors: dict[str, list[float]] = defaultdict(list)
        translations: dict[str, list[float]] = defaultdict(list)
        with httpx.Client(base_url=stack.base_url, timeout=300, headers=stack.headers) as http:

            def call(path: str, wav: bytes, **fields: str) -> tuple[httpx.Response, float]:
                start = time.perf_counter()
                response = http.post(
                    path, data={"model": MODEL, **fields}, files={"file": ("s.wav", wav)}
                )
                assert response.status_code == 200, response.text
                return response, time.perf_counter() - start

            for spoken in SENTENCES:
                lang = spoken.language
                wav = speak(spoken.text, lang, spoken.rate)
                seconds = decode_to_pcm(wav).size / 16_000
                verbose = call("/v1/audio/transcriptions", wav, response_format="verbose_json")[
                    0
                ].json()
                detected[lang] += verbose["language"] == NAMES[lang].lower()
                refs[lang].append(normalized(spoken.text))
                heard[lang].append(normalized(verbose["text"]))
                for _ in range(args.runs):
                    answer, took = call("/v1/audio/transcriptions", wav, language=lang)
                    times[lang].append(took)
                    factors[lang].append(took / seconds)
                told[lang].append(normalized(answer.json()["text"]))
                for _ in range(args.runs):
                    translations[lang].append(call("/v1/audio/translations", wav)[1])
    finally:
        stack.stop()
    for lang, name in NAMES.items():
        count = len(refs[lang])
        rows.append(
            f"| {name} | {count} | {detected[lang]}/{count} | "
            f"{jiwer.wer(refs[lang], heard[lang]):.2f} | {jiwer.wer(refs[lang], told[lang]):.2f} | "
            f"{statistics.median(times[lang]):.2f} s | {statistics.median(factors[lang]):.2f} | "
            f"{statistics.median(translations[lang]):.2f} s |"
        )
    print(*rows, sep="\n")
    write_table(args.out, rows)


if __name__ == "__main__":
    main()
