"""Replay recorded outputs through a drafter: tau and modelled speed in seconds, without the target.

When the verifier emits the target's own tokens whatever the tree (greedy, and `sample-match` with a
seeded sampler: one uniform per emitted token), a step accepts exactly the longest tree path that
matches the recorded continuation. So a run of `specframe bench` (its `records.jsonl`) holds all a
model-free drafter needs to be measured again, under other options, in seconds instead of an hour: the
drafter proposes from the recorded context, the real tree builder and planner (`auto` with the stored
calibration, or a fixed budget) choose the tree, and the recorded tokens say what was accepted.

What is modelled rather than run: the forward pass (its time is the calibrated step cost of the tree
size and depth at the step's context, as is plain decoding's) and the rest of a step (verify, commit,
the loop: not counted, as the planner's overhead estimate then stays 0). Drafting runs for real and its
time is counted. Drafters that need the target's hidden states (`s4c`) get them from one teacher-forced
forward over each recorded turn: the feature at the token before the root, as the decoder passes it,
equal to the decoding run's up to float rounding (so a near tie between two draft tokens may, rarely, go
the other way). Drafters see no sampler (they draft as for a greedy request). Turns replay in the order
of the suite, repeats after one another, later turns with the recorded baseline's earlier answers,
without the bench's warm-up generation.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specframe.decode.calibration import stored_cost
from specframe.decode.planner import SHAPE_LEARNING, AdaptivePlanner, FixedPlanner, parse_budget
from specframe.bench.methods import MethodSpec
from specframe.bench.runner import read_records
from specframe.bench.suites import BenchPrompt, encode_turn, load_suite
from specframe.terms.cost import CostModel
from specframe.terms.errors import ConfigurationError
from specframe.contract.interfaces import BuildContext
from specframe.runtime.load import Target, load_target
from specframe.plugging.pipeline import assemble
from specframe.terms.proposal import DraftContext, DraftProposal
from specframe.terms.records import StepOutcome, VerifyResult
from specframe.terms.tree import TokenTree


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
    settings = json.loads(settings_path.read_text())
    torch.set_num_threads(settings["threads"])
    target = load_target(settings["model"], dtype=settings.get("dtype", "auto"))
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


def accepted_path(tree: TokenTree, future: list[int]) -> list[int]:
    """The longest root path of `tree` whose tokens are a prefix of `future` (node indices)."""
    path, node = [], -1
    children = defaultdict(dict)
    for i, (token, parent) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
        children[parent][token] = i
    while len(path) < len(future) and future[len(path)] in children[node]:
        node = children[node][future[len(path)]]
        path.append(node)
    return path


def oracle_choice(tree: TokenTree, future: list[int], cost: CostModel, cap: int) -> tuple[TokenTree, float]:
    """What a planner that knew the target's next tokens would keep of `tree`: the path the target
    accepts and nothing else, timed as the cheapest tree of up to `cap` nodes that holds it (on CPUs
    where a few rows cost less than one, throwaway nodes can make a step cheaper). (kept tree, seconds)"""
    path = accepted_path(tree, future)
    seconds = min(cost.step_seconds(n, max(len(path), 1) if n else 0)
                  for n in range(len(path), max(cap, len(path)) + 1))
    return (tree.subtree(np.array(path, np.int64)) if path else TokenTree.empty()), seconds


def replay(target: Target, method: MethodSpec, turns: list[Turn], cost: CostModel | None = None,
           planner_cost: CostModel | None = None, oracle: bool = False,
           learn_shape: bool = SHAPE_LEARNING) -> ReplayStats:
    """Replay `turns` through `method`'s drafter, tree builder and planner (see the module docstring),
    with the step cost `cost` (default: the stored calibration of the method's backend). The planner
    weighs `planner_cost` (default: `cost`), so a replay can measure what a wrong cost model loses.
    `oracle` replaces the planner's choice by `oracle_choice`: what the drafts could give at best.
    `learn_shape` False prices every tree size with one learned speed factor (`AdaptivePlanner`)."""
    pipeline = assemble(target, method.drafter, method.tree, method.verifier, method.backend)
    drafter, builder = pipeline.drafter, pipeline.tree_builder
    needs_hidden = type(drafter).capabilities.needs_hidden_states
    cost = cost or stored_cost(pipeline.backend)
    if cost is None:
        raise ConfigurationError(f"no stored step cost for {target.name} on this machine: run "
                                 f"`specframe calibrate --model {target.name}` first (same --threads)")
    cap, adaptive = parse_budget(method.budget)
    grows = type(drafter).capabilities.drafting_grows_with_budget
    believed = planner_cost or cost
    matches = type(pipeline.verifier).capabilities.matches_draws
    planner = (AdaptivePlanner(believed, cap, drafting_grows_with_budget=grows, matches_draws=matches,
                               learn_shape=learn_shape)
               if adaptive else FixedPlanner(cap, believed))
    stats = ReplayStats()
    for turn in turns:
        drafter.reset()
        planner.start_request()
        tokens, emitted_so_far, turn_s, plain_s = np.array(turn.prompt_ids, np.int64), 0, 0.0, 0.0
        features = teacher_forced_features(target, turn) if needs_hidden else None  # (L, H)
        steps_before = stats.steps
        while emitted_so_far < len(turn.tokens):
            room = len(turn.tokens) - emitted_so_far - 1
            start = time.perf_counter()
            planner.start_step(len(tokens))
            drafting = room > 0 and planner.should_draft()  # as the decode loop: decide, then size
            budget = planner.build_budget(room) if drafting else 0
            hidden = features[len(tokens) - 2] if features is not None and emitted_so_far else None
            proposal = (drafter.propose(DraftContext(tokens, len(turn.prompt_ids), budget, hidden))
                        if drafting else DraftProposal.empty())
            draft_s = time.perf_counter() - start
            tree = (builder.build(proposal, BuildContext(budget, planner.cost)) if len(proposal)
                    else TokenTree.empty())
            future = turn.tokens[emitted_so_far:]
            here = cost.at_context(len(tokens))  # what a step costs at this context
            if oracle:
                tree, forward_s = oracle_choice(tree, future, here, cap)
            else:
                tree, _ = planner.choose(proposal, tree)
                forward_s = here.step_seconds(len(tree), int(tree.depth.max()) if len(tree) else 0)
            path = accepted_path(tree, future)
            result = VerifyResult(path, future[len(path)])
            drafter.observe(StepOutcome(proposal, len(tree), future[:len(path)], result.bonus))
            planner.observe(tree, result, {"draft": draft_s, "forward": forward_s})
            emitted = min(len(path) + 1, len(turn.tokens) - emitted_so_far)
            tokens = np.concatenate([tokens, np.asarray(future[:emitted], np.int64)])
            emitted_so_far += emitted
            plain_s += emitted * here.step_seconds(0, 0)  # plain steps for these tokens, about this context
            stats.tokens += emitted
            stats.steps += 1
            stats.nodes += len(tree)
            stats.modelled_s += forward_s + draft_s
            stats.draft_s += draft_s
            turn_s += forward_s + draft_s
        stats.plain_s += plain_s
        stats.turn_steps.append(stats.steps - steps_before)
        stats.turn_seconds.append((plain_s, turn_s))
        finish = getattr(drafter, "finish", None)  # drafters that remember requests (suffix) close them
        if finish is not None:
            finish(turn.prompt_ids, turn.tokens)
    return stats



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
