"""Whether a backend pads its CPU forwards to `min_rows` rows: chosen by what calibration measures for the
model (`specframe.runtime.devices.forward_min_rows`), with the timings stubbed (tests never assert wall
times)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from ssm_models import tiny_ssm_target

from specframe.decode import calibration
from specframe.terms.cost import MeasuredCost
from specframe.runtime.devices import CPU_MIN_ROWS, forward_min_rows, padded_rows
from specframe.testing.targets import tiny_target
from specframe_kv import KVCacheBackend
from specframe_ssm import SSMTreeBackend

CPU = torch.device("cpu")
BACKENDS = {"kv": (KVCacheBackend, lambda: tiny_target(seed=3, vocab_size=64)),
            "ssm-tree": (SSMTreeBackend, lambda: tiny_ssm_target("bamba"))}


@pytest.fixture(autouse=True)
def empty_home(tmp_path, monkeypatch):
    """No stored calibration but those a test makes."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))


def stub_timings(monkeypatch, alone_s: float, padded_s: float) -> list:
    """Calibration with a plain step measured at `alone_s` unpadded and `padded_s` padded, and made-up
    curves; returns the list of padding probes run."""
    probes = []

    def probe(backend, **kwargs):
        probes.append(backend)
        return alone_s, padded_s

    def curves(backend, keys, rounds, **kwargs):
        return {(n, shape): [0.01 * (1 + n)] for n, shape in keys}

    monkeypatch.setattr(calibration, "probe_padding", probe)
    monkeypatch.setattr(calibration, "round_times", curves)
    return probes


def test_padding_is_chosen_only_where_it_was_measured_no_slower():
    assert padded_rows(0.051, 0.026) == CPU_MIN_ROWS
    assert padded_rows(0.030, 0.030) == CPU_MIN_ROWS
    assert padded_rows(0.0256, 0.0510) == 1  # the Bamba-style model: padding doubled a plain step
    assert padded_rows(0.030, 0.020, rows=8) == 8


def test_an_explicit_min_rows_wins_and_padding_stays_off_where_it_cannot_pay():
    measured = [CPU_MIN_ROWS]
    calibrated = measured.pop  # a second call would fail: the calibration is read at most once
    assert forward_min_rows(7, CPU, "kv", calibrated=calibrated) == 7
    assert forward_min_rows(None, torch.device("cuda"), "kv", pads_uncalibrated=True) == 1
    assert forward_min_rows(None, CPU, "kv", "stream", pads_uncalibrated=True) == 1
    assert forward_min_rows(None, CPU, "kv", calibrated=calibrated) == CPU_MIN_ROWS
    assert forward_min_rows(None, CPU, "kv", calibrated=lambda: 1, pads_uncalibrated=True) == 1
    assert forward_min_rows(None, CPU, "kv", pads_uncalibrated=True) == CPU_MIN_ROWS
    assert forward_min_rows(None, CPU, "ssm-tree") == 1


def test_without_a_calibration_no_backend_pads():
    """Padding gains on some CPUs and loses on others (`kv`'s plain SmolLM2 step: 0.90 on an AMD EPYC,
    1.10 on an Intel Xeon with AMX), so without a measurement a plain step is the one row transformers'
    `generate` computes; `ssm-tree`'s scan work grows with the rows besides."""
    assert KVCacheBackend(BACKENDS["kv"][1]()).min_rows == 1
    assert SSMTreeBackend(BACKENDS["ssm-tree"][1]()).min_rows == 1


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("alone_s,padded_s,rows", [(0.0256, 0.0510, 1), (0.061, 0.057, CPU_MIN_ROWS)])
def test_calibration_measures_whether_padding_pays_and_backends_built_later_follow_it(
        name, alone_s, padded_s, rows, monkeypatch):
    backend_cls, make_target = BACKENDS[name]
    target = make_target()
    probes = stub_timings(monkeypatch, alone_s, padded_s)
    backend = backend_cls(target)
    cost = calibration.cached_cost(backend, progress=False)
    assert probes == [backend]
    assert backend.min_rows == cost.min_rows == rows  # measured as it will run from now on
    assert cost.padding_s == (alone_s, padded_s)
    assert calibration.stored_cost(backend) == cost  # stored with the calibration, under the same key
    assert backend_cls(target).min_rows == rows
    assert backend_cls(target, min_rows=2).min_rows == 2


