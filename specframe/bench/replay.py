"""Replay recorded outputs through a drafter: tau and modelled speed in seconds, without the target.

When the verifier emits the target's own tokens whatever the tree (greedy, and `sample-match` with a
seeded sampler: one uniform per emitted token), a step accepts exactly the longest tree path that
matches the recorded continuation. So a run of `specframe bench` (its `records.jsonl`) holds all a
model-free drafter needs to be measured again, under other options, in seconds instead of an hour: the
drafter proposes from the recorded context, the real tree builder and planner (`auto` with the stored
calibration, or a fixed budget) choose the tree, and the recorded tokens say what was accepted. Each
turn runs through the decode loop itself (`SpeculativeDecoder`), with the recording in place of the
target's backend and verifier (`specframe.bench.playback`).

What is modelled rather than run: the forward pass (its time is the calibrated step cost of the tree
size and depth at the step's context, as is plain decoding's) and the rest of a step (verify, commit,
the loop: not counted, as the planner's overhead estimate then stays 0). Drafting runs for real and its
time is counted. Drafters that need the target's hidden states (`s4c`) get them from one teacher-forced
forward over each recorded turn: the feature at the token before the root, as the decoder passes it,
equal to the decoding run's up to float rounding (so a near tie between two draft tokens may, rarely, go
the other way). Drafters draft as for a greedy request, and each turn ends with `Drafter.finish`, as a
decoded request does. Turns replay in the order of the suite, repeats after one another, later turns
with the recorded baseline's earlier answers, without the bench's warm-up generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specframe.bench.methods import MethodSpec
from specframe.bench.playback import (
    ModelledTimer, OraclePlanner, Playback, RecordedBackend, RecordedVerifier, accepted_path, oracle_choice,
)
from specframe.bench.store import read_records, read_settings
from specframe.support.prompt_suites import BenchPrompt, encode_turn, load_suite
from specframe.decode.loop import SpeculativeDecoder
from specframe.decode.adaptive import AdaptivePlanner, make_adaptive_planner
from specframe.decode.planner import FixedPlanner
from specframe.terms.budget import parse_budget
from specframe.plugging.pipeline import Pipeline, assemble
from specframe.plugging.registry import PluginRegistry
from specframe.plugging.models import model_recipes
from specframe.runtime.load import load_target
from specframe.terms.target import Target
from specframe.terms.cost import CostModel
from specframe.terms.errors import ConfigurationError

__all__ = ["RecordedRun", "ReplayStats", "Turn", "accepted_path", "copy_bound", "open_run", "oracle_choice",
           "recorded_turns", "replay", "teacher_forced_features"]

@dataclass
class Turn:
    """One recorded generation: the prompt's ids and the tokens the target emitted after it."""

    qid: str
    turn: int
    repeat: int
    prompt_ids: list[int]
    tokens: list[int]


@dataclass
class ReplayStats:
    """Totals over a replay; `modelled_s` is calibrated forward time plus real drafting time."""

    tokens: int = 0
    steps: int = 0
    nodes: int = 0
    modelled_s: float = 0.0
    draft_s: float = 0.0
    plain_s: float = 0.0  # plain decoding's modelled time: a calibrated plain step per token, at its context
    turn_steps: list[int] = field(default_factory=list)  # steps each turn took
    turn_seconds: list[tuple[float, float]] = field(default_factory=list)  # (plain, modelled) per turn

    def add_turn(self, tokens: int, steps: int, nodes: int, draft_s: float, forward_s: float,
                 plain_s: float) -> None:
        """Count one replayed turn: its tokens, steps, tree nodes and seconds (drafting, modelled forwards,
        plain decoding's)."""
        self.tokens += tokens
        self.steps += steps
        self.nodes += nodes
        self.modelled_s += forward_s + draft_s
        self.draft_s += draft_s
        self.plain_s += plain_s
        self.turn_steps.append(steps)
        self.turn_seconds.append((plain_s, forward_s + draft_s))

    @property
    def by_turn(self) -> list[float]:
        """The modelled speedup of each turn."""
        return [plain / max(modelled, 1e-12) for plain, modelled in self.turn_seconds]

    @property
    def tau(self) -> float:
        return self.tokens / max(self.steps, 1)

    @property
    def speedup(self) -> float:
        """Tokens per modelled second over plain decoding's (one token per plain step)."""
        return self.plain_s / max(self.modelled_s, 1e-12)


@dataclass
class RecordedRun:
    """A `specframe bench --out` directory opened for replay: its settings, the target and suite it ran,
    and the turns one method generated."""

    settings: dict
    target: Target
    suite: list[BenchPrompt]
    turns: list[Turn]


def open_run(run: Path, method: str = "baseline") -> RecordedRun:
    """Open `run` as it was measured: its target and dtype, its suite, torch at its thread count (the
    stored calibration a replay models with is per thread count), and the turns of `method`."""
    settings_path = run / "settings.json"
    if not settings_path.is_file():
        raise ConfigurationError(f"{run} is not a `specframe bench --out` directory: it has no settings.json")
    settings = read_settings(settings_path)
    torch.set_num_threads(settings["threads"])
    target = load_target(settings["model"], dtype=settings.get("dtype", "auto"), recipes=model_recipes)
    suite = load_suite(settings["suite"])
    return RecordedRun(settings, target, suite, recorded_turns(run / "records.jsonl", suite, target.tokenizer,
                                                               method))


