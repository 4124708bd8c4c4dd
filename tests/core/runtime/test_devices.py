"""Whether a backend pads its CPU forwards to `min_rows` rows: chosen by what calibration measures for the
model (`specframe.runtime.devices.forward_min_rows`) and handed to the backend when it is built
(`specframe.contract.calibration.Calibration`), with the timings stubbed (tests never assert wall times)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from ssm_models import tiny_ssm_target

from specframe.contract.calibration import Calibration
from specframe.plugging import calibration
from specframe.plugging.pipeline import assemble, calibrate_pipeline
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


def stub_timings(monkeypatch, alone_s: float, padded_s: float) -> tuple[list, list]:
    """Calibration with a plain step measured at `alone_s` unpadded and `padded_s` padded, and made-up
    curves; returns the padding probes run (the rows of the two backends each probe timed) and the rows
    of every backend whose curves were measured."""
    probes, measured = [], []

    def probe(alone, padded, **kwargs):
        probes.append((alone.min_rows, padded.min_rows))
        return alone_s, padded_s

    def curves(backend, keys, rounds, **kwargs):
        measured.append(backend.min_rows)
        return {(n, shape): [0.01 * (1 + n)] for n, shape in keys}

    monkeypatch.setattr(calibration, "probe_padding", probe)
    monkeypatch.setattr(calibration, "round_times", curves)
    return probes, measured


def test_padding_is_chosen_only_where_it_was_measured_no_slower():
    assert padded_rows(0.051, 0.026) == CPU_MIN_ROWS
    assert padded_rows(0.030, 0.030) == CPU_MIN_ROWS
    assert padded_rows(0.0256, 0.0510) == 1  # the Bamba-style model: padding doubled a plain step
    assert padded_rows(0.030, 0.020, rows=8) == 8


def test_an_explicit_min_rows_wins_and_padding_stays_off_where_it_cannot_pay():
    assert forward_min_rows(7, CPU, "kv", calibrated=CPU_MIN_ROWS) == 7
    assert forward_min_rows(None, torch.device("cuda"), "kv", calibrated=CPU_MIN_ROWS) == 1
    assert forward_min_rows(None, CPU, "kv", "stream", calibrated=CPU_MIN_ROWS, pads_uncalibrated=True) == 1
    assert forward_min_rows(None, CPU, "kv", calibrated=CPU_MIN_ROWS) == CPU_MIN_ROWS
    assert forward_min_rows(None, CPU, "kv", calibrated=1, pads_uncalibrated=True) == 1
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
def test_calibration_measures_whether_padding_pays_and_backends_built_later_are_handed_it(
        name, alone_s, padded_s, rows, monkeypatch):
    """The probe times a backend built unpadded against one built padded, the costs are measured on one
    built with the rows chosen, and every backend built afterwards for the same keys is handed them."""
    backend_cls, make_target = BACKENDS[name]
    target = make_target()
    probes, measured = stub_timings(monkeypatch, alone_s, padded_s)
    pipeline = assemble(target, backend=name)
    cost = calibration.cached_cost(pipeline.backend, pipeline.build_backend, progress=False)
    assert probes == [(1, CPU_MIN_ROWS)] and set(measured) == {rows}  # measured as it will run
    assert cost.min_rows == rows and cost.padding_s == (alone_s, padded_s)
    assert calibration.stored_cost(pipeline.backend) == cost  # stored with the costs, under the same key
    later = assemble(target, backend=name).backend
    assert later.min_rows == rows and later.calibration == Calibration(cost, rows)
    assert backend_cls(target, min_rows=2).min_rows == 2


def test_an_explicit_min_rows_is_calibrated_as_given_without_a_probe(monkeypatch):
    probes, measured = stub_timings(monkeypatch, 0.0256, 0.0510)
    target = BACKENDS["kv"][1]()
    pipeline = assemble(target, backend=f"kv(min_rows={CPU_MIN_ROWS})")
    assert not pipeline.backend.pads_by_measurement()
    cost = calibration.cached_cost(pipeline.backend, pipeline.build_backend, progress=False)
    assert probes == [] and set(measured) == {CPU_MIN_ROWS}
    assert cost.min_rows == CPU_MIN_ROWS and cost.padding_s == ()
    assert Calibration.of(cost).min_rows is None  # the rows it ran at, not a choice to hand down
    assert assemble(target).backend.min_rows == 1  # another key, nothing measured for it: the default


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("alone_s,padded_s,rows", [(0.0256, 0.0510, 1), (0.061, 0.057, CPU_MIN_ROWS)])
def test_a_calibration_measured_after_assembly_reaches_the_pipeline_by_a_new_backend(
        name, alone_s, padded_s, rows, monkeypatch):
    """The first `budget="auto"` request measures what assembly found no calibration for: the pipeline's
    backend is then one built with it, padding as the cost was measured; the backend built before it,
    and backends of another model or with their `min_rows` given, keep what they were built with."""
    backend_cls, make_target = BACKENDS[name]
    target = make_target()
    stub_timings(monkeypatch, alone_s, padded_s)
    pipeline = assemble(target, backend=name)
    early, given = pipeline.backend, backend_cls(target, min_rows=2)
    other = assemble(replace(make_target(), name="another model"), backend=name).backend
    cost = calibrate_pipeline(pipeline, progress=False)
    assert pipeline.backend is not early and pipeline.backend.calibration.cost == cost
    assert pipeline.backend.min_rows == rows
    assert (early.min_rows, given.min_rows, other.min_rows) == (1, 2, 1)
    assert calibrate_pipeline(pipeline, progress=False) == cost  # handed down: nothing measured again


def test_a_calibration_stored_after_a_backend_was_built_is_run_as_it_is_priced():
    """The planner of `budget="auto"` prices steps with a calibration another process may have stored
    after this pipeline was assembled: its backend is then rebuilt to pad as that calibration chose."""
    pipeline = assemble(BACKENDS["kv"][1]())
    stored = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=CPU_MIN_ROWS, padding_s=(0.061, 0.057))
    key = calibration.cost_key(pipeline.backend)
    calibration.write_cost(calibration.cost_path(key), key, stored)  # nothing in this process measured it
    early = pipeline.backend
    assert calibrate_pipeline(pipeline, progress=False) == stored
    assert pipeline.backend.min_rows == CPU_MIN_ROWS and early.min_rows == 1


def test_the_probe_times_a_plain_step_alone_and_padded(monkeypatch):
    """The fastest of the rounds for each padding, whichever rounds a stall slowed."""
    target = BACKENDS["kv"][1]()
    alone, padded = (KVCacheBackend(target, calibration=Calibration(min_rows=rows)) for rows in (1, 4))
    clock, calls = [0.0], [0]

    def timed(backend):
        def score(tree):
            assert len(tree) == 0  # a plain step: the root alone
            calls[0] += 1
            clock[0] += (0.02 if backend.min_rows == 1 else 0.03) + (0.1 if calls[0] % 3 else 0.0)
        return score

    for backend in (alone, padded):
        monkeypatch.setattr(backend, "score", timed(backend))
    monkeypatch.setattr(calibration, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    assert calibration.probe_padding(alone, padded, rounds=4) == pytest.approx((0.02, 0.03))


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
