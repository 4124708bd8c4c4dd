"""specframe's own conformance suites (specframe.testing) run on every first-party component that can be
built without trained weights or a datastore, exactly as a third-party plugin would run them. The SSM
backends run on the tiny Mamba2 / hybrid targets of tests/helpers/ssm_models.py (the `target` fixture is
overridden)."""

from __future__ import annotations

import pytest

from specframe.testing import (
    BackendConformance, DrafterConformance, TreeBuilderConformance, VerifierConformance,
)


class TestPromptLookupConformance(DrafterConformance):
    component = "pld"
    options = {"matches": 3}


class TestNoneDrafterConformance(DrafterConformance):
    component = "none"
    proposes = False  # the plain drafter: decoding without speculation


class TestDraftModel(DrafterConformance):
    component = "draft-model"
    options = {"layers": 1}


class TestRestLiveContext(DrafterConformance):
    component = "rest"
    options = {"live": 1}


class TestChainConformance(TreeBuilderConformance):
    component = "chain"


class TestFirstNodesConformance(TreeBuilderConformance):
    component = "first-n"


class TestTrie(TreeBuilderConformance):
    component = "trie"


class TestStatic(TreeBuilderConformance):
    component = "static"


class TestBeam(TreeBuilderConformance):
    component = "beam"


class TestDynamic(TreeBuilderConformance):
    component = "dynamic"


class TestGreedyConformance(VerifierConformance):
    component = "greedy"
    maximal = True


class TestSampleMatch(VerifierConformance):
    component = "sample-match"
    maximal = True
    law_runs = 2000  # a smoke run: test_lossless_power.py checks the first-party verifiers at 20,000


class TestRejection(VerifierConformance):
    component = "rejection"
    maximal = True
    law_runs = 2000


class TestTypical(VerifierConformance):
    component = "typical"  # lossy when sampling: only its greedy behaviour and paths are checked
    maximal = True


class TestKVConformance(BackendConformance):
    component = "kv"


class _SSMTarget:
    family: str

    @pytest.fixture
    def target(self):
        from ssm_models import tiny_ssm_target

        return tiny_ssm_target(self.family)


class TestSSMTreeOnMamba2(_SSMTarget, BackendConformance):
    component, family = "ssm-tree", "mamba2"


class TestSSMTreeOnBamba(_SSMTarget, BackendConformance):
    component, family = "ssm-tree", "bamba"


class TestSSMUnrolledOnNemotronH(_SSMTarget, BackendConformance):
    component, family = "ssm-unrolled", "nemotronh"
