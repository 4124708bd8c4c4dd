"""specframe's own conformance suites (specframe.testing) run on every first-party component that can be
built without trained weights or a datastore, exactly as a third-party plugin would run them."""

from __future__ import annotations

from specframe.records import DrawMethod
from specframe.testing import DrafterConformance, TreeBuilderConformance, VerifierConformance


class TestDraftModel(DrafterConformance):
    component = "draft-model"
    options = {"layers": 1}


class TestRestLiveContext(DrafterConformance):
    component = "rest"
    options = {"live": 1}


class TestTrie(TreeBuilderConformance):
    component = "trie"


class TestStatic(TreeBuilderConformance):
    component = "static"


class TestBeam(TreeBuilderConformance):
    component = "beam"


class TestDynamic(TreeBuilderConformance):
    component = "dynamic"


class TestSampleMatch(VerifierConformance):
    component = "sample-match"


class TestRejectionSampledDrafts(VerifierConformance):
    component = "rejection"


class TestRejectionDraftsWithoutReplacement(VerifierConformance):
    component = "rejection"
    draw = DrawMethod.SAMPLED_WITHOUT_REPLACEMENT


class TestTypical(VerifierConformance):
    component = "typical"  # lossy when sampling: only its greedy behaviour and paths are checked
