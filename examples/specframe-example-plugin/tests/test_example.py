"""Tests of the example plugin: unit tests, then specframe's conformance suites on its three components."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from specframe import (
    BuildContext, CapabilityError, DraftContext, DraftProposal, SamplingParams, TokenTree,
    TreeBuilderCapabilities,
)
from specframe.testing import (
    BackendConformance, DrafterConformance, TreeBuilderConformance, check_lossless, check_tree_builder_law,
    make_decoder, repetitive_prompt,
)
from specframe.testing.drafts import TinyModelDrafter
from specframe_example import BigramDrafter, BreadthFirstTreeBuilder, RecomputeBackend


class TestBigramConformance(DrafterConformance):
    component = BigramDrafter
    options = {"width": 2, "depth": 4}


class TestBreadthFirstConformance(TreeBuilderConformance):
    component = BreadthFirstTreeBuilder


def test_bigram_proposes_the_most_frequent_successors(tiny_target):
    drafter = BigramDrafter(tiny_target, width=2, depth=3)
    tokens = np.array([5, 7, 8, 5, 7, 9, 5, 6, 5])  # after 5: 7 twice, 6 once; after 7: 8 and 9
    proposal = drafter.propose(DraftContext(tokens, prompt_len=len(tokens), budget=8))
    assert proposal.tokens.tolist() == [7, 8, 5, 6, 5, 7]
    assert proposal.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert np.isclose(proposal.scores[0], 2 / 3) and np.isclose(proposal.scores[3], 1 / 3)


def test_bigram_counts_incrementally_and_forgets_on_reset(tiny_target):
    drafter = BigramDrafter(tiny_target, width=1, depth=1)
    first = np.array([1, 2, 1])
    assert drafter.propose(DraftContext(first, 3, 4)).tokens.tolist() == [2]
    longer = np.concatenate([first, [3, 1]])  # now 1 -> 2 once, 1 -> 3 once: the earlier one wins ties
    assert drafter.propose(DraftContext(longer, 3, 4)).tokens.tolist() == [2]
    assert sum(drafter.successors[1].values()) == 2  # each bigram counted once across calls
    drafter.reset()
    assert drafter.propose(DraftContext(np.array([4, 1]), 2, 4)).tokens.tolist() == []


def test_breadth_first_fills_shallow_levels_first():
    #            root
    #        0 (0.2)   1 (0.9)
    #        |            |
    #        2 (0.8)      3 (0.1)
    proposal = DraftProposal(np.array([10, 11, 12, 13]), np.array([-1, -1, 0, 1]),
                             np.array([0.2, 0.9, 0.8, 0.1]))
    tree = BreadthFirstTreeBuilder().build(proposal, BuildContext(budget=3))
    # both children of the root, then the better grandchild
    assert sorted(tree.tokens.tolist()) == [10, 11, 12]
    assert BreadthFirstTreeBuilder().build(proposal, BuildContext(budget=1)).tokens.tolist() == [11]


class ClaimsDrawOrder(BreadthFirstTreeBuilder):
    """Wrong on purpose: keeps the sampled label of its trees, though it ranks sampled siblings by score."""

    name = "breadth-first-claiming-draw-order"
    capabilities = TreeBuilderCapabilities(keeps_draft_probs=True, keeps_draw_order=True)

    def build(self, proposal: DraftProposal, context: BuildContext) -> TokenTree:
        tree = super().build(proposal, context)
        tree.draw = proposal.draw  # as if it had passed draw_order_prefix=True to TokenTree.from_proposal
        return tree


def test_breadth_first_keeps_the_law_and_a_false_claim_is_caught():
    check_tree_builder_law(BreadthFirstTreeBuilder(), runs=3000)  # its sampled trees fall back: lossless
    with pytest.raises(AssertionError, match="does not follow the target's distribution"):
        check_tree_builder_law(ClaimsDrawOrder(), runs=3000)


def test_assembly_refuses_breadth_first_between_sampled_drafts_and_rejection(tiny_target):
    with pytest.raises(CapabilityError, match="tree builder 'breadth-first' chooses among the drafts"):
        make_decoder(tiny_target, TinyModelDrafter, BreadthFirstTreeBuilder, "rejection", "kv",
                     sampling=SamplingParams(temperature=1.0))


class TestRecomputeConformance(BackendConformance):
    component = RecomputeBackend


def test_recompute_decodes_like_plain_greedy_with_trees(tiny_target):
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=s) for s in range(3)]
    decoder = make_decoder(tiny_target, "bigram(width=3, depth=4)", "breadth-first", "greedy",
                           RecomputeBackend)
    check_lossless(decoder, prompts, max_new_tokens=40, label="bigram + breadth-first + recompute")
    assert decoder.generate(prompts[0], max_new_tokens=40).metrics.accepted_draft_tokens > 0


def test_recompute_commits_only_the_latest_scores(tiny_target):
    backend = RecomputeBackend(tiny_target)
    backend.prefill([5, 6, 7])
    tree = TokenTree(np.array([8, 9, 10]), np.array([-1, -1, 1]))
    stale = backend.score(TokenTree.empty())
    scores = backend.score(tree)
    with pytest.raises(ValueError, match="latest score"):
        backend.commit(stale, [], 1)
    backend.commit(scores, [1, 2], 11)  # the root 7, then nodes 1 and 2
    assert backend.committed == [5, 6, 7, 9, 10] and backend.pending == 11
    with pytest.raises(ValueError, match="committed already"):
        backend.commit(scores, [1, 2], 11)


def test_recompute_refuses_recurrent_layers(tiny_target):
    hybrid = SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention", "linear_attention"]))
    assert "linear_attention" in RecomputeBackend.unsupported_reason(hybrid)
    assert RecomputeBackend.unsupported_reason(tiny_target) is None


def test_recompute_refuses_a_model_that_cannot_say_its_layers_are_attention():
    """A config without layer types (Mamba's, RWKV's) may keep state a mask does not roll back."""
    untyped = SimpleNamespace(config=SimpleNamespace(model_type="rwkv"))
    assert "lists no layer types and its model type 'rwkv'" in RecomputeBackend.unsupported_reason(untyped)
