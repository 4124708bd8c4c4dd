"""`static` (with its presets), `beam` and `dynamic` tree builders."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specframe
from specframe import BuildContext, ScoreKind, DraftProposal, DrawMethod
from specframe.terms.errors import CapabilityError, ConfigurationError
from specframe.testing import TreeBuilderConformance, check_tree, random_proposal, tiny_target
from specframe_trees.beam import BeamTreeBuilder
from specframe_trees.dynamic import DynamicTreeBuilder
from specframe_trees.static import (
    STREE_CONFIGS, StaticTreeBuilder, cartesian_paths, chains_paths, continuous_paths, preset_paths,
)


class TestStaticContinuous(TreeBuilderConformance):
    component = "static"
    max_new_tokens = 16  # the lossless checks decode on a tiny model; a few steps suffice per builder


class TestStaticCartesian(TreeBuilderConformance):
    max_new_tokens = 16
    component = "static"
    options = {"preset": "cartesian", "widths": (2, 2, 2)}


class TestStaticSTreeC(TreeBuilderConformance):
    max_new_tokens = 16
    component = "static"
    options = {"preset": "C"}


class TestBeam(TreeBuilderConformance):
    max_new_tokens = 16
    component = "beam"
    options = {"width": 3, "depth": 3}


class TestDynamic(TreeBuilderConformance):
    max_new_tokens = 16
    component = "dynamic"


def full_forest(width: int, depth: int, seed: int = 0) -> DraftProposal:
    """Every node (depth < `depth`) has `width` children; scores are cumulative log-probabilities.
    Children are stored in a shuffled order, so builders must rank by score, not by position."""
    rng = np.random.default_rng(seed)
    vocab = 64
    tokens, parents, scores, rows = [], [], [], []
    frontier = [(-1, 0.0)]
    for _ in range(depth):
        nxt = []
        for parent, base in frontier:
            q = torch.softmax(torch.from_numpy(rng.normal(size=vocab) * 3), -1)
            top = q.topk(width).indices.tolist()
            for tok in rng.permutation(top).tolist():
                tokens.append(tok), parents.append(parent), rows.append(q)
                scores.append(base + float(q[tok].log()))
                nxt.append((len(tokens) - 1, scores[-1]))
        frontier = nxt
    return DraftProposal(np.array(tokens), np.array(parents), np.array(scores), torch.stack(rows).float(),
                         DrawMethod.TOPK, ScoreKind.LOG_PROB)


def rank_paths(tree: specframe.TokenTree, proposal: DraftProposal) -> set[tuple[int, ...]]:
    """The rank path of every tree node, ranks taken among the node's siblings in the proposal."""
    ranked = [sorted(kids, key=lambda i: -proposal.scores[i]) for kids in proposal.children]  # best first
    paths = set()
    for path in tree.paths:
        out, parent = [], -1
        for node in path:
            child = proposal.child(parent, tree.tokens[node])
            out.append(ranked[parent + 1].index(child))
            parent = child
            paths.add(tuple(out))
    return paths


def test_presets_are_exactly_as_specified():
    assert continuous_paths(3, 3) == [(0,), (1,), (2,), (0, 0), (0, 1), (0, 2),
                                      (0, 0, 0), (0, 0, 1), (0, 0, 2)]
    widths = (3, 2, 2)
    expected = {p for d in (1, 2, 3) for p in itertools.product(*(range(w) for w in widths[:d]))}
    assert set(cartesian_paths(widths)) == expected and len(cartesian_paths(widths)) == 3 + 6 + 12
    assert STREE_CONFIGS == {"A": (3, 4), "B": (16, 3), "C": (6, 3), "D": (4, 4), "E": (3, 5)}
    for name, (width, depth) in STREE_CONFIGS.items():
        paths = preset_paths(name)
        assert len(paths) == width * depth == len(set(paths))
        assert set(paths) == {(r,) + (0,) * k for r in range(width) for k in range(depth)}
    assert chains_paths(2, 2) == [(0,), (1,), (0, 0), (1, 0)]  # shallow first: a budget cuts the deep end


