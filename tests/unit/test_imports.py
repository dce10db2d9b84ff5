"""The code's own rules of imports, which a newcomer relies on to find their way: a name
another module imports is public (a leading underscore means "this module's own"); the
layers (api -> serving -> state | backend) are checked by import-linter in ``make lint``."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def test_no_private_name_is_imported_from_another_module() -> None:
    found = []
    for path in sorted(GATEWAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "gateway"
            ):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    where = path.relative_to(GATEWAY.parent)
                    found.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
    assert not found, "\n".join(found)
