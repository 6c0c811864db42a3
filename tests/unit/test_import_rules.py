"""Imports at the top (issue 36, pyproject.toml's PLC0415): ruff's per-file exceptions let heavy
third-party libraries stay lazy; this keeps our own modules at the top even in those files, but
on the CLI's start-up path and for optuna (through aiptrain.search)."""

from __future__ import annotations

import ast
from pathlib import Path

import aiptrain

PACKAGE = Path(aiptrain.__file__).parent
# The start-up path: `aiptrain --help` imports only click's worth; each command what it runs.
# settings.py is imported by every command module: sqlite3 (the store's dialects) and hashlib
# only when a setting needs them.
START_UP_PATH = ("__init__.py", "launcher.py", "cli/", "settings.py")
LAZY_FOR_A_HEAVY_LIBRARY = {("tuning.py", "aiptrain.search"), ("runner/study.py", "aiptrain.search"),
                            # a built-in algorithm imports TensorFlow or XGBoost once its flags are checked
                            ("algorithms/trainer/task.py", ".boosted_trees"), ("algorithms/trainer/task.py", ".keras_loop")}


def own_imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("aiptrain")):
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("aiptrain")]
    return found


def test_our_own_modules_are_imported_at_the_top_outside_the_start_up_path():
    misplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(START_UP_PATH):
            continue
        misplaced += [f"{name}:{line} {module}" for line, module in own_imports_inside_functions(path)
                      if (name, module) not in LAZY_FOR_A_HEAVY_LIBRARY]
    assert not misplaced, "import these at the top of their module (or move the code that needs them):\n" + \
        "\n".join(misplaced)
