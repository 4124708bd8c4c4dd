"""`specframe generate --compare` (specframe/bench/compare.py) and the generate report: repeats interleaved, a
fresh decoder per repeat, medians and ranges, the noise and the notes a reader needs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specframe.bench import compare
from specframe.contract.interfaces import BackendCapabilities
from specframe.terms.sampling import SamplingParams


class FakeDecoder:
    def __init__(self, log: list, speeds: list[float], tau: float):
        self.log, self.speeds, self.tau = log, speeds, tau

    def generate(self, ids, max_new_tokens, stop=()):
        self.log.append("ours")
        metrics = SimpleNamespace(tokens_per_s=self.speeds.pop(0), tau=self.tau)
        return SimpleNamespace(tokens=[1, 2, 3], metrics=metrics)


class FakeBaseline:
    def __init__(self, log: list, speeds: list[float]):
        self.log, self.speeds = log, speeds

    def generate(self, ids, max_new_tokens):
        self.log.append("theirs")
        return [1, 2, 3], {"tokens_per_s": self.speeds.pop(0)}


def run_compare(monkeypatch, ours: list[float], theirs: list[float], tau: float = 2.0, sampling=None,
                drafter: str = "suffix"):
    import specframe.bench.peers as peers

    log, built = [], []
    monkeypatch.setattr(peers, "PeerRunner", lambda *args, **kwargs: FakeBaseline(log, theirs))

    def make_decoder():
        built.append(FakeDecoder(log, ours, tau))
        return built[-1]

    float32 = SimpleNamespace(model=torch.nn.Linear(1, 1))  # no half-precision note
    sampling = sampling or SamplingParams()
    baseline = compare.choose_baseline(float32, KvLike, lambda: pytest.fail("built a plain decoder"), (),
                                       sampling)
    report = compare.compare_with_baseline(float32, make_decoder, baseline, [1], [2], 3, (), sampling,
                                           repeats=len(ours) - 1, drafter=drafter)
    return report, log, built


class KvLike:  # a backend that scores with the target's own model
    name = "kv"
    capabilities = BackendCapabilities()


class LlamaLike:  # one that runs other weights, as llama.cpp does
    name = "llamacpp"
    capabilities = BackendCapabilities(runs_target_model=False)


def test_repeats_alternate_sides_on_fresh_decoders_and_report_medians_ranges_and_noise(monkeypatch):
    report, log, built = run_compare(monkeypatch, [99.0, 10.0, 30.0, 20.0], [99.0, 10.0, 10.0, 12.5])
    assert log == ["ours", "theirs",  # the untimed warm-up
                   "ours", "theirs", "theirs", "ours", "ours", "theirs"]  # who goes first alternates
    assert len(built) == 4  # the warm-up's decoder, then a fresh one per repeat
    assert report["repeats"] == 3 and report["clock"] == "wall"
    assert report["result"].metrics.tokens_per_s == 20.0  # the run of median speed is the one reported
    assert report["tokens_per_s_range"] == [10.0, 30.0]
    assert report["baseline_tokens_per_s"] == 10.0 and report["baseline_tokens_per_s_range"] == [10.0, 12.5]
    assert report["speedup"] == pytest.approx(1.6) and report["speedup_range"] == pytest.approx([1.0, 3.0])
    assert report["noise"] == pytest.approx(0.125)  # half the baseline's range over its median
    assert report["identical"] is True and "note" not in report


def test_a_speedup_above_tau_comes_with_a_note(monkeypatch):
    report, _, _ = run_compare(monkeypatch, [1.0, 30.0], [1.0, 10.0], tau=2.0)
    assert report["speedup"] == pytest.approx(3.0)
    assert "above tau 2.00" in report["note"] and "noise" in report["note"]
    assert "--drafter none" in report["note"]


def test_a_speedup_above_tau_within_the_noise_has_no_note(monkeypatch):
    # speedups 1.05x and 0.96x against tau 1.00, the baseline timed at 10 and at 11 tokens/s: ±5 % of noise
    report, _, _ = run_compare(monkeypatch, [1.0, 10.5, 10.5], [1.0, 10.0, 11.0], tau=1.0)
    assert report["speedup"] > 1.0 and report["noise"] == pytest.approx(0.0476, abs=1e-3)
    assert "note" not in report


def test_one_repeat_says_its_noise_is_unmeasured_and_a_speedup_equal_to_tau_as_shown_has_no_note(monkeypatch):
    report, _, _ = run_compare(monkeypatch, [1.0, 30.0], [1.0, 10.0], tau=2.0)
    assert "one repeat: the noise is not measured" in report["note"]
    report, _, _ = run_compare(monkeypatch, [1.0, 10.04], [1.0, 10.0], tau=1.0)  # 1.004x: "1.00x above 1.00"
    assert "note" not in report


def test_the_above_tau_note_never_advises_the_drafter_in_use(monkeypatch):
    report, _, _ = run_compare(monkeypatch, [1.0, 13.0], [1.0, 10.0], tau=1.0, drafter="none")
    assert "above tau 1.00" in report["note"] and "--drafter" not in report["note"]
    assert "--clock cpu" in report["note"]


def test_a_backend_on_other_weights_is_timed_against_plain_decoding_through_itself():
    class Plain:  # the plain decoder choose_baseline builds: drafter none through the same backend
        def __init__(self):
            self.calls = []

        def generate(self, ids, max_new_tokens, stop=()):
            self.calls.append((ids, max_new_tokens, stop))
            metrics = SimpleNamespace(to_dict=lambda: {"tokens_per_s": 5.0})
            return SimpleNamespace(tokens=[1, 2, 3], metrics=metrics)

    plain = Plain()
    stop = ("\n\n",)
    label, runner, note = compare.choose_baseline(None, LlamaLike, lambda: plain, stop, SamplingParams())
    assert label == "plain llamacpp (drafter none)" and "transformers" in note
    assert runner.generate([7], 4) == ([1, 2, 3], {"tokens_per_s": 5.0}) and plain.calls == [([7], 4, stop)]
    decoders = iter([FakeDecoder([], [99.0], tau=5.0), FakeDecoder([], [20.0], tau=5.0)])
    report = compare.compare_with_baseline(SimpleNamespace(model=None), lambda: next(decoders),
                                           (label, runner, note), [1], [2], 3, (), SamplingParams(),
                                           repeats=1)
    assert report["baseline"] == label and report["speedup"] == pytest.approx(4.0)
    assert report["identical"] is True and report["note"] == note


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_is_drawn_on_a_terminal_and_nothing_goes_to_a_pipe(monkeypatch, capsys, terminal):
    import specframe.support.progress as progress

    monkeypatch.setattr(progress, "on_a_terminal", lambda: terminal)
    run_compare(monkeypatch, [1.0, 10.0, 10.0], [1.0, 10.0, 10.0])
    err = capsys.readouterr().err
    assert ("--compare" in err and "/6" in err) if terminal else err == ""


def test_sampled_runs_compare_speed_only(monkeypatch):
    sampled = SamplingParams(temperature=1.0)
    report, _, _ = run_compare(monkeypatch, [1.0, 10.0], [1.0, 10.0], sampling=sampled)
    assert "identical" not in report and "speed only" in report["compared"]


def report(**extra) -> dict:
    base = {"text": "x", "new_tokens": 8, "steps": 4, "tau": 2.0, "alpha": 0.5, "tokens_per_s": 20.0,
            "wall_s": 0.4, "time_per_step_ms": {"draft": 1.0}, "fallback_steps": 0, "fallbacks": {},
            "pipeline": {"drafter": "suffix(corpus='python-site')", "tree": "trie", "verifier": "rejection",
                         "backend": "kv", "budget": "auto"}}
    return {**base, **extra}


def printed(capsys, monkeypatch, data: dict) -> str:
    from specframe.cli import print_report

    monkeypatch.setenv("COLUMNS", "70")
    print_report(data)
    return capsys.readouterr().out


def test_the_table_title_is_a_whole_line_and_a_fallback_shows_the_verifier_used(capsys, monkeypatch):
    out = printed(capsys, monkeypatch, report(fallback_steps=3, fallbacks={"no draft q": 3}))
    assert "specframe suffix(corpus='python-site')+trie+rejection+kv" in out  # not cut into a narrow title
    assert "sample-and-match on 3 of 4" in out and "no draft q" in out


def test_the_compare_rows_show_medians_ranges_noise_and_sampled_identity(capsys, monkeypatch):
    out = printed(capsys, monkeypatch, report(
        repeats=5, tokens_per_s_range=[18.0, 21.0], baseline_tokens_per_s=10.0,
        baseline_tokens_per_s_range=[9.5, 10.5], speedup=2.0, speedup_range=[1.8, 2.2], noise=0.05,
        clock="cpu", threads=1, compared="speed only", note="speedup 2.50x is above tau 2.00",
        baseline="plain llamacpp (drafter none)"))
    assert "range 1.80x-2.20x" in out and "±5 %" in out and "range 9.5-10.5" in out
    assert "plain llamacpp (drafter none)" in out and "transformers" not in out  # the baseline is named
    assert "n/a (sampled)" in out and "None" not in out
    assert "note: speedup 2.50x is above tau" in out


@pytest.mark.parametrize("args,message", [
    (["--clock", "cpu"], "--clock cpu needs --threads 1"),
    (["--clock", "gpu"], "--clock must be one of"),
])
def test_generate_refuses_bad_timing_options_before_loading_the_model(monkeypatch, args, message):
    from typer.testing import CliRunner

    import specframe.runtime.load
    from specframe.cli import app
    from specframe.terms.errors import ConfigurationError

    monkeypatch.setattr(specframe.runtime.load, "load_target",
                        lambda *a, **k: pytest.fail("loaded the model"))
    result = CliRunner().invoke(app, ["generate", "def f(x):", "--compare", *args])
    assert isinstance(result.exception, ConfigurationError) and message in str(result.exception)


def test_the_compare_json_holds_the_repeats(tmp_path):
    """End to end on a tiny model: the JSON report of `--compare --repeats 2`."""
    from typer.testing import CliRunner

    from specframe.cli import app
    from specframe.testing import tiny_target
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    model_dir = tmp_path / "model"
    tiny_target(seed=3, vocab_size=49152, hidden_size=32).model.save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m")).save_pretrained(model_dir)
    args = ["--model", str(model_dir), "--budget", "4", "--max-new-tokens", "6", "--threads", "1", "--json"]
    result = CliRunner().invoke(app, ["generate", "one two one two", "--compare", "--repeats", "2", *args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["repeats"] == 2 and data["threads"] == 1 and data["identical"] is True
    assert data["speedup_range"][0] <= data["speedup"] <= data["speedup_range"][1]