@pytest.mark.parametrize("options, width, depth", [
    ({"preset": "continuous", "depth": 3, "width": 3}, 3, 3),
    ({"preset": "cartesian", "widths": (3, 2, 2)}, 3, 3),
    ({"preset": "A"}, 3, 4),
    ({"preset": "B"}, 16, 3),
])
def test_static_builds_the_preset_shape_on_a_full_forest(options, width, depth):
    proposal = full_forest(width, depth)
    builder = StaticTreeBuilder(**options)
    tree = builder.build(proposal, BuildContext(1000))
    assert len(tree) == len(builder.paths)
    assert rank_paths(tree, proposal) == set(builder.paths)
    small = builder.build(proposal, BuildContext(5))  # a budget keeps the first paths only
    assert len(small) == 5 and rank_paths(small, proposal) == set(builder.paths[:5])


def test_static_skips_paths_the_proposal_cannot_follow():
    proposal = full_forest(2, 2)
    tree = StaticTreeBuilder(paths=[[0], [3], [0, 1], [0, 5, 0]]).build(proposal, BuildContext(10))
    assert rank_paths(tree, proposal) == {(0,), (0, 1)}


def test_beam_keeps_the_best_width_nodes_of_every_depth():
    proposal = full_forest(3, 4, seed=1)
    tree = BeamTreeBuilder(width=2, depth=3).build(proposal, BuildContext(100))
    assert len(tree) == 6 and list(np.bincount(tree.depth)[1:]) == [2, 2, 2]
    beams = [-1]
    expected = []
    for d in (1, 2, 3):
        cand = [i for i in range(len(proposal)) if proposal.depth[i] == d and proposal.parents[i] in beams]
        beams = sorted(cand, key=lambda i: -proposal.scores[i])[:2]
        expected += beams
    assert sorted(proposal.tokens[expected].tolist()) == sorted(tree.tokens.tolist())
    assert BeamTreeBuilder(config="B").width == 16


def test_dynamic_reranks_globally_to_the_budget():
    proposal = full_forest(3, 3, seed=2)
    budget = 7
    tree = DynamicTreeBuilder(topk=9, depth=3).build(proposal, BuildContext(budget))  # all are candidates
    best = np.sort(proposal.scores)[::-1][:budget]
    kept = sorted(proposal.scores[i] for i in range(len(proposal))
                  if any(proposal.tokens[i] == t for t in tree.tokens))
    assert len(tree) == budget and np.allclose(sorted(best), kept[-budget:])


def test_dynamic_expands_only_topk_per_depth():
    proposal = full_forest(3, 3, seed=3)
    tree = DynamicTreeBuilder(topk=1, depth=3).build(proposal, BuildContext(100))
    assert len(tree) == 9  # 3 children of the root, 3 of the best depth-1 node, 3 of the best depth-2 node
    assert list(np.bincount(tree.depth)[1:]) == [3, 3, 3]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(1, 20),
       name=st.sampled_from(["static", "static-cartesian", "static-E", "beam", "dynamic"]))
def test_random_proposals_give_valid_trees_within_budget(seed, budget, name):
    builders = {"static": StaticTreeBuilder(), "static-cartesian": StaticTreeBuilder(preset="cartesian"),
                "static-E": StaticTreeBuilder(preset="E"), "beam": BeamTreeBuilder(config="D"),
                "dynamic": DynamicTreeBuilder(topk=3)}
    proposal = random_proposal(np.random.default_rng(seed), 32, with_probs=True, draw=DrawMethod.TOPK)
    tree = builders[name].build(proposal, BuildContext(budget))
    check_tree(tree, proposal, budget, name)  # within budget, closed under parents, made of proposal nodes
    if len(proposal):
        assert len(tree) >= 1  # every builder keeps at least the best root child


def test_forest_builders_refuse_proposals_without_distributions():
    pld_like = DraftProposal.from_sequences([[1, 2, 3], [1, 4]])
    for builder in (BeamTreeBuilder(), DynamicTreeBuilder()):
        with pytest.raises(CapabilityError, match=builder.name):
            builder.build(pld_like, BuildContext(4))
    with pytest.raises(CapabilityError, match="expands by draft probabilities"):
        specframe.assemble(tiny_target(), "pld", "beam")


def test_bad_options_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="unknown preset"):
        StaticTreeBuilder(preset="Z")
    with pytest.raises(ConfigurationError, match="unknown config"):
        BeamTreeBuilder(config="Q")
    with pytest.raises(ConfigurationError):
        DynamicTreeBuilder(topk=0)
