"""The runtime models tree builders can ask an SSM backend for: linear for SSM targets, quadratic with
attention layers, fitted by least squares."""

from __future__ import annotations

import numpy as np
from ssm_models import tiny_ssm_target

from specframe_ssm import RuntimeModel, SSMTreeBackend, SSMUnrolledBackend, calibrate, full_binary_tree


def test_fit_recovers_known_coefficients():
    nodes = np.array([3, 7, 15, 31, 63])
    linear = RuntimeModel.fit(nodes, 0.002 * nodes + 0.05, 1)
    np.testing.assert_allclose(linear.coefficients, (0.002, 0.05), rtol=1e-9)
    quadratic = RuntimeModel.fit(nodes, 1e-5 * nodes**2 + 0.002 * nodes + 0.05, 2)
    np.testing.assert_allclose(quadratic.coefficients, (1e-5, 0.002, 0.05), rtol=1e-6)
    assert quadratic(10) == quadratic.predict(10)


def test_full_binary_tree_sizes_follow_the_paper():
    assert [len(full_binary_tree(d)) + 1 for d in (4, 5, 6)] == [15, 31, 63]
    assert full_binary_tree(2) == [-1, -1]


def test_default_models_have_the_papers_form_and_grow_with_the_tree():
    ssm, hybrid = tiny_ssm_target("mamba2"), tiny_ssm_target("bamba")
    for backend in (SSMTreeBackend, SSMUnrolledBackend):
        assert len(backend.cost_model(ssm).coefficients) == 2  # t = k N + C
        assert len(backend.cost_model(hybrid).coefficients) == 3  # t = a N^2 + b N + c
        for target in (ssm, hybrid):
            assert backend.cost_model(target)(63) > backend.cost_model(target)(15) > 0


def test_calibrate_fits_the_form_of_the_target():
    ssm, hybrid = tiny_ssm_target("mamba2"), tiny_ssm_target("bamba")
    assert len(calibrate(SSMTreeBackend(ssm), [1, 2, 3], depths=(2, 3, 4), repeats=1).coefficients) == 2
    assert len(calibrate(SSMTreeBackend(hybrid), [1, 2, 3], depths=(2, 3, 4), repeats=1).coefficients) == 3
