"""Notebooks are paired with jupytext py:percent twins, in sync, and stored without outputs.

Executing them is CI's job (`pytest --nbmake notebooks/`), not this fast test's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PY_FILES = sorted(NOTEBOOKS.glob("*.py"))
IPYNB_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_has_its_twin():
    assert PY_FILES, "notebooks/ holds no py:percent files"
    assert {p.stem for p in PY_FILES} == {p.stem for p in IPYNB_FILES}


@pytest.mark.parametrize("path", IPYNB_FILES, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
                f"{path.name} has outputs: clear them (jupytext --sync keeps the .ipynb output-free)"


@pytest.mark.parametrize("path", PY_FILES, ids=lambda p: p.name)
def test_py_twin_is_paired_and_in_sync(path):
    jupytext = pytest.importorskip("jupytext")
    text = path.read_text()
    assert "formats: ipynb,py:percent" in text, (
        f"{path.name} is not paired (jupytext --set-formats ipynb,py:percent)")
    from_py = [(c.cell_type, c.source) for c in jupytext.read(path).cells]
    from_ipynb = [(c.cell_type, c.source) for c in jupytext.read(path.with_suffix(".ipynb")).cells]
    assert from_py == from_ipynb, f"{path.name} and its .ipynb differ: run `jupytext --sync {path}`"
