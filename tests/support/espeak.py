"""Speech in other languages for tests and benchmarks, made at run time by Debian's
``espeak-ng`` (``make`` installs it: the Makefile's ``system-deps``), and the sentences
they say. espeak-ng is a formant synthesizer: robotic, but every word is there and the
same text always makes the same audio."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Spoken:
    language: str
    """The ISO 639-1 code (and espeak-ng's voice)."""
    text: str
    english: str
    """What it means, for translations."""
    rate: int = 150
    """Words per minute (espeak-ng's default is 175; slower is clearer to Whisper base)."""


#: A few sentences per language, with their meaning in English.
SENTENCES = (
    Spoken(
        "es",
        "Buenos días. Quiero un café con leche, por favor.",
        "Good morning. I want a coffee with milk, please.",
    ),
    Spoken(
        "es",
        "Buenos días, me gustaría reservar una mesa para dos personas esta noche.",
        "Good morning, I would like to book a table for two people tonight.",
        130,
    ),
    Spoken(
        "es",
        "Mi familia vive en una casa grande cerca del mar.",
        "My family lives in a big house near the sea.",
    ),
    Spoken(
        "fr",
        "Bonjour, je voudrais acheter du pain et du fromage pour le dîner.",
        "Hello, I would like to buy bread and cheese for dinner.",
        120,
    ),
    Spoken(
        "fr",
        "Bonjour, je voudrais un café et un croissant, s'il vous plaît.",
        "Hello, I would like a coffee and a croissant, please.",
        120,
    ),
    Spoken(
        "fr",
        "Ma famille habite dans une grande maison près de la mer.",
        "My family lives in a big house near the sea.",
        120,
    ),
    Spoken("hi", "नमस्ते, आज मौसम बहुत अच्छा है।", "Hello, the weather is very nice today.", 120),
    Spoken(
        "hi",
        "मेरा परिवार समुद्र के पास एक बड़े घर में रहता है।",
        "My family lives in a big house near the sea.",
        120,
    ),
    Spoken("hi", "मैं कल सुबह बाज़ार जाऊँगा।", "I will go to the market tomorrow morning.", 120),
)


def speak(text: str, voice: str, rate: int = 150) -> bytes:
    """``text`` spoken by espeak-ng's ``voice``, as a WAV file (22,050 Hz mono)."""
    program = shutil.which("espeak-ng")
    assert program, "espeak-ng is missing: run `make system-deps` (Debian package espeak-ng)"
    done = subprocess.run(
        [program, "-v", voice, "-s", str(rate), "--stdout", text],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return done.stdout
