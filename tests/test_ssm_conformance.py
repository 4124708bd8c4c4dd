"""The project's backend conformance suite (specframe.testing) run on `ssm-tree` with a tiny Mamba2 +
attention hybrid. tests/test_ssm_backends.py covers `ssm-unrolled`, pure Mamba2 and NemotronH."""

from __future__ import annotations

import pytest
from ssm_models import make_repetitive, tiny_ssm_target

from specframe.testing import BackendConformance


class TestSSMTreeConformance(BackendConformance):
    component = "ssm-tree"

    @pytest.fixture
    def target(self):
        return make_repetitive(tiny_ssm_target("bamba", seed=2))
