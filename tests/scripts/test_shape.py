"""Small functions: no function or method under specframe/, plugins/ or kernels/ is longer than `MAX_LINES`
lines, its signature included, save the few commands in `ALLOWED`; the allow-list holds nothing stale."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specframe", "plugins", "kernels")
MAX_LINES = 60

# "path::function": why it may be longer. A typer command declares each option as a parameter, its help
# text included: that is argument parsing, so of these commands only the body is held to MAX_LINES.
# BEING_SPLIT marks a function exempt in full until the change that splits it lands.
BEING_SPLIT = "being split"
ALLOWED = {
    "specframe/bench/cli.py::bench_command": "its parameters declare bench's two dozen options; the body "
                                             "hands them to bench_run",
    "specframe/cli.py::generate": "its parameters declare generate's options (the pipeline, sampling, "
                                  "timing, structured output); the body hands them to named steps",
}


def functions() -> dict[str, tuple[int, int]]:
    """"path::name" (with ":LINE" after a name met twice in a file) -> (lines in all, lines of the body),
    for every function and method in the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text("utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    key = f"{path.relative_to(ROOT).as_posix()}::{node.name}"
                    key = f"{key}:{node.lineno}" if key in found else key
                    end = node.end_lineno + 1
                    found[key] = (end - node.lineno, end - node.body[0].lineno)
    return found


def counted(key: str, lines: int, body: int) -> int:
    """The lines of a function held to MAX_LINES: all of them, the body of an allowed command, none of a
    function being split."""
    reason = ALLOWED.get(key)
    return lines if reason is None else 0 if reason == BEING_SPLIT else body


def test_no_function_is_longer_than_max_lines():
    long = {key: lines for key, (lines, body) in functions().items() if counted(key, lines, body) > MAX_LINES}
    assert not long, (f"over {MAX_LINES} lines (a command in ALLOWED: its body): "
                      + ", ".join(f"{key} ({lines} lines)" for key, lines in sorted(long.items()))
                      + "; split it into named steps")


def test_the_allow_list_names_only_functions_that_need_it():
    found = functions()
    stale = [key for key in ALLOWED if key not in found or found[key][0] <= MAX_LINES]
    assert not stale, f"remove from ALLOWED (gone, or now {MAX_LINES} lines or fewer): {', '.join(stale)}"
