"""The `draft-model` drafter: `layers=N` self-speculation, its KV cache and rollback, losslessness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specframe
from specframe import DrawMethod, ScoreKind, StepOutcome
from specframe.terms.errors import ConfigurationError, UnsupportedModelError
from specframe.testing import DrafterConformance, reference_greedy, repetitive_prompt, tiny_target
from specframe_draft.drafter import (
    DraftModelDrafter, check_same_tokenizer, common_prefix, forest_from_picks, truncated_model,
)


class TestDraftModelConformance(DrafterConformance):
    component = "draft-model"
    max_new_tokens = 16
    options = {"layers": 1, "topk": 2}


def test_truncated_model_shares_the_targets_weights_and_leaves_it_whole():
    target = tiny_target(seed=0, layers=3)
    draft = truncated_model(target, 2)
    assert len(draft.model.layers) == 2 and len(target.model.model.layers) == 3
    assert target.config.num_hidden_layers == 3 and draft.config.num_hidden_layers == 2
    assert draft.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    shared = target.model.model.layers[1].mlp.up_proj.weight
    assert draft.model.layers[1].mlp.up_proj.weight.data_ptr() == shared.data_ptr()
    ids = torch.tensor([repetitive_prompt(96, 12)])
    with torch.no_grad():
        hidden = target.model(input_ids=ids, output_hidden_states=True).hidden_states[2]  # after 2 layers
        expected = target.model.lm_head(target.model.model.norm(hidden))
        torch.testing.assert_close(draft(input_ids=ids).logits, expected)


def test_cache_matches_a_fresh_forward_after_rollbacks():
    target = tiny_target(seed=0, layers=3)
    drafter = DraftModelDrafter(target, layers=2, num_tokens=4)
    tokens = repetitive_prompt(96, 20)
    rng = np.random.default_rng(0)
    for _ in range(5):
        proposal = drafter.propose(specframe.DraftContext(np.array(tokens), 10, 8))
        accepted = proposal.tokens[: int(rng.integers(0, 4))].tolist()  # a prefix of the chain, or a miss
        bonus = int(rng.integers(0, 96))
        drafter.observe(StepOutcome(proposal, len(proposal), accepted, bonus))
        assert drafter.cached == tokens + accepted
        tokens = tokens + accepted + [bonus]
    fresh = DraftModelDrafter(target, layers=2, num_tokens=4)
    a = drafter.propose(specframe.DraftContext(np.array(tokens), 10, 8))
    b = fresh.propose(specframe.DraftContext(np.array(tokens), 10, 8))
    assert a.tokens.tolist() == b.tokens.tolist()
    torch.testing.assert_close(a.draft_probs, b.draft_probs, atol=1e-5, rtol=1e-5)


def test_forest_from_picks_has_sibling_leaves_and_cumulative_log_q_scores():
    q = torch.softmax(torch.randn(3, 20), -1)  # (L, V)
    picks = [q[d].topk(3).indices.tolist() for d in range(3)]
    chain = [p[0] for p in picks]
    proposal = forest_from_picks(picks, q, DrawMethod.TOPK)
    assert len(proposal) == 9 and proposal.parents.tolist() == [-1, -1, -1, 0, 0, 0, 3, 3, 3]
    assert proposal.tokens[[0, 3, 6]].tolist() == chain and proposal.score_kind is ScoreKind.LOG_PROB
    assert proposal.scores[6] == pytest.approx(float(q[0, chain[0]].log() + q[1, chain[1]].log()
                                                     + q[2, chain[2]].log()), abs=1e-5)
    assert len(forest_from_picks([p[:1] for p in picks], q, DrawMethod.ARGMAX)) == 3
    assert len(forest_from_picks(picks, q, DrawMethod.SAMPLED, limit=4)) == 4  # a prefix in draw order

def test_bad_options_and_tokenizers_are_clear_errors():
    target = tiny_target(seed=0, layers=3)
    with pytest.raises(ConfigurationError, match=r"layers must be in \[1, 2\]"):
        DraftModelDrafter(target, layers=3)
    with pytest.raises(ConfigurationError, match="exactly one"):
        DraftModelDrafter(target)
    assert DraftModelDrafter(target, model="layers:1").extra_parameters == 0
    other = tiny_target(seed=1, vocab_size=128)
    with pytest.raises(ConfigurationError, match="does not share the tokenizer"):
        check_same_tokenizer(target, other)
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
def test_self_speculation_on_a_recurrent_target_is_refused_clearly(kind):
    """A KV-cache crop cannot roll back the first layers of a Mamba2 or Bamba target: refused, naming what
    would draft instead, before the truncation (which would fail setting the config's layer types)."""
    from ssm_models import tiny_ssm_target

    target = tiny_ssm_target(kind)
    with pytest.raises(UnsupportedModelError, match=r"draft-model\(layers=1\) cannot draft .*(e\.g\. pld)"):
        DraftModelDrafter(target, layers=1)
    with pytest.raises(UnsupportedModelError, match="tiny-" + kind):
        specframe.SpeculativeDecoder.from_names(target, "draft-model(layers=1)", backend="ssm-tree")


@pytest.mark.parametrize("tree", ["chain", "static", "static(preset=cartesian, widths=(2, 2, 2))",
                                  "static(preset=E)", "beam(width=2, depth=4)", "dynamic(topk=2)"])
def test_greedy_lossless_with_every_tree_builder(tree):
    target = tiny_target(seed=0, layers=3)
    decoder = specframe.SpeculativeDecoder.from_names(target, "draft-model(layers=2, topk=3, num_tokens=4)",
                                                      tree, budget=10)
    prompt = repetitive_prompt(target.vocab_size, 30, seed=0)
    result = decoder.generate(prompt, max_new_tokens=20)
    assert result.tokens == reference_greedy(target, prompt, 20)
    assert result.metrics.accepted_draft_tokens > 0


@pytest.mark.slow
def test_self_speculation_on_the_real_model_is_lossless(smollm2):
    prompt = "def is_prime(n):\n"
    ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    decoder = specframe.SpeculativeDecoder.from_names(smollm2, "draft-model(layers=12)", "chain", budget=4)
    result = decoder.generate(prompt, max_new_tokens=32)
    assert result.tokens == reference_greedy(smollm2, ids, 32)
    assert result.metrics.accepted_draft_tokens > 0
