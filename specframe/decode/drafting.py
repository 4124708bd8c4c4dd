"""Whether drafting pays, step by step, where it is dear: the bandit that `AdaptivePlanner` runs for each
row, alone or in a batch.

A plain step's speed is known; a drafted step's is learned from drafted steps (`DraftingGain`). Drafting
goes on while drafted steps emit faster than plain ones; otherwise a step drafts only as a probe, while
the gain's upper bound is above 1 and the request has earned what a probe is expected to lose
(`ProbeBudget`, with the drafting time forecast by `DraftTime`). `DraftingDecision` is that rule for one
request, in the seconds of a plain step of its own: a step alone, or a row's share of a plain batch step.
The reasoning and the numbers: docs/explanation/adaptive-speculation.md.
"""

from __future__ import annotations

import numpy as np

# Drafting under 5 % of a plain step always goes on (prompt lookup, retrieval, suffix trees): stopping it
# would save at most that share, while a copying drafter that is off misses the next long match.
CHEAP_DRAFT = 0.05
# Whether dear drafting pays is a two-armed bandit (`DraftingGain`; the reasoning and the numbers are in
# docs/explanation/adaptive-speculation.md): a plain step's speed is known, a drafted step's is learned
# from drafted steps, each weighing DRAFT_MEMORY as much one step later (the last ~30 steps count).
# Drafting goes on while the gain is above 1 and, as exploration, while its upper bound (OPTIMISM
# standard errors above it) is; skipped steps age the record, so the bound widens and probes come back.
DRAFT_MEMORY = 0.97
OPTIMISM = 2.0
GAIN_SD_FLOOR = 0.3  # the per-step spread assumed at least: a few cold steps alike do not make it 0
OPTIMISTIC_GAIN, OPTIMISTIC_STEPS = 2.0, 4.0  # the record starts with 4 steps at twice plain speed
# Requests differ more than the steps of one request do (S4C's heads pay on code and lose on RAG), so
# a new request starts from what earlier requests showed weighed as at most REQUEST_PRIOR drafted steps: a
# prior that the request's own steps outweigh within a few drafted steps. The weight is the shrinkage
# ratio of the two spreads: tokens accepted per drafted step vary by about 0.45 from step to step and by
# 0.16 (Spec-Bench's first turns) to 0.21 (HumanEval) from request to request (S4C, replayed), and
# (0.45 / 0.16)^2 = 8. At full weight (~30 steps), a 47-step answer that followed paying ones drafted on
# every step to accept 3 tokens, and lost less with the prior (replayed). A harder rule, stopping a
# request's drafting once its own drafted steps lost half a plain step, also stopped paying requests after
# an unlucky start: slower on Spec-Bench with S4C, for no better worst turn
# (docs/explanation/adaptive-speculation.md, "Whether to draft at all, and how much").
REQUEST_PRIOR = 8.0
# A drafted step counts at most twice the time of a typical one (or of a plain step, whichever is more):
# the first draft of a decoder compiles its kernels (S4C's heads: a few plain steps). The probe
# budget below counts every step in full.
OUTLIER = 2.0
# Exploring while the mean gain is below 1 may lose at most 1 % of the time of a request's skipped steps
# (drafting plus the tree's forward, over plain steps for the same tokens), and a probe starts only when
# the request has earned what it is expected to lose (`ProbeBudget`): a draft model's probe first reads
# every token since its last run, mid-request a few, at a new request the whole prompt (several plain steps'
# time on long Spec-Bench prompts), so one probe alone may cost a short request a few per cent.
PROBE_SHARE = 0.01
PROBE_ALLOWANCE = 2.0  # plain steps a decoder's first probes may lose before any step was skipped
EMA = 0.1  # weight of the newest step in the running means


