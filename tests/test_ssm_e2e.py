"""End to end on tiny random Mamba2, Bamba and NemotronH targets: speculative greedy decoding through the
SSM backends emits exactly the tokens of plain greedy decoding (the `none` drafter, and a plain loop of
the unmodified model)."""

from __future__ import annotations

import numpy as np
import pytest
from ssm_models import make_repetitive, reference_greedy, tiny_ssm_target

import specframe
from specframe import DraftProposal, PluginRegistry, SpeculativeDecoder, TokenTree, TreeBuilder

PROMPT = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6]
NEW_TOKENS = 32


class BestFirstTree(TreeBuilder):
    """`best-first` (tests only): the `budget` highest-scored nodes whose ancestors are all kept."""

    name = "best-first"

    def build(self, proposal: DraftProposal, budget: int) -> TokenTree:
        order = sorted(range(len(proposal)), key=lambda i: (-proposal.scores[i], i))
        keep: set[int] = set()
        for i in order:
            if len(keep) == budget:
                break
            if proposal.parents[i] < 0 or proposal.parents[i] in keep:
                keep.add(i)
        return TokenTree.from_proposal(proposal, np.array(sorted(keep), np.int64))


class TestTrees:
    @staticmethod
    @specframe.hookimpl
    def register_tree_builders(register):
        register(BestFirstTree)


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.load()
    registry.register_plugin(TestTrees, name="ssm-test-trees")
    return registry


@pytest.fixture(scope="module", params=["mamba2", "bamba", "nemotronh"])
def target(request):
    return make_repetitive(tiny_ssm_target(request.param, seed=1))


@pytest.fixture(scope="module")
def plain(target, registry) -> list[int]:
    decoder = SpeculativeDecoder.from_names(target, "none", "chain", "greedy", "ssm-tree", registry=registry)
    tokens = decoder.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens
    assert tokens == reference_greedy(target, PROMPT, NEW_TOKENS)
    return tokens


@pytest.mark.parametrize(("drafter", "tree", "backend"), [
    ("pld", "chain", "ssm-tree"),
    ("pld(matches=3)", "chain", "ssm-tree"),
    ("pld(matches=3, num_tokens=4)", "best-first", "ssm-tree"),
    ("pld(matches=3, num_tokens=4)", "best-first", "ssm-tree(commit=closed)"),
    ("pld(matches=3, num_tokens=4)", "best-first", "ssm-unrolled"),
])
def test_speculative_greedy_equals_plain_greedy(target, registry, plain, drafter, tree, backend):
    decoder = SpeculativeDecoder.from_names(target, drafter, tree, "greedy", backend, budget=8,
                                            registry=registry)
    result = decoder.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert result.tokens == plain
    assert result.metrics.accepted_draft_tokens > 0  # drafts were accepted: the check is not vacuous
