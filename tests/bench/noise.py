"""Whether Realtime's ``noise_reduction`` should be honoured: word error rates of
``whisper_stt`` (the model Realtime sessions transcribe with by default) on noisy speech,
as it is and after a denoiser, through ``/v1/audio/transcriptions``.

Run with ``python -m tests.bench.noise`` (``--scale 2``: two noise draws per sentence and
condition). It starts the real stack with ``piper_tts`` and ``whisper_stt``. Six English
sentences are spoken by ``piper_tts`` through the stack (24 kHz pcm, Realtime's input
format), each one Whisper hears right when clean (``GatewayProcess.clear_speech``), padded
with 0.3 s before and 0.5 s after (what a server VAD's cut keeps), and mixed with noise at
10, 5 and 0 dB SNR (speech power over the sentence against noise power; seeded numpy):

- white: Gaussian noise; pink: white noise shaped to 1/f power (stationary);
- babble: three other Piper sentences (the same voice), each looped from a random offset
  and summed (non-stationary, speech-like: a room of talkers).

Each mix is transcribed as it is and after each filter, applied to the 24 kHz pcm16 in
100 ms frames as Realtime appends would bring it:

- ``afftdn near``: FFmpeg's ``afftdn`` through PyAV (a server dependency already) at its
  defaults with noise-floor tracking (``nr=12:nf=-50:tn=1``), a gentle near-field setting;
- ``afftdn far``: ``afftdn`` stronger, with a fixed noise floor (``nr=20:nf=-30``);
- ``noisereduce``: spectral gating (non-stationary mode), only if the ``noisereduce``
  package can be imported (it is not a dependency of the project: it would add it, scipy
  and joblib).

The table is the word error rate (jiwer, over all sentences of a condition, lower-cased,
punctuation dropped) per noise and SNR, its mean over the noisy conditions, the worst rise
against no filter on any condition (clean speech included), and the filter's CPU time per
second of audio (this process, one thread). Everything shares one 2-core machine; Piper's
speech is synthetic and at one level (about -20 dBFS), so this says whether a filter helps
Whisper here, not how it does on people or at other levels.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

import av
import jiwer
import numpy as np
import numpy.typing as npt

from tests.bench import options, rows_on_stack, write_table
from tests.bench.early_transcripts import CLAUSES
from tests.bench.multilingual import normalized
from tests.support.audio import wav_bytes
from tests.support.stack import GatewayProcess

RATE = 24_000
LEAD_S, TAIL_S = 0.3, 0.5
SNRS_DB = (10, 5, 0)
NOISES = ("white", "pink", "babble")
#: Sentences scored (CLAUSES without numerals or British spellings) and babble's talkers.
SCORED = (1, 3, 4, 5, 9, 11)
TALKERS = (0, 2, 6, 7, 8, 10)
Audio = npt.NDArray[np.float64]
Filter = Callable[[npt.NDArray[np.int16]], npt.NDArray[np.int16]]


def ffmpeg_filter(name: str, args: str) -> Filter:
    """An FFmpeg audio filter over 24 kHz mono pcm16, fed in 100 ms frames."""

    def run(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        graph = av.filter.Graph()
        source = graph.add_abuffer(
            format="s16", sample_rate=RATE, layout="mono", time_base=Fraction(1, RATE)
        )
        chain = [source, graph.add(name, args), graph.add("aformat", "sample_fmts=s16")]
        chain.append(graph.add("abuffersink"))
        for left, right in itertools.pairwise(chain):
            left.link_to(right)
        graph.configure()
        out: list[npt.NDArray[np.int16]] = []

        def drain() -> None:
            while True:
                try:
                    out.append(np.asarray(graph.pull().to_ndarray(), np.int16).reshape(-1))
                except (av.error.BlockingIOError, av.error.EOFError):
                    return

        step = RATE // 10
        for start in range(0, pcm.size, step):
            frame = av.AudioFrame.from_ndarray(
                pcm[start : start + step].reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts, frame.time_base = RATE, start, Fraction(1, RATE)
            graph.push(frame)
            drain()
        graph.push(None)
        drain()
        return np.concatenate(out)

    return run


def filters() -> dict[str, Filter | None]:
    """The candidates, ``none`` first; ``noisereduce`` only where it is installed."""
    found: dict[str, Filter | None] = {
        "none": None,
        "afftdn near": ffmpeg_filter("afftdn", "nr=12:nf=-50:tn=1"),
        "afftdn far": ffmpeg_filter("afftdn", "nr=20:nf=-30"),
    }
    try:
        import noisereduce  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return found

    def gate(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        cleaned = noisereduce.reduce_noise(
            y=pcm.astype(np.float32), sr=RATE, stationary=False, n_jobs=1
        )
        result: npt.NDArray[np.int16] = np.clip(cleaned, -32768, 32767).astype(np.int16)
        return result

    found["noisereduce"] = gate
    return found


def noise(kind: str, size: int, rng: np.random.Generator, talkers: list[Audio]) -> Audio:
    """``size`` samples of ``kind`` noise at unit power."""
    if kind == "babble":
        picked = rng.choice(len(talkers), 3, replace=False)
        sound = sum(np.roll(np.resize(talkers[i], size), int(rng.integers(size))) for i in picked)
    else:
        sound = rng.standard_normal(size)
        if kind == "pink":
            spectrum = np.fft.rfft(sound)
            frequencies = np.fft.rfftfreq(size, 1 / RATE)
            spectrum[1:] /= np.sqrt(frequencies[1:])
            spectrum[0] = 0
            sound = np.fft.irfft(spectrum, size)
    result: Audio = np.asarray(sound, np.float64)
    result /= np.sqrt(np.mean(result**2))
    return result


def mixed(
    speech: Audio, kind: str, snr_db: float, rng: np.random.Generator, talkers: list[Audio]
) -> npt.NDArray[np.int16]:
    """``speech`` padded as a VAD cuts it, with ``kind`` noise at ``snr_db`` over it all
    ("clean": none), scaled down together if it would clip."""
    padded = np.concatenate([np.zeros(int(LEAD_S * RATE)), speech, np.zeros(int(TAIL_S * RATE))])
    if kind != "clean":
        level = np.sqrt(np.mean(speech**2) / 10 ** (snr_db / 10))
        padded = padded + level * noise(kind, padded.size, rng, talkers)
    peak = float(np.max(np.abs(padded)))
    if peak > 32767:
        padded *= 32767 / peak
    result: npt.NDArray[np.int16] = np.round(padded).astype(np.int16)
    return result


def wer(references: list[str], heard: list[str]) -> float:
    return 100 * float(jiwer.wer([normalized(r) for r in references], heard))


async def rows(stack: GatewayProcess, scale: float) -> list[str]:
    client = stack.client()
    texts = [" ".join(CLAUSES[i]) for i in SCORED]
    voiced = [
        stack.clear_speech(text, " ".join(CLAUSES[i][1].split()[-2:]))
        for i, text in zip(SCORED, texts, strict=True)
    ]
    speech = [np.frombuffer(pcm, np.int16).astype(np.float64) for pcm in voiced]
    talkers = [
        np.frombuffer(
            client.audio.speech.create(
                model="piper_tts", voice="alloy", input=" ".join(CLAUSES[i]), response_format="pcm"
            ).content,
            np.int16,
        ).astype(np.float64)
        for i in TALKERS
    ]
    draws = max(1, round(scale))
    conditions = [("clean", 0.0)] + [(k, float(s)) for k in NOISES for s in SNRS_DB]
    candidates = filters()
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    jobs: list[tuple[tuple[str, float], str, int, npt.NDArray[np.int16]]] = []
    for c, (kind, snr) in enumerate(conditions):
        for n, sound in enumerate(speech):
            for draw in range(draws):
                rng = np.random.default_rng([c, n, draw])
                mix = mixed(sound, kind, snr, rng, talkers)
                for name, run in candidates.items():
                    start = time.process_time()
                    sent = mix if run is None else run(mix)
                    cpu[name].append((time.process_time() - start) / (mix.size / RATE))
                    jobs.append(((kind, snr), name, n, sent))
    async_client = stack.async_client()
    gate = asyncio.Semaphore(2)  # whisper_stt's two instances

    async def transcribe(pcm: npt.NDArray[np.int16]) -> str:
        async with gate:
            said = await async_client.audio.transcriptions.create(
                model="whisper_stt",
                file=("noisy.wav", wav_bytes(pcm.tobytes())),
                response_format="text",
            )
        return normalized(str(said))

    said = await asyncio.gather(*(transcribe(job[3]) for job in jobs))
    heard: dict[tuple[tuple[str, float], str], list[str]] = {}
    references: dict[tuple[tuple[str, float], str], list[str]] = {}
    for (condition, name, n, _), text in zip(jobs, said, strict=True):
        heard.setdefault((condition, name), []).append(text)
        references.setdefault((condition, name), []).append(texts[n])
    rates = {key: wer(references[key], heard[key]) for key in heard}
    names = list(candidates)
    lines = [
        f"{len(texts)} sentences x {draws} noise draw(s), "
        f"{sum(len(t.split()) for t in texts) * draws} words per condition; WER %",
        "",
        "| noise | SNR | " + " | ".join(names) + " |",
        "| --- | --- |" + " --- |" * len(names),
    ]
    for kind, snr in conditions:
        cells = " | ".join(f"{rates[((kind, snr), name)]:.1f}" for name in names)
        lines.append(f"| {kind} | {'-' if kind == 'clean' else f'{snr:g} dB'} | {cells} |")
    noisy = [condition for condition in conditions if condition[0] != "clean"]
    mean = {name: statistics.mean(rates[(c, name)] for c in noisy) for name in names}
    worst = {name: max(rates[(c, name)] - rates[(c, "none")] for c in conditions) for name in names}
    lines.append("| mean, noisy | | " + " | ".join(f"{mean[n]:.1f}" for n in names) + " |")
    lines.append("| worst rise | | " + " | ".join(f"{worst[n]:+.1f}" for n in names) + " |")
    lines.append(
        "| CPU ms / s audio | | "
        + " | ".join(f"{1000 * statistics.mean(cpu[n]):.1f}" for n in names)
        + " |"
    )
    lines.append("")
    for name in names[1:]:
        gain = mean["none"] - mean[name]
        honoured = gain >= 2 and worst[name] <= 1
        lines.append(
            f"{name}: mean WER {gain:+.1f} points lower on noisy speech, worst rise "
            f"{worst[name]:+.1f}: {'honour' if honoured else 'refuse'} (>= 2 lower, <= 1 rise)"
        )
    return lines


def main() -> None:
    args = options(__doc__)
    lines = rows_on_stack(["piper_tts", "whisper_stt"], rows, args.scale)
    print(*lines, sep="\n")
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
