"""What planners learn from a row's step (`specframe.decode.learning`): the depth calibration of the
acceptance predicted for the nodes a cut kept."""

from __future__ import annotations

import numpy as np
import pytest

from specframe.decode.learning import CALIBRATION_PRIOR, DepthCalibration, best_size
from specframe.terms.tree import TokenTree


def chain(n: int) -> TokenTree:
    return TokenTree(np.arange(n), np.arange(n) - 1)


def test_predictions_that_run_high_at_a_depth_are_scaled_down_there_only():
    """Every kept 3-node chain is predicted 0.9 at each node; the first node is accepted every other step
    and the second never after it: depth 1 settles near 0.5 / 0.9, depth 2 near 0, depth 3 (never tried:
    its parent is never accepted) keeps its predictions, as does every deeper depth."""
    calibration = DepthCalibration()
    predicted = np.full(3, 0.9)
    for step in range(2000):
        calibration.add(predicted, chain(3), [0] if step % 2 else [])
    ratio = calibration.ratio()
    assert ratio[0] == pytest.approx(0.5 / 0.9, rel=0.02)
    assert ratio[1] < 0.05 and ratio[2] == 1.0 and (ratio[3:] == 1.0).all()
    scaled = calibration.scaled(predicted, chain(3).depth)
    assert scaled[0] == pytest.approx(0.5, rel=0.02) and scaled[2] == pytest.approx(0.9)


def test_scaled_predictions_stay_probabilities_and_start_unscaled():
    """Before any step every ratio is 1 (the prior); a depth accepted more often than predicted scales its
    predictions up, never past 1, so a path's probability still never grows from parent to child."""
    calibration = DepthCalibration()
    assert (calibration.ratio() == 1.0).all()
    for _ in range(500):
        calibration.add(np.array([0.3]), chain(1), [0])
    ratio = calibration.ratio()[0]
    assert ratio > 3.0
    scaled = calibration.scaled(np.array([0.3, 0.6]), np.array([1, 1]))
    assert scaled[0] == pytest.approx(0.3 * ratio) and scaled[1] == 1.0


def test_one_step_counts_as_the_prior_says_and_fades():
    """One step whose single node (predicted 1.0) is rejected moves depth 1 to prior / (prior + 1); later
    steps without nodes fade it back towards 1."""
    calibration = DepthCalibration()
    calibration.add(np.array([1.0]), chain(1), [])
    assert calibration.ratio()[0] == pytest.approx(CALIBRATION_PRIOR / (CALIBRATION_PRIOR + 1.0))
    for _ in range(3000):
        calibration.add(np.zeros(0), TokenTree.empty(), [])
    assert calibration.ratio()[0] == pytest.approx(1.0, abs=1e-3)


def test_best_size_is_the_size_of_most_tokens_per_second_from_one_node():
    tokens, seconds = np.array([1.0, 1.9, 2.5, 2.6]), np.array([1.0, 1.1, 1.2, 1.3])
    assert best_size(tokens, seconds) == 2
