"""DecodeMetrics: one name for the acceptance histogram in Python and in records."""

import pytest

from specframe.terms.metrics import DecodeMetrics


def metrics_of(accepted: list[int]) -> DecodeMetrics:
    metrics = DecodeMetrics()
    for a in accepted:
        metrics.record_step(tree_size=4, accepted=a, times={})
    return metrics


def test_acceptance_histogram_is_the_records_field():
    metrics = metrics_of([0, 2, 2, 3])
    assert metrics.acceptance_histogram == [1, 0, 2, 1]
    assert metrics.to_dict()["acceptance_histogram"] == metrics.acceptance_histogram


def test_histogram_is_a_deprecated_alias():
    metrics = metrics_of([1, 1])
    with pytest.deprecated_call(match="acceptance_histogram"):
        assert metrics.histogram == [0, 2]