def test_an_explicit_min_rows_is_calibrated_as_given_without_a_probe(monkeypatch):
    probes = stub_timings(monkeypatch, 0.0256, 0.0510)
    backend = KVCacheBackend(BACKENDS["kv"][1](), min_rows=CPU_MIN_ROWS)
    cost = calibration.cached_cost(backend, progress=False)
    assert probes == [] and cost.min_rows == CPU_MIN_ROWS and cost.padding_s == ()
    assert KVCacheBackend(backend.target).min_rows == 1  # no measured choice: the default


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("alone_s,padded_s,rows", [(0.0256, 0.0510, 1), (0.061, 0.057, CPU_MIN_ROWS)])
def test_backends_built_before_a_calibration_follow_its_choice(name, alone_s, padded_s, rows, monkeypatch):
    """A bench builds its plain baseline before the first `budget="auto"` method calibrates: the baseline's
    backend pads as that calibration chose from then on, not as it was built; a backend of another model,
    or with its `min_rows` given, keeps its own."""
    backend_cls, make_target = BACKENDS[name]
    target = make_target()
    stub_timings(monkeypatch, alone_s, padded_s)
    early, given = backend_cls(target), backend_cls(target, min_rows=2)
    other = backend_cls(replace(make_target(), name="another model"))
    calibration.cached_cost(backend_cls(target), progress=False)
    assert (early.min_rows, given.min_rows, other.min_rows) == (rows, 2, 1)


def test_a_calibration_stored_after_a_backend_was_built_is_run_as_it_is_priced():
    """The planner of `budget="auto"` prices steps with a calibration another process may have stored
    after this backend was built: the backend then pads as that calibration chose, as it is priced."""
    backend = KVCacheBackend(BACKENDS["kv"][1]())
    stored = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=CPU_MIN_ROWS, padding_s=(0.061, 0.057))
    key = calibration.cost_key(backend)
    calibration.write_cost(calibration.cost_path(key), key, stored)  # nothing in this process measured it
    assert backend.min_rows == 1
    assert calibration.cached_cost(backend, progress=False) == stored and backend.min_rows == CPU_MIN_ROWS


def test_the_probe_times_a_plain_step_alone_and_padded(monkeypatch):
    """The fastest of the rounds for each padding, whichever rounds a stall slowed."""
    backend = KVCacheBackend(BACKENDS["kv"][1]())
    clock, calls = [0.0], [0]

    def timed_score(tree):
        assert len(tree) == 0  # a plain step: the root alone
        calls[0] += 1
        clock[0] += (0.02 if backend.min_rows == 1 else 0.03) + (0.1 if calls[0] % 3 else 0.0)

    monkeypatch.setattr(backend, "score", timed_score)
    monkeypatch.setattr(calibration, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    alone, padded = calibration.probe_padding(backend, rounds=4)
    assert (alone, padded) == pytest.approx((0.02, 0.03))


def test_a_stored_padding_choice_that_no_probe_can_make_is_not_trusted(tmp_path):
    cost = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=10**9, padding_s=(0.02, 0.01))
    path = tmp_path / "kv-x.json"
    calibration.write_cost(path, {}, cost)
    assert calibration.read_cost(path) is None


def test_specframe_calibrate_says_what_it_chose_and_why():
    from specframe.cli import padding_line

    unpadded = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=1, padding_s=(0.0256, 0.0510))
    assert padding_line(unpadded) == ("a plain step took 25.6 ms alone and 51.0 ms padded to 4 rows: "
                                      "this backend's forwards are not padded")
    assert padding_line(MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=4)) is None  # given, not probed
