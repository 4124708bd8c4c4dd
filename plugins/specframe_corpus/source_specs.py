"""The `--source` argument of `specframe datastore build`: which `Source` a spec names.

A directory (with a glob), a JSONL file (a text field or chat turns), a single text file,
`python-stdlib`, `python-site`, `model:PROMPTS.jsonl` (the target's own answers to a prompt file, see
`answers.py`), `model:self` (the target's answers to prompts it wrote itself, see `self_prompts.py`),
`model-continue:PROMPTS.jsonl` (its raw continuations, no chat template) or `model-continue:python-stubs`
(its continuations of standard-library function stubs, see `code_stubs.py`).
This module sits above every kind of source, so that the sources themselves import none of each other.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from specframe_corpus.datastore import DatastoreError
from specframe_corpus.sources import JsonlTexts, Source, TextFiles


def python_files(root: Path, exclude_site: bool) -> list[Path]:
    """The `.py` files under `root` in a fixed order; with `exclude_site`, none of its installed packages."""
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    if exclude_site:
        files = [p for p in files if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)]
    return files


def parse_source(spec: str, glob: str = "**/*", field_name: str | None = None, **answer_options) -> Source:
    """The `Source` named by a `--source` argument (see the module docstring). `answer_options`
    (`max_new_tokens`, `batch_size`) apply to `model:` sources, `self_prompts` (how many) to `model:self`."""
    if spec == "python-stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        files = python_files(root, exclude_site=True)
        return TextFiles(spec, "python-stdlib", len(files), {"root": str(root), "files": len(files)}, files)
    if spec == "python-site":
        roots = sorted({Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})
        files = [f for root in roots if root.is_dir() for f in python_files(root, exclude_site=False)]
        return TextFiles(
            spec, "python-site", len(files), {"roots": [str(r) for r in roots], "files": len(files)}, files
        )
    self_prompts = answer_options.pop("self_prompts", 2000)
    if spec == "model:self":  # the model sources load torch: imported only when named
        from specframe_corpus.self_prompts import SelfPrompts

        return SelfPrompts.from_spec(spec, self_prompts, **answer_options)
    if spec == "model-continue:python-stubs":
        from specframe_corpus.code_stubs import PythonStubs

        return PythonStubs.from_spec(spec, self_prompts, **answer_options)
    if spec.startswith(("model:", "model-continue:")):
        from specframe_corpus.answers import ModelAnswers

        return ModelAnswers.from_spec(spec, **answer_options)
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.glob(glob) if p.is_file())
        return TextFiles(spec, "directory", len(files), {"glob": glob, "files": len(files)}, files)
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        return JsonlTexts(spec, "jsonl", lines, {"field": field_name}, path, field_name)
    if path.is_file():
        return TextFiles(spec, "file", 1, {}, [path])
    raise DatastoreError(
        f"datastore source '{spec}' is neither a directory, a file, python-stdlib, "
        "python-site, model:self, model:PROMPTS.jsonl, model-continue:PROMPTS.jsonl nor "
        "model-continue:python-stubs"
    )
