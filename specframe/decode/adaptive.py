"""`budget="auto"`: every row's tree sized for the most tokens per second, alone or in a batch of B, and
each row drafting only while its drafting pays. One planner for every batch size: a request alone is a
batch of one row.

A step over a subtree S of one row emits E(S) = 1 + sum of P_i over its nodes, where P_i is the predicted
probability that the target accepts node i and its ancestors (`specframe.decode.selection`). In a step
of R rows, one forward scores every row's root and kept nodes, so the step emits R + sum of P_i over all
kept nodes of all rows and takes T(R + k) seconds for k kept nodes in all. The k nodes of largest P, over
all rows (parents before children within a row: P never grows from a parent to a child), maximise the
tokens for that k; the planner keeps the k of most tokens per second, k = 0 (a plain step) included.
Where a backend pads every row of a forward to its widest tree (`kv`), a deep chain on one row makes
nodes on every other row free, which no such k may hold; so in a batch the planner also prices, for each
n, every row's n likeliest nodes, and keeps the best of all these sets. So
a row whose drafts are unlikely keeps nothing while a row in a long copied span keeps a deep chain, and
as B grows each node must be likelier to pay: the rows already fill the forward's matrix products, and a
node adds nearly a full row's cost. At B = 1 this is the classic choice of one subtree
(`choose_subtree` states it for one tree).

T prices the forwards the rows run for those trees (`BatchBackend.forward_rows`: `kv` pads every row of a
forward to its widest tree, so nodes that fill a row up to the widest are free, and RowByRow runs one
forward per row) with the backend's calibrated single-sequence cost: a forward of n query rows costs what
a tree of n - 1 nodes costs alone (for one row, at the depth of its kept tree: a chain can cost less than
a flat tree), times a factor learned from the realised forwards by their query rows (`ForwardSpeed`: the
machine's speed today against the calibration's, each size's own deviation from it where the calibration
timed that size, and beyond, a line in the rows for attention over R contexts and products of more rows
than the calibration timed), plus the step's overhead besides the forward. A forward over twice the
query rows of any timed is not chosen while that speed is learned (`ForwardSpeed.trusted`: the line is a
guess far past its points); a cost given as exact is priced as given. Acceptance is one
`AcceptanceModel` for every row. Sampled trees verified with their q (`plans_blind`) are kept whole: their
size is chosen before drafting, from earlier steps alone, and they count the tokens that the acceptance
realised by index position expects of that size (`tokens_by_size`).

Drafting runs row by row, so a step takes the drafting of every row that drafted, one forward for all
rows and the overhead. A row runs a bandit: it drafts while its drafted steps emit faster than its plain
steps would (`DraftingGain`), and otherwise probes within what its own skipped steps earned
(`ProbeBudget`). A row alone knows its step's time; in a batch it is charged its drafting, its tree's
building and its share of what the kept nodes added to the forward (shared in proportion to the rows'
kept nodes), against the plain batch step over its rows. Alone, drafters that cost under `CHEAP_DRAFT`
of a plain step (prompt lookup, suffix trees) skip the bandit and draft to the cap every step
(`RowPlan.should_draft` says why); in a batch, where most drafts are cut, every row runs it. Requests
differ, so each row keeps its own record, starting from what earlier rows have shown, weighed as
`REQUEST_PRIOR` drafted steps; the drafting-time forecast, the first probes' allowance and the
acceptance by position are learned from every row. When drafting grows with the budget
(`DrafterCapabilities.drafting_grows_with_budget`) a row's draft is sized before it drafts: the size of
most tokens per second by the acceptance realised at each index position, the drafting time per node
and the forward its nodes add next to the other rows' trees of the last step.

The cut keeps the nodes whose predicted acceptance is highest, so the predictions for the nodes it keeps
run high on average, most at the deep tails where estimates rest on fewer counts; scored as the realised
tokens, a cut that trusts them keeps nodes that do not pay their row's cost. So the cut scales each
node's predicted acceptance by how the kept nodes at its depth have fared (`DepthCalibration`): realised
over predicted acceptance of kept nodes whose parent was accepted, learned from every row's steps.

Every decision reads the proposal and earlier steps only, so rows stay lossless; where the tree is
sampled and verified with its q, the kept nodes do not depend on the drawn tokens at all
(`specframe.terms.tree.draw_order_prefix`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from specframe.decode.acceptance import AcceptanceModel, NodeFeatures
from specframe.decode.drafting import (
    EMA, PROBE_ALLOWANCE, DraftingDecision, DraftingGain, ProbeBudget, tokens_by_size,
)
from specframe.decode.learning import (
    CutRecord, DepthCalibration, DraftingTime, ForwardSpeed, best_size, count_positions,
)
from specframe.decode.planner import CostAtContext, StepPlanner
from specframe.decode.selection import path_probabilities
from specframe.contract.interfaces import BatchBackend
from specframe.terms.cost import CostModel
from specframe.terms.proposal import DraftProposal
from specframe.terms.records import Prediction, VerifyResult
from specframe.terms.tree import TokenTree


class RowPlan:
    """A row's side of the planner, with the interface `RequestRow` calls: whether the row drafts and how
    much (see the module docstring), the cut deferred to `AdaptivePlanner.cut`, then what the row showed:
    which nodes were accepted, and whether its drafting paid."""

    def __init__(self, planner: AdaptivePlanner):
        self.planner = planner
        self.blind = False
        self.record = CutRecord()  # this step's nodes, for learning acceptance (cut by `AdaptivePlanner.cut`)
        probes = copy.copy(planner.probes)  # its probes' budget (the drafting-time fit is shared)
        probes.earned_s = 0.0
        # whether its drafting pays: its drafted steps' speed over its plain steps', from earlier rows' prior
        self.drafting = DraftingDecision(copy.deepcopy(planner.gain), probes)
        self.added_s = 0.0  # its share of what the step's kept nodes added to the forward (the cut's)
        self.added_by_size: np.ndarray | None = None  # what n nodes would add, by the last cut (n = 0..cap)
        self.proposed = 0

    def priced(self, added_s: float, added_by_size: np.ndarray | None) -> None:
        """What the last cut priced for this row: its share of the forward seconds the kept nodes added,
        and, where its draft is sized before drafting, what n nodes would add (None: not priced)."""
        self.added_s = added_s
        if added_by_size is not None:
            self.added_by_size = added_by_size

    @property
    def cost(self) -> CostModel | None:
        return self.planner.cost

    def start_request(self, blind: bool = False) -> None:
        """A new request: its drafter has read none of it, its probes have earned nothing, and what the
        earlier rows have shown of drafting's gain is its prior. The shared record is brought to a prior's
        weight too (`REQUEST_PRIOR` drafted steps), so that what this request shows soon outweighs the
        requests before it for the rows admitted after it."""
        self.blind = blind
        self.planner.gain.start_request()
        self.drafting.start_request()

    def start_step(self, context: int) -> None:
        self.planner.contexts.append(context)
        self.drafting.start_step(context)

    def should_draft(self) -> bool:
        """Draft unless this row's drafted steps have emitted more slowly than its plain steps, where
        drafting is dear (`AdaptivePlanner.expensive`) or the row shares its step with others; then probe
        (`DraftingDecision.decide`) within the row's own budget (a plain step of the row being its share
        of a plain step of the rows). Alone, cheap drafting always goes on: it costs a few per cent of a
        step that its matches can multiply, and a step's timed seconds are too noisy to tell a small
        gain from a small loss. In a batch a row's step is charged as priced, not timed, and the forward
        its nodes would add grows with the rows, so most drafts are cut: drafting that the cut does not
        keep is a loss the bandit sees and stops (docs/explanation/batched-decoding.md)."""
        planner = self.planner
        planner.gain.forget()
        dear = planner.expensive() or not planner.alone
        drafts = self.drafting.decide(dear, PROBE_ALLOWANCE * planner.plain_row_s)
        # the decoder's first probes' allowance: given to the rows that held it when the first asked (two
        # plain row steps each: two plain steps of the rows in all); rows admitted later earn their probes
        planner.probes.allowance_granted |= self.drafting.probes.allowance_granted
        return drafts

    def build_budget(self, room: int) -> int:
        """Nodes the drafter and tree builder may use: the cap, unless the size must be chosen before
        drafting (`AdaptivePlanner.size`): for a blind request (its tree is kept whole), or where drafting
        is dear and grows with the budget (a draft model). Whether to draft at all is `should_draft`'s
        call, so the size is at least 1 and probes keep learning."""
        planner = self.planner
        if self.blind or (planner.per_token_drafting and planner.expensive()):
            return min(planner.size(self.added_by_size), room)
        return min(planner.cap, room)

    def choose(self, proposal: DraftProposal, tree: TokenTree) -> tuple[TokenTree, Prediction | None]:
        self.proposed = len(proposal)
        prunable = not self.blind and tree.origin is not None and len(tree) > 0
        self.record = CutRecord(NodeFeatures.of(proposal, tree.origin, tree.depth) if prunable else None)
        return tree, None  # cut with every row's tree in view: `AdaptivePlanner.cut`

    def observe(self, tree: TokenTree, result: VerifyResult, times: dict[str, float]) -> None:
        """Learn which nodes the target accepted (also those the cut left out, where the step matched the
        target's draws), by index position too, and, where the row drafted, what drafting cost
        (`times["draft"]`) and whether the step emitted faster than a plain one: alone, as the step's
        phases (`times`) timed it; in a batch, charged as the module docstring says."""
        planner = self.planner
        if self.record.predicted is not None:
            planner.calibration.add(self.record.predicted, tree, result.path)
        self.record.learn(planner.acceptance, tree, result, planner.matches_draws)
        count_positions(planner.position_hits, tree, result)
        plain = max(planner.plain_row_s, 1e-12)
        decision = self.drafting
        drafting = times.get("draft", 0.0) if decision.drafted else 0.0
        spent = drafting + (times.get("tree", 0.0) if decision.drafted else 0.0)  # drafting and its tree
        if decision.drafted:
            planner.drafting_time.add(drafting, self.proposed)
        probing = decision.probing
        if planner.alone:  # the step as timed
            seconds = sum(s for phase, s in times.items() if phase != "draft") + drafting
        elif decision.drafted:  # a plain row step, its drafting and tree, its share of what its nodes added
            seconds = plain + spent + self.added_s
        else:
            seconds = plain
        decision.record(result.accepted + 1, seconds, plain, spent, gains=(planner.gain,))
        if probing:
            planner.probes.rest_s = decision.probes.rest_s
        self.proposed, self.added_s = 0, 0.0


class AdaptivePlanner(CostAtContext, StepPlanner):
    """Sizes the trees of a step's rows together, one row or many (see the module docstring); `cap` bounds
    each row's tree. Made once per decoder and kept: what it learns serves every later request."""

    def __init__(self, cost: CostModel, cap: int, acceptance: AcceptanceModel | None = None,
                 matches_draws: bool = False, learn_speed: bool = True,
                 drafting_grows_with_budget: bool = False):
        super().__init__(cost)
        self.cap = cap
        self.acceptance = acceptance or AcceptanceModel()
        self.matches_draws = matches_draws
        self.learn_speed = learn_speed
        self.per_token_drafting = drafting_grows_with_budget  # dear drafting: size each row's draft first
        # [accepted, tried] by index position in the scored tree, over every row
        self.position_hits = np.zeros((2, cap))
        # a row's drafting seconds per drafted row step and per proposed node, over every row
        self.drafting_time = DraftingTime()
        self.gain = DraftingGain()  # every row's drafted steps, each row step aging it: a new row's prior
        self.probes = ProbeBudget()  # what every row's budget shares: the drafting-time fit, the allowance
        self.speed = ForwardSpeed(cap + 1)  # realised forward over the calibrated one, by query rows
        self.overhead_s = 0.0  # a batch step's seconds besides the forward, running mean
        self.rest_s = 0.0  # the same besides the rows' drafting too
        self.plain_row_s = cost.step_seconds(0, 0)  # a plain batch step over its rows, as of the last cut
        self.contexts: list[int] = []  # this step's rows' contexts
        self.alone = True  # whether the last cut's step had one row
        self._calibrated_s = 0.0  # the calibrated forward of the step's chosen rows
        self._rows = 0  # the query rows of the step's chosen forwards
        self.calibration = DepthCalibration()  # realised over predicted acceptance of kept nodes, by depth

    def row(self) -> RowPlan:
        return RowPlan(self)

    def cut(self, trees: dict[int, TokenTree], plans: dict[int, RowPlan],
            batch: BatchBackend) -> dict[int, tuple[TokenTree, Prediction]]:
        """Every row's kept subtree and its prediction (its expected tokens; the step's seconds), the
        forward priced as `batch` runs it (`BatchBackend.forward_rows`)."""
        if self.contexts:
            self.start_step(int(np.mean(self.contexts)))
            self.contexts.clear()
        self.alone = len(trees) == 1
        whole = {key: len(tree) if plans[key].record.features is None else 0 for key, tree in trees.items()}
        owners, nodes, probs, depths = self._candidates(trees, plans)
        order = np.lexsort((nodes, -probs))  # best first; parents first (lower index, P at least the child's)
        expected = self._whole_tokens(whole)
        base = len(trees) + sum(expected.values()) - len(expected)
        tokens = base + np.concatenate([[0.0], np.cumsum(probs[order])])
        calibrated, rows, tokens = self._price_prefixes(order, owners, depths, whole, tokens, batch)
        chosen = [order[:k] for k in range(len(tokens))]
        if not self.alone:  # every row's n likeliest nodes: beside a deep chain on one row, others' are free
            even = self._even_sets(order, owners, whole, batch)
            chosen += [kept for kept, _, _ in even]
            tokens = np.concatenate([tokens, [base + probs[kept].sum() for kept, _, _ in even]])
            calibrated = np.concatenate([calibrated, [c for _, c, _ in even]])
            rows = np.concatenate([rows, [r for _, _, r in even]]).astype(np.int64)
        seconds = self.speed.factor(rows) * calibrated + self.overhead_s
        best = int(np.argmax(tokens / np.maximum(seconds, 1e-12)))
        self._calibrated_s, self._rows = float(calibrated[best]), int(rows[best])
        chosen = chosen[best]
        out = {}
        for key, tree in trees.items():
            if plans[key].record.features is None:
                out[key] = (tree, Prediction(expected.get(key, 1.0), float(seconds[best])))
                continue
            mine = chosen[owners[chosen] == key]
            tree = plans[key].record.cut(tree, np.sort(nodes[mine]).astype(np.int64))
            whole[key] = len(tree)
            out[key] = (tree, Prediction(1.0 + float(probs[mine].sum()), float(seconds[best])))
        self._price_rows(whole, plans, batch)
        return out

    def _price_prefixes(self, order: np.ndarray, owners: np.ndarray, depths: np.ndarray,
                        whole: dict[int, int], tokens: np.ndarray,
                        batch: BatchBackend) -> tuple[np.ndarray, ...]:
        """The calibrated seconds and query rows of the forwards `batch` runs with the k likeliest nodes
        kept (k = 0, 1, ...: `order`), and `tokens` for those k, up to the largest k whose forward is
        trusted (`ForwardSpeed.trusted`; a cost given as exact: every k). Alone, the kept tree's depth
        prices it (a chain can cost less than a flat tree of its size)."""
        deepest = np.concatenate([[0], np.maximum.accumulate(depths[order])]) if self.alone else None
        sizes = dict(whole)
        calibrated, rows = np.empty(len(order) + 1), np.empty(len(order) + 1, np.int64)
        for k in range(len(order) + 1):
            if k:
                sizes[int(owners[order[k - 1]])] += 1
            depth = int(deepest[k]) if deepest is not None else None
            calibrated[k], rows[k] = self._calibrated(batch.forward_rows(sizes), depth)
            if k and not self._trusted(int(rows[k])):
                return calibrated[:k], rows[:k], tokens[:k]
        return calibrated, rows, tokens

    def _trusted(self, rows: int) -> bool:
        """Whether a forward of `rows` query rows may be chosen: near enough to the forwards timed
        (`ForwardSpeed.trusted`), or any, where the cost was given as exact (the speed is not learned)."""
        return not self.learn_speed or self.speed.trusted(rows)

    def _whole_tokens(self, whole: dict[int, int]) -> dict[int, float]:
        """The expected tokens of each row whose tree of `whole[row]` nodes is kept whole (a sampled tree
        verified with its q), by the acceptance realised at each index position (`tokens_by_size`)."""
        if not any(whole.values()):
            return {}
        by_size = tokens_by_size(self.position_hits)
        return {key: float(by_size[min(n, self.cap)]) for key, n in whole.items() if n}

    def _even_sets(self, order: np.ndarray, owners: np.ndarray, whole: dict[int, int],
                   batch: BatchBackend) -> list[tuple[np.ndarray, float, int]]:
        """For n = 1 .. cap, every row's n likeliest nodes (all of a row's where it has fewer): which
        candidates they are, and the calibrated seconds and query rows of the forwards `batch` runs for
        them (trusted ones only). The likeliest nodes over all rows (the prefixes) miss these where a
        backend pads every row to the widest tree (`kv`): there a deep chain on one row makes nodes on
        the others free, and a prefix that holds the chain holds few of them."""
        rank = np.empty(len(order), np.int64)  # a node's place among its own row's, best first
        for key in np.unique(owners):
            mine = order[owners[order] == key]
            rank[mine] = np.arange(len(mine))
        sets = []
        for n in range(1, min(self.cap, int(rank.max(initial=-1)) + 1) + 1):
            kept = np.flatnonzero(rank < n)
            sizes = dict(whole)
            for key, count in zip(*np.unique(owners[kept], return_counts=True)):
                sizes[int(key)] += int(count)
            calibrated, rows = self._calibrated(batch.forward_rows(sizes))
            if not self._trusted(rows):
                break
            sets.append((kept, calibrated, rows))
        return sets

    def _candidates(self, trees: dict[int, TokenTree], plans: dict[int, RowPlan]) -> tuple[np.ndarray, ...]:
        """The nodes the cut may keep or drop, over every row whose tree may be pruned: each one's row,
        index in its tree, predicted path probability P (`DepthCalibration`-scaled) and depth."""
        owners, nodes, probs, depths = [], [], [], []
        for key, tree in trees.items():
            record = plans[key].record
            if record.features is not None:
                owners.append(np.full(len(tree), key, np.int64))
                nodes.append(np.arange(len(tree)))
                depths.append(tree.depth)
                predicted = self.calibration.scaled(record.predict(self.acceptance), tree.depth)
                probs.append(path_probabilities(tree.parents, predicted))
        if not owners:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        return tuple(np.concatenate(x) for x in (owners, nodes, probs, depths))

    def expensive(self) -> bool:
        """Whether a row's drafting costs over `CHEAP_DRAFT` of a plain step of one sequence: a drafter
        cheap alone (prompt lookup, suffix trees) drafts to the cap on every step of a batch too."""
        return self.drafting_time.dear(self.cost.step_seconds(0, 0))

    def size(self, added_by_size: np.ndarray | None) -> int:
        """A dear per-token drafter's budget for a row, from earlier steps: the size n >= 1 of most tokens
        per second, the tokens by the acceptance realised at each index position (`tokens_by_size`), the
        seconds a plain row step's plus n nodes' drafting and the forward seconds they add
        (`added_by_size`, priced at the last cut; None, for a row not cut yet: as if scored alone)."""
        tokens = tokens_by_size(self.position_hits)  # (cap + 1,)
        sizes = np.arange(self.cap + 1)
        if added_by_size is None:
            alone = self._forward_s([[n + 1] for n in sizes])
            added_by_size = alone - alone[0]
        return best_size(tokens, self.plain_row_s + sizes * self.drafting_time.node_s + added_by_size)

    def _price_rows(self, kept: dict[int, int], plans: dict[int, RowPlan], batch: BatchBackend) -> None:
        """What the rows' drafting decisions read from this step, its trees cut to `kept` nodes: a plain
        step of a row (the plain batch step's seconds over its rows); each row's share of the forward
        seconds the kept nodes added, in proportion to its kept nodes (padded, one row's nodes can cost
        nothing next to another's: every row counting only its own margin, all would draft where together
        they do not pay); and, where drafts are sized before drafting, what n nodes of a row would add
        next to the other rows' trees, for the row's next size."""
        plain, full = self._forward_s([batch.forward_rows(dict.fromkeys(kept, 0)), batch.forward_rows(kept)])
        self.plain_row_s = (plain + self.rest_s) / len(kept)
        nodes = sum(kept.values())
        sized = self.per_token_drafting and self.expensive()
        for key, plan in plans.items():
            by_size = None
            if sized:
                by_size = self._forward_s([batch.forward_rows({**kept, key: n}) for n in range(self.cap + 1)])
                by_size = by_size - by_size[0]
            plan.priced(max(full - plain, 0.0) * kept[key] / nodes if nodes else 0.0, by_size)

    def _calibrated(self, forwards: list[int], depth: int | None = None) -> tuple[float, int]:
        """The calibrated seconds of forwards of these query rows (each costing what a tree of one node
        fewer costs alone, flat, or `depth` deep where given), and their rows in all."""
        if depth is not None and len(forwards) == 1:
            return self.cost.step_seconds(forwards[0] - 1, depth), forwards[0]
        return sum(self.cost.step_seconds(n - 1, 1) for n in forwards), sum(forwards)

    def _forward_s(self, steps: list[list[int]]) -> np.ndarray:
        """The seconds of each step's forwards (query rows of each), at the speed learned for their rows."""
        calibrated, rows = np.array([self._calibrated(forwards) for forwards in steps]).T
        return self.speed.factor(rows) * calibrated

    def observe_step(self, forward_s: float, step_s: float, drafting_s: float) -> None:
        """Learn the machine's speed at batch shapes and the step's overhead from one batch step whose rows
        drafted for `drafting_s` seconds in all."""
        if self.learn_speed and self._calibrated_s > 0:
            self.speed.add(self._rows, forward_s / self._calibrated_s)
        self.overhead_s += EMA * (max(step_s - forward_s, 0.0) - self.overhead_s)
        self.rest_s += EMA * (max(step_s - forward_s - drafting_s, 0.0) - self.rest_s)


def make_adaptive_planner(pipeline, cap: int, cost: CostModel | None = None,
                          acceptance_file: Path | None = None, progress: bool = True,
                          phase_timing: bool = True) -> AdaptivePlanner:
    """An `AdaptivePlanner` for `pipeline` with `cost`, by default the backend's measured cost
    (calibrated on first use and stored, the pipeline's backend then rebuilt with it:
    `specframe.plugging.pipeline.calibrate_pipeline`), and the acceptance counts stored in
    `acceptance_file` when given (a missing file, or one in another version's format, starts afresh; a
    file specframe did not write is refused rather than overwritten). The stored calibration is scaled
    to the speed that real steps show when the decoder times its phases apart (`phase_timing`: without
    it, an accelerator's forward phase holds only launch time); a `cost` passed in is taken as given
    (tests and simulations state costs in their own units).

    The planner serves requests of any sampling: whether one is planned blind is `plans_blind`'s call,
    made for each request."""
    from specframe.plugging.pipeline import calibrate_pipeline

    d, v = (c.capabilities for c in (pipeline.drafter, pipeline.verifier))
    measured = cost is None and phase_timing
    cost = cost or calibrate_pipeline(pipeline, progress=progress)
    acceptance = AcceptanceModel.load(acceptance_file) if acceptance_file is not None else None
    return AdaptivePlanner(cost, cap, acceptance, drafting_grows_with_budget=d.drafting_grows_with_budget,
                           learn_speed=measured, matches_draws=v.matches_draws)
