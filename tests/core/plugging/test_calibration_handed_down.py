"""A backend is handed its calibration when it is built (`specframe.contract.calibration.Calibration`):
`assemble` reads the store, the first `budget="auto"` request of a pipeline assembled without one gets a new
backend built with what it measured, and a bench calibrates before it builds its plain baselines. No backend
is changed after it is built. Timings are stubbed: tests never assert wall times."""

from __future__ import annotations

import pytest

from specframe import SpeculativeDecoder, StateBackend
from specframe.contract.calibration import Calibration
from specframe.plugging import calibration
from specframe.plugging.pipeline import assemble, calibrate_backend, calibrate_pipeline
from specframe.runtime.devices import CPU_MIN_ROWS
from specframe.terms.cost import MeasuredCost
from specframe.testing.targets import tiny_target

PADDED = (0.061, 0.057)  # a plain step measured alone and padded: padding no slower, so chosen


@pytest.fixture(autouse=True)
def empty_home(tmp_path, monkeypatch):
    """No stored calibration but those a test makes, and timings that cost nothing."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "probe_padding", lambda alone, padded, **kwargs: PADDED)
    monkeypatch.setattr(calibration, "round_times", lambda backend, keys, rounds, **kwargs:
                        {(n, shape): [0.01 * (1 + n)] for n, shape in keys})


@pytest.fixture
def target():
    return tiny_target(seed=3, vocab_size=64)


def test_a_stored_calibration_goes_to_the_backend_as_a_value():
    stored = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=CPU_MIN_ROWS, padding_s=PADDED)
    given = MeasuredCost((0, 4), (1.0, 1.2), (1.0, 1.1), min_rows=CPU_MIN_ROWS)  # no probe: no choice
    assert Calibration.of(stored) == Calibration(stored, CPU_MIN_ROWS)
    assert Calibration.of(given) == Calibration(given, None) and Calibration.of(None) == Calibration()


def test_assembly_hands_the_stored_calibration_down(target):
    before = assemble(target).backend
    assert before.calibration == Calibration() and before.min_rows == 1
    cost = calibrate_backend(target, "kv", progress=False)
    after = assemble(target).backend
    assert after.calibration == Calibration.of(cost) and after.min_rows == CPU_MIN_ROWS
    assert before.calibration == Calibration() and before.min_rows == 1  # built before: unchanged


def test_the_first_auto_request_measures_then_decodes_on_a_backend_built_with_it(target):
    decoder = SpeculativeDecoder.from_names(target, "pld", budget="auto:4")
    early = decoder.pipeline.backend
    decoder.progress = False
    decoder.generate([1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=4)
    backend = decoder.pipeline.backend
    assert backend is not early and early.min_rows == 1
    assert backend.min_rows == CPU_MIN_ROWS
    assert backend.calibration == Calibration.of(calibration.stored_cost(early))  # what was measured


def test_a_backend_whose_constructor_takes_no_calibration_is_built_once_and_measured_as_it_runs(target):
    """A third party's backend written before `calibration` existed (`__init__(target, *, want_hidden)`)
    is assembled as before; its cost is measured on it and stored, and it keeps running."""
    from specframe_kv import KVCacheBackend

    built = []

    class Older(KVCacheBackend):
        name = "older"

        def __init__(self, target, *, want_hidden: bool = False):
            built.append(self)
            super().__init__(target, want_hidden=want_hidden, min_rows=1)

    pipeline = assemble(target, backend=Older)
    assert pipeline.build_backend is None and built == [pipeline.backend]
    cost = calibrate_pipeline(pipeline, progress=False)
    assert built == [pipeline.backend] and cost.min_rows == 1 and cost.padding_s == ()
    assert calibration.stored_cost(pipeline.backend) == cost


def test_the_contract_default_leaves_no_padding_to_measurement(target):
    class Plain(StateBackend):
        name = "plain"
        committed_length = 0
        prefill = score = commit = None

    assert not Plain(target).pads_by_measurement()
    assert Plain(target, calibration=Calibration(min_rows=4)).calibration.min_rows == 4


def test_a_bench_calibrates_before_it_builds_its_plain_baseline(target):
    """The baseline is built first and a backend keeps the padding it was built with: the bench measures
    the calibration its `budget="auto"` methods plan with before building any runner, so the baseline pads
    its forwards as those methods' backends do."""
    from specframe.bench.methods import resolve_methods
    from specframe.bench.runner import build_runners
    from specframe.plugging.registry import get_registry
    from specframe.terms.sampling import SamplingParams

    registry = get_registry()
    runners = build_runners(target, resolve_methods(["pld@auto:4"], registry), [], SamplingParams(), registry)
    baseline, method = (runner.decoder.pipeline.backend for runner in runners)
    assert baseline.min_rows == method.min_rows == CPU_MIN_ROWS
    assert baseline.calibration == method.calibration != Calibration()
