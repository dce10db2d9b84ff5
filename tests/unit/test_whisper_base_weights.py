"""whisper_base's weights joined from their two pip packages (triton_repo/whisper_base/1/
assemble.py): once, atomically, and only when the joined file is the one checked."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pytest

ASSEMBLE = (
    Path(__file__).resolve().parents[2] / "triton_repo" / "whisper_base" / "1" / "assemble.py"
)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("assemble", ASSEMBLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_packages_join_into_the_checked_model_once(tmp_path: Path) -> None:
    assemble = load()
    start = time.perf_counter()
    folder = assemble.model_dir(tmp_path)
    joined_s = time.perf_counter() - start
    model = folder / "model.bin"
    assert model.stat().st_size == 145_217_607  # and its SHA-256 was checked on the way
    assert {p.name for p in folder.iterdir()} == {"model.bin", *assemble.SMALL_FILES}
    written = model.stat().st_mtime_ns
    again = time.perf_counter()
    assert assemble.model_dir(tmp_path) == folder
    assert model.stat().st_mtime_ns == written  # found, not joined again
    assert time.perf_counter() - again < joined_s
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temporary left


def test_a_changed_upload_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assemble = load()
    fake = {}
    for package, part in zip(
        assemble.PACKAGES, ("model.bin.part1", "model.bin.part2"), strict=True
    ):
        data = tmp_path / package / "data"
        data.mkdir(parents=True)
        (data / part).write_bytes(b"\0" * 1000)
        for name in assemble.SMALL_FILES:
            (data / name).write_text("{}")
        fake[package] = data
    monkeypatch.setattr(assemble, "package_data", fake.__getitem__)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="not the one this model was checked with"):
        assemble.model_dir(cache)
    assert list(cache.iterdir()) == []


def test_a_missing_package_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    assemble = load()
    with pytest.raises(RuntimeError, match="'no-such-package' is not installed"):
        assemble.package_data("no_such_package")
