"""The `draft-model` drafter: `layers=N` self-speculation, its KV cache and rollback, losslessness."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch

import specframe
from specframe import DrawMethod, ScoreKind, StepOutcome
from specframe.terms.errors import ConfigurationError, UnsupportedModelError
from specframe.terms.metrics import PhaseTimer
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


class SteeredDrafter(DraftModelDrafter):
    """`draft-model` that runs (and counts) its forwards as usual, but proposes the target's own next tokens
    while `right`, else tokens the target never emits there: a draft model that pays, then one that
    never does, with the same forwards and cache."""

    def __init__(self, target, **options):
        super().__init__(target, **options)
        self.truth: list[int] = []  # the prompt and the target's greedy continuation
        self.right = True
        self.forwards = self.read = 0  # forwards run, tokens they read

    def _feed(self, ids: list[int]):
        self.forwards, self.read = self.forwards + 1, self.read + len(ids)
        return super()._feed(ids)

    def propose(self, context):
        proposal = super().propose(context)
        start = len(context.tokens)  # the chain's node at depth d stands for token start + d - 1
        truth = np.array(self.truth[start:start + len(proposal)])
        if len(truth) < len(proposal):
            return proposal
        tokens = truth if self.right else (truth + 1) % self.target.vocab_size
        return dataclasses.replace(proposal, tokens=tokens[proposal.depth - 1])


class ModelledSteps(PhaseTimer):
    """A step timed as modelled, never by the clock: the forward by `COST` at the scored tree's size, and
    drafting at 0.3 of a plain step per draft-model forward (the first of 3 layers, and the LM head)."""

    def __init__(self, drafter: SteeredDrafter, backend):
        super().__init__()
        self.drafter, self.backend, self.forwards = drafter, backend, drafter.forwards

    @contextlib.contextmanager
    def __call__(self, phase: str):
        yield
        if phase == "draft":
            self.times["draft"] = 0.3 * (self.drafter.forwards - self.forwards)
        elif phase == "forward":
            self.times["forward"] = COST.step_seconds(self.backend.scored)

    def close(self) -> dict[str, float]:
        return self.times


COST = specframe.PolynomialCost((0.05, 0.95))  # 1 s a plain step, 0.05 s more a node


def test_a_draft_model_that_stops_paying_runs_few_forwards_and_reads_each_token_once():
    """Two requests where the draft model's chains are right, then four where they never are. Off, a
    step runs no draft forward (its cache is not kept up to date); a drafted step reads every token since
    the last one in one forward. Carried at full weight into the first losing request, the paying
    requests' record kept drafting on for 25 steps (96 forwards); as the planner's request prior, 14
    (52 forwards), and none in the later losing requests."""
    target = tiny_target(seed=0, layers=3)
    drafter = SteeredDrafter(target, layers=1, num_tokens=4)
    pipeline = specframe.assemble(target, "none", "chain", "greedy", "kv")
    pipeline.drafter = drafter
    backend = pipeline.backend
    rows = backend.rows

    def counted_rows(size):  # the rows the loop scores with, telling the timer each step's tree size
        batch = rows(size)
        score = batch.score

        def scored(trees):
            backend.scored = sum(len(tree) for tree in trees.values())
            return score(trees)

        batch.score = scored
        return batch

    backend.rows = counted_rows
    decoder = specframe.SpeculativeDecoder(target, pipeline, budget="auto", cost=COST,
                                           step_timer=lambda sync: ModelledSteps(drafter, backend))
    losing = []
    for request in range(6):
        prompt = repetitive_prompt(target.vocab_size, 24, seed=request)
        drafter.truth = prompt + reference_greedy(target, prompt, 60)
        drafter.right = request < 2
        before = (drafter.forwards, drafter.read)
        result = decoder.generate(prompt, max_new_tokens=60)
        assert result.tokens == drafter.truth[len(prompt):]
        drafted = result.metrics.steps - result.metrics.drafting_skipped
        if not drafter.right:
            forwards, read = drafter.forwards - before[0], drafter.read - before[1]
            losing.append(forwards)
            assert forwards <= 4 * drafted  # the catch-up and the chain: one forward each, per drafted step
            assert read <= len(prompt) + 60 + 4 * drafted  # each token once, and each rejected draft again
    assert sum(losing) <= 64 and losing[1:] == [0, 0, 0]