def recorded_turns(records: Path, prompts: list[BenchPrompt], tokenizer,
                   method: str = "baseline") -> list[Turn]:
    """The turns `method` generated in `records` (a `records.jsonl`), in suite order, each with the prompt
    ids the bench built for it (later turns from that method's own recorded answers)."""
    rows = {(row["qid"], row["turn"], row["repeat"]): row["tokens"]
            for row in read_records(records) if row["method"] == method}
    if not rows:
        raise ConfigurationError(f"{records} holds no turns of method '{method}'")
    turns = []
    for prompt in prompts:
        repeats = sorted({rep for qid, _, rep in rows if qid == prompt.qid})
        for rep in repeats:
            answers: list[str] = []
            for t in range(len(prompt.turns)):
                tokens = rows.get((prompt.qid, t, rep))
                if tokens is None:
                    break
                turns.append(Turn(prompt.qid, t, rep, encode_turn(tokenizer, prompt, t, answers), tokens))
                answers.append(tokenizer.decode(tokens, skip_special_tokens=True))
    return turns


def replay(target: Target, method: MethodSpec, turns: list[Turn], cost: CostModel | None = None,
           planner_cost: CostModel | None = None, oracle: bool = False) -> ReplayStats:
    """Replay `turns` through `method`'s drafter, tree builder and planner (see the module docstring),
    with the step cost `cost` (default: the stored calibration of the method's backend). The planner
    weighs `planner_cost` (default: `cost`), so a replay can measure what a wrong cost model loses.
    `oracle` replaces the planner's choice by `oracle_choice`: what the drafts could give at best."""
    pipeline = assemble(target, method.drafter, method.tree, method.verifier, method.backend)
    cost = cost or pipeline.backend.calibration.cost  # the stored calibration, handed down at assembly
    if cost is None:
        raise ConfigurationError(f"no stored step cost for {target.name} on this machine: run "
                                 f"`specframe calibrate --model {target.name}` first (same --threads)")
    cap, _ = parse_budget(method.budget)
    playback = Playback(cost, cap if oracle else None)
    decoder = replay_decoder(target, pipeline, method.budget, playback)
    planner = replay_planner(pipeline, method.budget, planner_cost or cost)
    decoder.planner = OraclePlanner(planner, playback) if oracle else planner
    needs_hidden = type(pipeline.drafter).capabilities.needs_hidden_states
    stats = ReplayStats()
    for turn in turns:
        if not turn.tokens:  # nothing was generated: nothing to replay
            stats.add_turn(0, 0, 0, 0.0, 0.0, 0.0)
            continue
        playback.start(turn.tokens, teacher_forced_features(target, turn) if needs_hidden else None)
        result = decoder.generate(turn.prompt_ids, max_new_tokens=len(turn.tokens))
        if result.tokens != turn.tokens:
            raise ConfigurationError(
                f"turn {turn.turn} of '{turn.qid}' (repeat {turn.repeat}) continues past an EOS token of "
                f"{target.name}: the record was not generated by this model")
        m = result.metrics
        stats.add_turn(m.new_tokens, m.steps, sum(m.tree_sizes), m.time["draft"], m.time["forward"],
                       playback.plain_s)
    return stats


def replay_decoder(target: Target, pipeline: Pipeline, budget: int | str,
                   playback: Playback) -> SpeculativeDecoder:
    """The decoder a replay runs: `pipeline`'s drafter and tree builder, the recording as backend and
    verifier, steps timed as modelled, and its own registry (observers of real decoding see no replay)."""
    played = Pipeline(pipeline.drafter, pipeline.tree_builder, RecordedVerifier(playback),
                      RecordedBackend(target, playback))
    return SpeculativeDecoder(target, played, budget=budget, registry=PluginRegistry(), phase_timing=False,
                              step_timer=lambda sync: ModelledTimer(playback))


def replay_planner(pipeline: Pipeline, budget: int | str, cost: CostModel) -> AdaptivePlanner | FixedPlanner:
    """The planner of `pipeline` at `budget`, weighing `cost`."""
    cap, adaptive = parse_budget(budget)
    if not adaptive:
        return FixedPlanner(cap, cost)
    return make_adaptive_planner(pipeline, cap, cost, progress=False)


@torch.inference_mode()
def teacher_forced_features(target: Target, turn: Turn) -> torch.Tensor:
    """(L, H) the target's last hidden state at every position of the turn's prompt and recorded output,
    from one forward: row i is the feature that predicted token i + 1 (`DraftContext.hidden`)."""
    ids = torch.tensor([turn.prompt_ids + turn.tokens], device=target.device)
    out = target.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1][0]


def copy_bound(turns: list[Turn], context: int, cap: int = 16) -> float:
    """Tau of an oracle that copies one path per step from earlier text: at each step, the longest run
    (up to `cap`) of the recorded continuation that occurs somewhere in the text seen so far (earlier
    turns' prompts and outputs, in replay order, and this turn's prompt and output) right after the same
    `context` tokens as the current context ends with. It bounds single-path copying drafters (prompt
    lookup, a suffix drafter without trees) that need `context` tokens of match; trees can exceed it."""
    def encode(tokens) -> str:
        return "".join(f"<{t}>" for t in tokens)

    seen, emitted, steps = "", 0, 0
    for turn in turns:
        history = seen + "|" + encode(turn.prompt_ids)
        position = 0
        while position < len(turn.tokens):
            text = turn.prompt_ids + turn.tokens[:position]
            anchor = text[len(text) - context:] if context else []
            run = 0
            while (position + run < len(turn.tokens) and run < cap
                   and encode([*anchor, *turn.tokens[position:position + run + 1]]) in history):
                run += 1
            step = min(run + 1, len(turn.tokens) - position)
            history += encode(turn.tokens[position:position + step])
            position, emitted, steps = position + step, emitted + step, steps + 1
        seen = history + "|"
    return emitted / max(steps, 1)