class DraftingGain:
    """How much faster drafted steps emitted than plain steps would have, discounted by age: the mean
    (a ratio of sums: emitted tokens over seconds spent, in plain steps) and an upper bound on it.

    The record starts with `OPTIMISTIC_STEPS` pseudo-steps at `OPTIMISTIC_GAIN`, aged like the rest, so
    a decoder's first drafted steps do not turn drafting off on their own: they are cold (the drafter's
    and the target's tree-shaped kernels compile on first use: S4C's first four drafted steps took
    1.5-4 plain steps each) and taken while acceptance and sizing are still being learned (a draft
    model's first step drafts to the cap). A drafter that never pays then drafts ~20 steps before the
    record says so, once per decoder."""

    def __init__(self, memory: float = DRAFT_MEMORY):
        self.memory = memory
        self.optimism = OPTIMISTIC_STEPS  # the pseudo-steps at `OPTIMISTIC_GAIN`, discounted
        self.tokens = 0.0  # emitted tokens of drafted steps, discounted
        self.cost = 0.0  # their seconds spent, drafting included, in plain steps, discounted
        self.weight = 0.0  # discounted count of drafted steps
        self.gains = np.zeros(2)  # sums of the per-step gains and of their squares (for the spread)

    def forget(self) -> None:
        """A step passed: every drafted step recorded weighs `memory` as much."""
        self.shrink(self.memory)

    def start_request(self) -> None:
        """A new request: the record, kept at its mean and spread, weighs at most `REQUEST_PRIOR` steps."""
        total = self.weight + self.optimism
        if total > REQUEST_PRIOR:
            self.shrink(REQUEST_PRIOR / total)

    def shrink(self, factor: float) -> None:
        """Weigh everything recorded `factor` as much (the mean and the spread stay)."""
        self.optimism *= factor
        self.tokens *= factor
        self.cost *= factor
        self.weight *= factor
        self.gains *= factor

    def add(self, tokens: int, cost: float) -> None:
        """A drafted step that emitted `tokens` in `cost` plain steps' time (clipped: `OUTLIER`)."""
        typical = self.cost / self.weight if self.weight > 0 else 1.0
        cost = min(cost, OUTLIER * max(typical, 1.0))
        gain = tokens / max(cost, 1e-9)
        self.tokens += tokens
        self.cost += cost
        self.weight += 1.0
        self.gains += (gain, gain * gain)

    @property
    def mean(self) -> float:
        """Drafted steps' speed over plain steps'."""
        tokens = self.tokens + OPTIMISTIC_GAIN * self.optimism
        return tokens / max(self.cost + self.optimism, 1e-12)

    def upper(self) -> float:
        """The mean plus `OPTIMISM` standard errors of the per-step gains."""
        if self.weight <= 0:
            return np.inf
        average = self.gains[0] / self.weight
        spread = max(np.sqrt(max(self.gains[1] / self.weight - average ** 2, 0.0)), GAIN_SD_FLOOR)
        return self.mean + OPTIMISM * spread / np.sqrt(self.weight)


class DecayedLine:
    """y = a + b * x by least squares over the points added, each weighing `memory` as much one point
    later. The slope is clipped below at `min_slope` (None: not clipped) and the line's values below at
    `floor` (a noisy fit may dip below what can be); before any point the line is `empty` everywhere."""

    def __init__(self, memory: float, min_slope: float | None = None, floor: float = -np.inf,
                 empty: float = 0.0):
        self.memory = memory
        self.min_slope, self.floor, self.empty = min_slope, floor, empty
        self.sums = np.zeros(5)  # weighted sums of 1, x, x^2, y, y x

    def add(self, x: float, y: float) -> None:
        x = float(x)
        self.sums = self.memory * self.sums + (1.0, x, x * x, y, y * x)

    def at(self, x):
        """The line at `x`, a number or an array (then one value per element)."""
        n, sx, sxx, sy, sxy = self.sums
        if n <= 0:
            return self.empty
        spread = n * sxx - sx * sx
        slope = (n * sxy - sx * sy) / spread if spread > 1e-9 * max(n * sxx, 1.0) else 0.0
        if self.min_slope is not None:
            slope = max(slope, self.min_slope)
        return np.maximum((sy - slope * sx) / n + slope * np.asarray(x, float), self.floor)


class DraftTime(DecayedLine):
    """Drafting seconds as a + b * (tokens the drafter has not read yet), least squares over drafted
    steps, each weighing DRAFT_MEMORY as much one drafted step later. S4C's heads cost the same each
    step (b ~ 0); a draft model reads what it has not seen before it drafts (b > 0). Neither b nor the
    forecast goes below 0, and before any drafted step no cost is known (0)."""

    def __init__(self, memory: float = DRAFT_MEMORY):
        super().__init__(memory, min_slope=0.0, floor=0.0, empty=0.0)

    def forecast(self, unread: int) -> float:
        return self.at(unread)


