"""The batch planner's drafting decisions (`specframe.decode.batch_planner`): where drafting is dear, each
row drafts only while its drafted steps emit faster than its plain ones, in batch terms (its drafting
seconds, its share of the forward its nodes add, against its share of a plain batch step), and a draft
whose cost grows with its size is sized before drafting; cheap drafting is judged as well, and goes on
every step where it pays. Costs are modelled or counted here, never timed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from specframe import PolynomialCost
from specframe.contract.interfaces import Drafter
from specframe.decode.adaptive import AdaptivePlanner
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import VerifyResult
from specframe.terms.tree import TokenTree
from specframe.testing import checks
from specframe.testing.targets import reference_greedy, repetitive_prompt, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


class PaddedForward:
    """Prices a step as `kv`'s batch runs it: one forward, every row padded to the widest tree."""

    def forward_rows(self, sizes):
        return [len(sizes) * (max(sizes.values()) + 1)]


def run_rows(accepted: int, draft_s, steps: int = 120, rows: int = 4, per_token: bool = False,
             forward=(0.01, 1.0), model=None):
    """`rows` rows planned together for `steps` batch steps, as the batch loop plans them, every cost
    modelled: a forward of n query rows takes `forward` (a line in n, highest power first; the planner's
    cost model is `model`, by default the same), a row's drafting `draft_s(n)` seconds for n nodes, and
    the first `accepted` nodes of every draft are accepted. Returns the planner, by step and row the nodes
    each row drafted (-1: it did not draft), and by step the tokens emitted and the seconds taken."""
    planner = AdaptivePlanner(PolynomialCost(model or forward), cap=8, drafting_grows_with_budget=per_token,
                           learn_speed=False)
    plans = {key: planner.row() for key in range(rows)}
    for plan in plans.values():
        plan.start_request()
    drafted = np.full((steps, rows), -1)
    emitted, seconds = np.zeros(steps), np.zeros(steps)
    for step in range(steps):
        trees, times = {}, {}
        for key, plan in plans.items():
            plan.start_step(100 + step)
            n = plan.build_budget(room=100) if plan.should_draft() else -1
            drafted[step, key] = n
            trees[key] = TokenTree(np.arange(max(n, 0)), np.arange(max(n, 0)) - 1)
            plan.choose(DraftProposal.empty(), trees[key])
            plan.proposed = max(n, 0)  # as if the drafter had proposed the chain
            times[key] = {"draft": draft_s(n) if n >= 0 else 0.0}
        cut = planner.cut(trees, plans, PaddedForward())
        forward_s = float(np.polyval(forward, PaddedForward().forward_rows(
            {key: len(tree) for key, (tree, _) in cut.items()})[0]))
        drafting_s = sum(t["draft"] for t in times.values())
        emitted[step] = sum(min(len(tree), accepted) + 1 for tree, _ in cut.values())
        seconds[step] = forward_s + drafting_s
        planner.observe_step(forward_s, seconds[step], drafting_s)
        for key, (tree, _) in cut.items():
            plans[key].observe(tree, VerifyResult(list(range(min(len(tree), accepted))), 0), times[key])
    return planner, drafted, emitted, seconds


def test_rows_whose_dear_drafting_is_never_accepted_stop_drafting_within_a_few_steps():
    """Drafting costs 0.3 s a row; a plain batch step of four rows 1.04 s, 0.26 s a row. No draft is
    accepted, so every drafted step loses more than a plain step's time: each row gives way within a few
    steps and then drafts only as rare probes."""
    _, drafted, _, _ = run_rows(accepted=0, draft_s=lambda n: 0.3)
    per_row = (drafted >= 0).sum(axis=0)
    assert (per_row <= 8).all(), per_row
    assert (drafted[10:] >= 0).sum() <= 4  # after the first steps: a probe now and then, no more


def test_rows_whose_dear_drafting_pays_keep_drafting_to_the_cap():
    """The same dear drafting (0.1 s a row) with its first two nodes accepted: three tokens for a row step
    of 0.26 + 0.1 s and its share of the wider forward, faster than one token in 0.26 s. A drafter whose
    cost does not grow with the budget is not sized: it drafts to the cap."""
    planner, drafted, _, _ = run_rows(accepted=2, draft_s=lambda n: 0.1)
    assert (drafted[-100:] == 8).all() and planner.expensive() and planner.gain.mean > 1.0


def test_rows_share_what_their_nodes_add_to_the_forward_rather_than_count_on_one_another():
    """Padded to the widest tree, a row's eight nodes add nothing beside three other rows' eight, yet the
    four together take a forward of 36 rows (4.6 s) instead of 4 (1.4 s): twelve tokens in 5 s against
    four in 1.4 s. Each row pays its share of that, so the rows stop drafting."""
    _, drafted, _, _ = run_rows(accepted=2, draft_s=lambda n: 0.1, forward=(0.1, 1.0))
    assert (drafted[30:] >= 0).sum() <= 4


def test_a_per_token_drafter_is_sized_by_the_positions_rows_accept():
    """A draft model costing 0.03 s a node whose first two nodes are always accepted and the deeper ones
    never: each row's draft is sized to those two nodes, below the cap, and the rows keep drafting."""
    planner, drafted, _, _ = run_rows(accepted=2, draft_s=lambda n: 0.03 * n, per_token=True)
    assert (drafted[-60:] == 2).all(), drafted[-60:]
    assert planner.drafting_time.node_s == pytest.approx(0.03)


