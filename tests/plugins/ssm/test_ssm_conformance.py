"""The project's backend conformance suite (specframe.testing) run on `ssm-tree` with a tiny Mamba2 +
attention hybrid, and on one hybrid of each other tree form. tests/plugins/ssm/test_ssm_backends.py covers
`ssm-unrolled`, pure Mamba2, NemotronH and every other family."""

from __future__ import annotations

import pytest
from ssm_models import make_repetitive, tiny_ssm_target

from specframe.testing import BackendConformance


class TestSSMTreeConformance(BackendConformance):
    component = "ssm-tree"

    @pytest.fixture(params=["bamba", "qwen3_next", "jamba", "lfm2"])
    def target(self, request):
        """A Mamba2, a gated DeltaNet, a Mamba-1 and a short-conv hybrid: one of each tree form."""
        return make_repetitive(tiny_ssm_target(request.param, seed=2))