class ProbeBudget:
    """What probes (drafted steps taken while drafting does not pay) may still lose in this request.

    Each skipped step of a request earns `PROBE_SHARE` of its time, and a probe may start only once the
    request has earned what the probe is expected to lose: its drafting time, forecast from the tokens
    the drafter has not read (`DraftTime`), plus the rest of a probe's loss as earlier probes showed it.
    Its real loss is then spent. A request starts with nothing (a debt carries over), except a decoder's
    first probe, which may spend `PROBE_ALLOWANCE` plain steps (cold first drafts can make drafting look
    worse than it is before anything was skipped). So a probe that must first read a long prompt waits
    for a long request, and a short request is not probed at all, rather than losing several per cent
    to one probe."""

    def __init__(self):
        self.earned_s = 0.0  # seconds probes may still lose in this request
        self.allowance_granted = False  # the decoder's first probes' allowance, given when first asked
        self.rest_s = 0.0  # a probe's loss besides drafting (tree forward over the tokens it gained), mean
        self.drafting = DraftTime()

    def start_request(self) -> None:
        self.earned_s = min(self.earned_s, 0.0)

    def affords(self, unread: int, allowance_s: float) -> bool:
        if not self.allowance_granted:
            self.earned_s += allowance_s
            self.allowance_granted = True
        return self.earned_s >= self.drafting.forecast(unread) + self.rest_s

    def drafted(self, unread: int, drafting_s: float) -> None:
        self.drafting.add(unread, drafting_s)

    def skipped(self, step_s: float) -> None:
        self.earned_s += PROBE_SHARE * step_s

    def probed(self, loss_s: float, drafting_s: float) -> None:
        self.earned_s -= loss_s
        self.rest_s += EMA * (loss_s - drafting_s - self.rest_s)


class DraftingDecision:
    """Whether one request's next step drafts, and what its steps showed: the rule of the module docstring
    in the seconds of a plain step of its own, which the caller passes in (a step alone, or a
    row's share of a plain batch step). It also tracks
    what the drafter has read: a probe's drafting time is forecast from the tokens it has not."""

    def __init__(self, gain: DraftingGain | None = None, probes: ProbeBudget | None = None):
        self.gain = gain if gain is not None else DraftingGain()
        self.probes = probes if probes is not None else ProbeBudget()
        self.context = 0  # tokens of this step's context
        self.read = 0  # context of this request's last drafted step: what its drafter has read
        self.drafted = self.probing = False  # this step's decision

    def start_request(self) -> None:
        """A new request: its drafter has read none of it, its probes have earned nothing, and what
        earlier requests showed of drafting's gain is a prior of `REQUEST_PRIOR` drafted steps."""
        self.read = 0
        self.gain.start_request()
        self.probes.start_request()

    def start_step(self, context: int) -> None:
        self.context = context

    def decide(self, dear: bool, allowance_s: float) -> bool:
        """Draft unless drafting is `dear` (over `CHEAP_DRAFT` of a plain step) and drafted steps have
        emitted more slowly than plain ones; then probe while the gain's upper bound is above 1 and the
        request has earned what a probe is expected to lose (`allowance_s`: what a decoder's first probes
        may lose before any step was skipped)."""
        self.gain.forget()
        self.probing = False
        if not dear or self.gain.mean > 1.0:
            self.drafted = True
        else:
            self.probing = self.drafted = (self.gain.upper() > 1.0
                                           and self.probes.affords(self.unread(), allowance_s))
        return self.drafted

    def record(self, tokens: int, seconds: float, plain_s: float, drafting_s: float = 0.0,
               gains: tuple[DraftingGain, ...] = ()) -> None:
        """The step emitted `tokens` in `seconds` (drafting included), where a plain step takes `plain_s`:
        a drafted step adds its gain (also to `gains`, records shared with other requests), a probe spends
        its loss against plain steps for the same tokens, a skipped step earns probes their share."""
        if self.drafted:
            for gain in (self.gain, *gains):
                gain.add(tokens, seconds / plain_s)
            self.probes.drafted(self.unread(), drafting_s)
            self.read = self.context
            if self.probing:
                self.probes.probed(seconds - tokens * plain_s, drafting_s)
        else:
            self.probes.skipped(seconds)
        self.drafted = self.probing = False

    def unread(self) -> int:
        """Tokens of this step's context the drafter has not read (all of them before its first draft)."""
        return max(self.context - self.read, 0)


def tokens_by_size(position_hits: np.ndarray) -> np.ndarray:
    """Expected tokens of a step whose draft has n nodes, for n = 0 .. cap, from the [accepted, tried]
    counts by index position of earlier steps: the chance that more than i were accepted where more than
    i were tried, with a Laplace prior, made non-increasing in i."""
    a, t = position_hits
    rates = np.minimum.accumulate((a + 1.0) / (t + 2.0))
    return 1.0 + np.concatenate([[0.0], np.cumsum(rates)])
