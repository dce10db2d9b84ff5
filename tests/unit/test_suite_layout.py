"""The suite's own layout, which a newcomer relies on to find a helper: what tests share lives
in ``tests/support/`` (one module per job); a test module imports no other test module and
no conftest (pytest loads those itself), and a conftest holds fixtures and hooks only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _module(path: Path, root: Path) -> str:
    """The dotted name of ``path`` under ``root``'s parent (``tests.unit.test_x``)."""
    return ".".join(path.relative_to(root.parent).with_suffix("").parts)


def _imported(node: ast.Import | ast.ImportFrom, here: str) -> list[str]:
    """The modules an import statement may load: ``from a.b import c`` may load ``a.b.c``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative to this module's package
        package = here.split(".")[: -node.level]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_fixture_or_hook(node: ast.stmt) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return True  # imports, constants
    if node.name.startswith(("_", "pytest_")):
        return True
    return any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)


def offences(root: Path) -> list[str]:
    """Every import of a test module or a conftest under ``root``, and every plain public
    helper a conftest defines (a function or class that is no fixture or hook)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        here = _module(path, root)
        where = path.relative_to(root.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, here):
                last = name.rsplit(".", 1)[-1]
                if name.startswith(f"{root.name}.") and (
                    last.startswith("test_") or last == "conftest"
                ):
                    found.append(f"{where}:{node.lineno} imports {name}")
        if path.name == "conftest.py":
            for node in tree.body:
                if not _is_fixture_or_hook(node):
                    name = node.name  # type: ignore[attr-defined]
                    found.append(f"{where}:{node.lineno} defines {name}: not a fixture or hook")
    return found


def test_no_test_module_or_conftest_is_imported_and_conftests_hold_fixtures_only() -> None:
    assert not offences(TESTS), "helpers belong in tests/support/:\n" + "\n".join(offences(TESTS))


@pytest.mark.parametrize(
    "line",
    [
        "from tests.unit.test_realtime import until",
        "from tests.unit import test_realtime",
        "import tests.unit.test_realtime",
        "from tests.unit.conftest import make_settings",
        "from tests.unit import conftest",
        "from .test_realtime import until",
        "from . import conftest",
    ],
)
def test_each_way_of_importing_a_test_module_is_found(tmp_path: Path, line: str) -> None:
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    (unit / "test_realtime.py").write_text("def until() -> None: ...\n")
    (unit / "test_lora.py").write_text(f"{line}\n")
    (tmp_path / "tests" / "support.py").write_text("from tests.unit import helpers\n")
    assert [o.split(" imports ")[0] for o in offences(tmp_path / "tests")] == [
        "tests/unit/test_lora.py:1"
    ]


def test_a_plain_helper_in_a_conftest_is_found(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\ndef served() -> None: ...\n\n"
        "def pytest_collection_modifyitems() -> None: ...\n\n"
        "def _group() -> None: ...\n\n"
        "def make_settings() -> None: ...\n"
    )
    assert offences(tests) == ["tests/conftest.py:10 defines make_settings: not a fixture or hook"]
