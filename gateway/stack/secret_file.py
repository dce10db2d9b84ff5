"""Secrets ``gateway up`` makes once and keeps under ``run_dir`` for later starts (the
admin key, the embedded Redis's password), each in a file only its owner can read."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def keep(path: Path, usable: Callable[[str], bool], make: Callable[[], str]) -> tuple[str, bool]:
    """The secret kept in ``path`` when it holds a ``usable`` one, else a new one from
    ``make``, kept there; and whether it is new.

    A new secret goes into a file created mode 600 (``mkstemp`` opens it so: no other user
    can read it at any moment, whatever the umask), which then replaces ``path`` whole. A
    kept file that an older gateway wrote with a wider mode is narrowed to 600."""
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept and usable(kept):
        path.chmod(0o600)
        return kept, False
    secret = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, written = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as file:
        file.write(secret + "\n")
    os.replace(written, path)
    return secret, True
