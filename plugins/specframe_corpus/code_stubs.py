"""`model-continue:python-stubs`: the target's own code, continuing function stubs of the standard library.

Code prompts are fed raw (HumanEval gives a signature and a docstring and the model writes the body), so
what a drafter for code must predict is how the target continues such a stub. This source cuts `count`
stubs (a function's `def` line through its docstring, dedented) from the interpreter's standard library
(test packages excluded), writes them to `<out>.prompts.jsonl` beside the datastore, and has the target
continue each one greedily as raw text, cached and resumable as every `model:` source's answers are
(`answers.py`). No benchmark prompt is read: the stubs are library code, the bodies the target's own.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from specframe_corpus.answers import WrittenPrompts
from specframe_corpus.datastore import DatastoreError

SPEC = "model-continue:python-stubs"
MAX_STUB_CHARS = 1500  # longer docstrings are manuals, not the prompts a completion request carries


@dataclass
class PythonStubs(WrittenPrompts):
    """`count` standard-library function stubs, then the target's raw greedy continuations of them."""

    KIND: ClassVar[str] = "model-continue-stubs"
    TEMPLATE: ClassVar[bool] = False  # continued as raw text, as code prompts are fed

    def write_prompts(self, target, path: Path) -> list[str]:
        """Write the stubs to `path`: the same ones for the same count and seed."""
        stubs = python_stubs(self.count, self.seed)
        if len(stubs) < self.count:
            raise DatastoreError(f"datastore source '{self.spec}': the standard library gave {len(stubs)} "
                                 f"stubs, fewer than the {self.count} asked for; lower --self-prompts")
        path.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in stubs), encoding="utf-8")
        return stubs


def python_stubs(count: int, seed: int = 0, root: Path | None = None) -> list[str]:
    """`count` distinct stubs (signature and docstring, each ending in a newline) from the `.py` files under
    `root` (the standard library by default), in an order fixed by `seed` that mixes many modules."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    skip = {"site-packages", "dist-packages", "test", "tests"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    random.Random(seed).shuffle(files)
    stubs: list[str] = []
    seen: set[str] = set()
    for file in files:
        for stub in file_stubs(file):
            if stub not in seen:
                seen.add(stub)
                stubs.append(stub)
        if len(stubs) >= 4 * count:  # enough to draw from without reading the whole library
            break
    random.Random(seed).shuffle(stubs)  # a prefix of the list spans many modules, not the first file's
    return stubs[:count]


def file_stubs(path: Path) -> list[str]:
    """The stubs of every function or method with a docstring in one file; none for a file that does not
    parse (the library holds a few deliberately broken files)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return []
    lines = text.splitlines(keepends=True)
    stubs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        docstring = node.body[0]
        stub = textwrap.dedent("".join(lines[node.lineno - 1 : docstring.end_lineno]))
        if len(stub) <= MAX_STUB_CHARS and stub.endswith("\n"):
            stubs.append(stub)
    return stubs