def test_a_per_token_drafter_that_loses_a_little_is_skipped_after_its_first_steps():
    """Sized to one node, at 0.1 s, never accepted: a drafted row step emits at 0.7x a plain one. As alone
    (`DraftingGain`'s optimistic start), such a drafter drafts a dozen steps before its record says so;
    then only probes."""
    _, drafted, _, _ = run_rows(accepted=0, draft_s=lambda n: 0.1 * n, per_token=True)
    assert (drafted[20:] >= 0).sum() <= 4


def test_in_a_batch_cheap_drafting_that_is_never_kept_stops_but_for_probes():
    """Drafting at 1 % of a plain step alone (prompt lookup, suffix trees) goes on every step alone; in a
    batch, a row's drafting that never pays is a loss the row's bandit sees: after the optimistic start,
    rows draft only as probes (their skipped steps earning each a share of a probe), always to the cap
    (cheap drafting is not sized)."""
    _, drafted, _, _ = run_rows(accepted=0, draft_s=lambda n: 0.01, per_token=True)
    later = drafted[30:]
    assert (later >= 0).mean() < 0.4, (later >= 0).mean()
    assert (later >= 0).any() and (later[later >= 0] == 8).all()


def test_in_a_batch_cheap_drafting_that_pays_goes_on_every_step_to_the_cap():
    _, drafted, _, _ = run_rows(accepted=2, draft_s=lambda n: 0.01, per_token=True)
    assert (drafted == 8).all()


# --- end to end: generate_batch with drafters whose drafting takes real time, counted -----------------------


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def prompts(target):
    return [repetitive_prompt(target.vocab_size, n, seed=i) for i, n in enumerate((9, 20, 35, 16))]


def sleeping_drafter(target, prompts, max_new: int, seconds: float, right: bool) -> type[Drafter]:
    """A drafter class that takes `seconds` to propose a chain of the budget's size, counting its calls:
    the target's own greedy continuation (`right`), or tokens the target never picks."""
    answers = [list(p) + reference_greedy(target, p, max_new) for p in prompts]

    class Sleeping(Drafter):
        name = "sleeping"
        calls: list[int] = []

        def propose(self, context):
            time.sleep(seconds)
            Sleeping.calls.append(1)
            seen = [int(t) for t in context.tokens]
            answer = next(a for a in answers if a[:len(seen)] == seen)
            chain = answer[len(seen):len(seen) + context.budget]
            if not right:
                chain = [(t + 1) % target.vocab_size for t in chain]
            return DraftProposal.from_sequences([chain]) if chain else DraftProposal.empty()

    return Sleeping


# A forward of n query rows is modelled at 20 ms + 1 ms a row: a plain step of four rows about 6 ms a row
COST = PolynomialCost((0.001, 0.02))


def test_a_batch_stops_drafting_that_costs_more_than_it_gains_and_stays_lossless(target, prompts):
    """Each row's drafting takes 20 ms (real), several plain row steps, and is never accepted: the rows
    stop within a few steps (counted calls), and every row is still plain greedy decoding of its prompt."""
    drafter = sleeping_drafter(target, prompts, 32, 0.02, right=False)
    decoder = checks.make_decoder(target, drafter, "chain", "greedy", "kv", budget="auto:6")
    decoder.cost = COST
    rows = decoder.generate_batch(prompts, 32)
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 32) for p in prompts]
    steps = sum(r.metrics.steps for r in rows)
    assert steps == 4 * 32 and len(drafter.calls) <= 4 * 8, len(drafter.calls)


def test_a_decoder_s_later_batches_start_from_what_its_earlier_batches_showed(target, prompts):
    """As alone, a decoder learns once whether dear drafting pays: the rows of its next batch start from
    that record (as a prior), so a drafter that lost does not get a few drafted steps per row again."""
    drafter = sleeping_drafter(target, prompts, 16, 0.02, right=False)
    decoder = checks.make_decoder(target, drafter, "chain", "greedy", "kv", budget="auto:6")
    decoder.cost = COST
    decoder.generate_batch(prompts, 16)
    first = len(drafter.calls)
    rows = decoder.generate_batch(prompts, 16)
    assert first >= 4 and len(drafter.calls) - first <= 4, (first, len(drafter.calls))
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 16) for p in prompts]


def test_a_batch_keeps_dear_drafting_that_pays(target, prompts):
    """The same 10 ms drafting whose six nodes are always accepted: seven tokens a drafted step, so every
    row drafts on every step, and still decodes plain greedy."""
    drafter = sleeping_drafter(target, prompts, 32, 0.01, right=True)
    decoder = checks.make_decoder(target, drafter, "chain", "greedy", "kv", budget="auto:6")
    decoder.cost = COST
    rows = decoder.generate_batch(prompts, 32)
    assert [r.tokens for r in rows] == [reference_greedy(target, p, 32) for p in prompts]
    assert sum(r.metrics.drafting_skipped for r in rows) == 0
    assert sum(r.metrics.accepted_draft_tokens for r in rows) > 3 * 32
