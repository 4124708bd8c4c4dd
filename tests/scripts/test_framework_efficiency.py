"""`benchmarks/framework_efficiency.py` runs end to end on the CPU (tiny dimensions), so its measurement at
Llama-3-8B's dimensions on a GPU is one command away. Speed is not asserted, only that the pieces fit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "framework_efficiency.py"


def test_the_efficiency_benchmark_runs_on_tiny_dimensions(tmp_path):
    spec = importlib.util.spec_from_file_location("framework_efficiency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = module.main(["--dims", "tiny", "--device", "cpu", "--dtype", "float32", "--new-tokens", "12",
                            "--repeats", "1", "--budgets", "4", "--acceptance", "0.8",
                            "--out", str(tmp_path)])
    (row,) = measured["rows"]
    assert row["budget"] == 4 and 1.0 <= row["tau"] <= 5.0 and row["ideal"] > 0 and row["realised"] > 0
    assert set(row["step_ms"]) >= {"draft", "forward", "verify", "commit"}
    assert json.loads((tmp_path / "efficiency.json").read_text())["dtype"] == "float32"
    assert "realised / ideal" in (tmp_path / "efficiency.md").read_text()
