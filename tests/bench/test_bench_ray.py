"""`specframe bench --ray`: the question grid on Ray actors gives the local runner's records and outputs,
resumes a half-finished run without redoing it, and says how to install Ray when it is missing."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

import specframe
from specframe.bench import BenchPrompt, run_benchmark
from specframe.bench.distributed import run_benchmark_ray
from specframe.terms.errors import ConfigurationError

ray = pytest.importorskip("ray")

PROMPTS = [
    BenchPrompt("q1", "writing", ("Write a short poem about the sea. The sea, the sea, the sea.",
                                  "Now make it rhyme.")),
    BenchPrompt("code-1", "coding", ("def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n",),
                chat=False),
    BenchPrompt("code-2", "coding", ("for i in range(10):\n    print(i)\nfor j in range(10):\n",),
                chat=False),
]
METHODS = ["pld", "pld-trie"]
OPTIONS = dict(peers="none", repeats=1, max_new_tokens=8, plots=False, progress=False)

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def tiny_smollm2_target() -> specframe.Target:
    """A random 2-layer Llama over SmolLM2's vocabulary with SmolLM2's tokenizer, built alike anywhere."""
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir
    from specframe.testing import tiny_target

    tiny = tiny_target(seed=3, vocab_size=49152, hidden_size=32)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    return specframe.Target(model=tiny.model, tokenizer=tokenizer, name="tiny-smollm2-vocab")


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    """One two-CPU Ray instance for the module; the workers get this file's factory by value."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the workers' path
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    yield
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def keyed(records: list[dict]) -> dict[tuple, list[int]]:
    return {(r["method"], r["qid"], r["turn"], r["repeat"]): r["tokens"] for r in records}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The grid run once in this process and once on two Ray workers (each worker builds its model once),
    shared by the tests below: starting Ray workers is most of what these tests cost."""
    root = tmp_path_factory.mktemp("grid")
    local = run_benchmark(tiny_smollm2_target(), PROMPTS, METHODS, root / "local", **OPTIONS)
    remote = run_benchmark_ray(tiny_smollm2_target, PROMPTS, METHODS, root / "ray", workers=2, threads=1,
                               **OPTIONS)
    return root, local, remote


def test_ray_gives_the_local_runs_records_and_outputs(runs):
    root, (local, local_table), (remote, remote_table) = runs
    assert [r.label for r in remote.runners] == [r.label for r in local.runners] == ["baseline", *METHODS]
    assert keyed(remote.records) == keyed(local.records)  # same keys, identical greedy outputs
    assert len(remote.records) == 3 * sum(len(p.turns) for p in PROMPTS)
    assert remote.mismatches == local.mismatches == []
    written = [json.loads(line) for line in (root / "ray" / "records.jsonl").read_text().splitlines()]
    assert keyed(written) == keyed(local.records)
    assert remote_table.keys() == local_table.keys() == {"overall", "writing", "coding"}
    for name in ("results.json", "results.md"):
        assert (root / "ray" / name).exists()
    results = json.loads((root / "ray" / "results.json").read_text())
    assert [m["kind"] for m in results["methods"]] == ["PipelineRunner"] * 3
    assert results["settings"]["threads"] == 1
    assert "| pld-trie |" in (root / "ray" / "results.md").read_text()


def test_ray_resumes_a_partial_run_without_redoing_finished_cells(runs, tmp_path):
    root, (local, _), _ = runs
    shutil.copy(root / "ray" / "settings.json", tmp_path / "settings.json")
    lines = (root / "ray" / "records.jsonl").read_text().splitlines()
    # Keep q1 whole, half of code-1 (its baseline), none of code-2, and a line cut short by an interruption.
    kept = [line for line in lines if json.loads(line)["qid"] == "q1"
            or (json.loads(line)["qid"] == "code-1" and json.loads(line)["method"] == "baseline")]
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(kept) + '\n{"method": "pld", "qid": "code-2", "tur')
    run, _ = run_benchmark_ray(tiny_smollm2_target, PROMPTS, METHODS, tmp_path, workers=1, **OPTIONS)
    assert keyed(run.records) == keyed(local.records)
    written = path.read_text().splitlines()
    assert written[:len(kept)] == kept  # the finished runs were kept, not redone
    new = [json.loads(line) for line in written[len(kept) + 1:]]
    assert sorted((r["qid"], r["method"]) for r in new) == sorted(
        [("code-1", "pld"), ("code-1", "pld-trie")] + [("code-2", m) for m in ["baseline", *METHODS]])


def test_ray_missing_is_a_clear_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'specframe\[ray\]'"):
        run_benchmark_ray(tiny_smollm2_target, PROMPTS, METHODS, tmp_path, **OPTIONS)
    result = CliRunner().invoke(app, ["bench", "--ray", "local", "--out", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "specframe[ray]" in str(result.exception) + result.output
    assert not (tmp_path / "out").exists()  # refused before anything is loaded or written
