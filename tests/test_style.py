"""STYLE.md's size limits over asyncrl/ and bench/: a file over 600 lines or a function over 60
fails, naming each; a file over 400 lines is a warning (pytest's warnings summary lists it).

Not here: lint and types (ruff and mypy run before pytest in `./run.sh test`)."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asyncrl", "bench")
FILE_FAIL, FILE_WARN, FUNCTION_FAIL = 600, 400, 60


class LongFileWarning(UserWarning):
    """A file between STYLE.md's aim (400 lines) and its limit (600)."""


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            assert node.end_lineno is not None
            yield name, node.end_lineno - node.lineno + 1
            yield from functions(node, f"{name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}: {name} is {n} lines (over {FUNCTION_FAIL})"
            for name, n in functions(tree) if n > FUNCTION_FAIL]


def test_the_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {"asyncrl/rollout/engine.py", "bench/run_all.py"} <= names


def test_no_file_over_600_lines_and_files_over_400_are_listed():
    too_long = []
    for path in sources():
        n = line_count(path)
        if n > FILE_FAIL:
            too_long.append(f"{path.relative_to(ROOT)}: {n} lines (over {FILE_FAIL})")
        elif n > FILE_WARN:
            warnings.warn(f"{path.relative_to(ROOT)}: {n} lines (STYLE.md aims under {FILE_WARN})",
                          LongFileWarning, stacklevel=1)
    assert not too_long, "split these files (STYLE.md):\n" + "\n".join(too_long)


def test_no_function_over_60_lines():
    too_long = [line for path in sources() for line in long_functions(path)]
    assert not too_long, "split these functions (STYLE.md):\n" + "\n".join(too_long)


def test_function_lengths_count_from_def_to_the_last_line():
    lines = ["class A:", "    def ok(self):", *["        x = 1"] * 59,
             "def outer():", "    def inner():", *["        y = 1"] * 60, "    return inner"]
    found = dict(functions(ast.parse("\n".join(lines))))
    assert found == {"A.ok": 60, "outer": 63, "outer.<locals>.inner": 61}
