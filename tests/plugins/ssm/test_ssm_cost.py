"""The cost models tree builders get from an SSM backend: linear in the packed tree size for SSM
targets, quadratic with attention layers, as core `PolynomialCost`s, unless a calibration is stored."""

from __future__ import annotations

import numpy as np
import pytest
from ssm_models import make_repetitive, tiny_ssm_target

import specframe
from specframe import PolynomialCost, SpeculativeDecoder, TokenTree, TreeBuilder
from specframe.plugging.calibration import cost_key
from specframe.plugging.pipeline import Pipeline
from specframe_ssm import SSMTreeBackend, SSMUnrolledBackend, calibrate, full_binary_tree

PROMPT = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6]


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    """An empty SPECFRAME_HOME: the backends fall back to their reference fits."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))


def test_a_stored_calibration_takes_precedence_over_the_reference_fit():
    """The cost measured for the backend is handed to it when it is built: to the pipeline's backend once
    measured (`calibrate_pipeline`), and to every backend assembled after it."""
    from specframe.plugging.pipeline import calibrate_pipeline

    target = tiny_ssm_target("mamba2")
    pipeline = specframe.assemble(target, backend="ssm-tree")
    reference = pipeline.backend.cost_model()
    measured = calibrate_pipeline(pipeline, progress=False)
    assert pipeline.backend.cost_model() == measured != reference
    assert specframe.assemble(target, backend="ssm-tree").backend.cost_model() == measured


def test_options_that_change_the_step_cost_are_calibrated_apart():
    from specframe.plugging.calibration import cost_path

    target = tiny_ssm_target("mamba2")
    backends = [SSMTreeBackend(target), SSMTreeBackend(target, scan="torch"),
                SSMTreeBackend(target, commit="closed"), SSMUnrolledBackend(target)]
    assert len({cost_path(cost_key(b)) for b in backends}) == len(backends)
    assert cost_key(SSMTreeBackend(target)) == cost_key(SSMTreeBackend(target, scan="auto"))


def test_the_commit_option_offers_exactly_the_commit_rules():
    from typing import get_args, get_type_hints

    from specframe_ssm.mixer import COMMIT_RULES

    assert set(get_args(get_type_hints(SSMTreeBackend.__init__)["commit"])) == set(COMMIT_RULES)


def test_full_binary_tree_sizes_follow_the_paper():
    assert [len(full_binary_tree(d)) + 1 for d in (4, 5, 6)] == [15, 31, 63]
    assert full_binary_tree(2) == [-1, -1]


def test_default_models_have_the_papers_form_and_grow_with_the_tree():
    ssm, hybrid = tiny_ssm_target("mamba2"), tiny_ssm_target("bamba")
    for backend in (SSMTreeBackend, SSMUnrolledBackend):
        unpadded = {"min_rows": 1} if backend is SSMTreeBackend else {}
        linear, quadratic = backend(ssm, **unpadded).cost_model(), backend(hybrid, **unpadded).cost_model()
        assert isinstance(linear, PolynomialCost)
        assert len(linear.coefficients) == 2  # t = k N + C
        assert len(quadratic.coefficients) == 3  # t = a N^2 + b N + c
        for cost in (linear, quadratic):
            assert cost.step_seconds(62) > cost.step_seconds(14) > 0


def test_the_variable_is_the_packed_size_as_in_the_reference_fits():
    """The SSM fits were measured against N = tree nodes + 1; `step_seconds` takes tree nodes."""
    cost = SSMTreeBackend(tiny_ssm_target("mamba2"), min_rows=1).cost_model()
    k, c = cost.coefficients
    assert abs(cost.step_seconds(14) - (15 * k + c)) < 1e-12


@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
def test_the_default_model_prices_small_trees_as_padded(kind):
    """`ssm-tree` pads every forward to `min_rows` rows (on a CPU 4 where calibration measured that no
    slower, else 1: `tests/core/runtime/test_devices.py`), so the reference fit, measured unpadded, is read
    at that size for smaller trees; `ssm-unrolled` pads nothing."""
    target = tiny_ssm_target(kind)
    fit = SSMTreeBackend(target, min_rows=1).cost_model()
    padded = SSMTreeBackend(target, min_rows=4).cost_model()
    assert SSMTreeBackend(target).cost_model() == fit  # no calibration: no padding
    nodes, depths = np.arange(8), np.zeros(8, int)
    expected = [fit.step_seconds(max(n, 3)) for n in range(8)]
    assert [padded.step_seconds(n) for n in range(8)] == pytest.approx(expected, rel=1e-12)
    assert padded.many(nodes, depths) == pytest.approx(expected, rel=1e-12)
    assert padded.at_context(500).step_seconds(0) == pytest.approx(fit.step_seconds(3))
    assert padded.step_seconds(0) > fit.step_seconds(0)
    assert isinstance(SSMUnrolledBackend(target).cost_model(), PolynomialCost)


def test_tree_builders_receive_the_backends_cost_model():
    target = make_repetitive(tiny_ssm_target("mamba2", seed=1))
    seen = []

    class Recording(TreeBuilder):
        name = "recording"

        def build(self, proposal, context):
            seen.append(context.cost)
            return TokenTree.from_proposal(proposal, np.arange(min(context.budget, len(proposal))))

    registry = specframe.get_registry()
    backend = SSMTreeBackend(target)
    pipeline = Pipeline(registry.get("drafter", "pld")(target), Recording(),
                        registry.get("verifier", "greedy")(), backend)
    SpeculativeDecoder(target, pipeline, budget=4).generate(PROMPT, max_new_tokens=12)
    assert seen and all(cost == backend.cost_model() for cost in seen)


def test_calibrate_fits_the_form_of_the_target():
    ssm, hybrid = tiny_ssm_target("mamba2"), tiny_ssm_target("bamba")
    assert len(calibrate(SSMTreeBackend(ssm), [1, 2, 3], depths=(2, 3, 4), repeats=1).coefficients) == 2
    assert len(calibrate(SSMTreeBackend(hybrid), [1, 2, 3], depths=(2, 3, 4), repeats=1).coefficients) == 3
