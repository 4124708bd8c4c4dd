"""Issue 6 measurements: tau and speedup of S4C (continuous and static trees), draft-model layers:N and
pld against plain decoding, in one run per suite, plus each drafter's extra memory and S4C's r.

    .venv/bin/python benchmarks/s4c_measure.py --humaneval 20 --spec-bench 10 --max-new-tokens 128

Records, tables and plots go under `--out` (default results/s4c); rerunning resumes from the records.
Extra memory = the drafter's own parameters (float32, as run) plus, for draft-model, its KV cache at the
longest context of the run; r = speedup / extra GB (undefined for drafters that add nothing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specframe
from specframe.bench.harness import run_benchmark
from specframe.bench.methods import parse_method
from specframe.bench.report import method_stats
from specframe.registry import get_registry

METHODS = [
    "s4c+static(preset=continuous, width=1)@3",  # the vertical chain alone: one token per head
    "s4c+static(preset=continuous)@9",  # S4C's continuous tree: top-1 chain, 3 alternatives per depth
    "s4c(widths=(1, 3, 6), topk=3)+static(preset=cartesian, widths=(3, 2, 2))@21",
    "draft-model",  # preset: the first 8 layers, 4 tokens. SmolLM2's early exits agree rarely with its
    "draft-model(layers=27, num_tokens=3)+chain@3",  # last layer (12: 6%, 20: 12%, 27: 45% top-1)
    "pld",
]


def extra_bytes(target: specframe.Target, method: str, context: int) -> int:
    """Memory a method's drafter adds to the target: its parameters and, for draft-model, its KV cache."""
    spec = parse_method(method, get_registry()).drafter  # a preset or a spec
    drafter = get_registry().get(specframe.ComponentKind.DRAFTER, spec.name)(target, **spec.options)
    params = getattr(drafter, "extra_parameters", 0) * 4  # float32
    if spec.name != "draft-model":
        return params
    config = drafter.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4 * context
    return params + kv


def complete_prompt_stats(path: Path, methods: list[str], turns: int = 1) -> dict[str, dict] | None:
    """Stats per method over the prompts every method (and the baseline) finished, from a records file,
    counting the first `turns` turns of each question."""
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r["turn"] < turns]
    done: dict[str, set[str]] = {}
    for r in records:
        done.setdefault(r["qid"], set()).add(r["method"])
    complete = {q for q, ms in done.items() if ms >= {"baseline", *methods}}
    if not complete:
        return None
    keep = [r for r in records if r["qid"] in complete]
    base = {(r["qid"], r["turn"], r["repeat"]): r for r in keep if r["method"] == "baseline"}
    out = {}
    for method in methods:
        mine = [r for r in keep if r["method"] == method]
        out[method] = method_stats(mine, base) | {"categories": sorted({r["category"] for r in mine})}
    return out if complete else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--humaneval", type=int, default=20, help="first N HumanEval problems (0 = skip)")
    parser.add_argument("--spec-bench", type=int, default=10,
                        help="questions per Spec-Bench category (0 = skip)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(METHODS), help="';'-separated pipeline specs")
    parser.add_argument("--out", type=Path, default=Path("results/s4c"))
    parser.add_argument("--turns", type=int, default=1, help="turns per question to run and count")
    parser.add_argument("--summary-only", action="store_true",
                        help="summarize the records already under --out (e.g. of an interrupted run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(";") if ";" in args.methods else METHODS
    target = specframe.load_target("smollm2-135m")
    for suite, limit in (("humaneval", args.humaneval), ("spec-bench", args.spec_bench)):
        if limit and not args.summary_only:
            run_benchmark(
                target, suite, methods, args.out / suite, peers="none", limit=limit, repeats=1,
                max_new_tokens=args.max_new_tokens, max_turns=args.turns, plots=False,
                command=f"python benchmarks/s4c_measure.py --humaneval {args.humaneval} --spec-bench "
                        f"{args.spec_bench} --max-new-tokens {args.max_new_tokens} --threads {args.threads}")
    context = 2048  # an upper bound on prompt + answer for the KV-cache share of draft-model
    memory = {m: extra_bytes(target, m, context) for m in methods}
    rows = ["| suite | method | tau | speedup | speedup excl. prefill | extra MB | r = speedup / extra GB |",
            "|---|---|---|---|---|---|---|"]
    summary = {}
    for suite in ("humaneval", "spec-bench"):
        overall = complete_prompt_stats(args.out / suite / "records.jsonl", methods, args.turns)
        for method in methods if overall else []:
            stats = overall[method]
            speed, mb = stats["speedup"]["mean"], memory[method] / 2**20
            decode = stats["speedup_excl_prefill"]["mean"]
            r = speed / (memory[method] / 2**30) if memory[method] else None
            summary[f"{suite}/{method}"] = {"tau": stats["tau"], "speedup": speed,
                                            "speedup_excl_prefill": decode,
                                            "extra_bytes": memory[method], "r": r, "prompts": stats["turns"],
                                            "categories": stats["categories"],
                                            "time_per_step_ms": stats["time_per_step_ms"]}
            rows.append(f"| {suite} | `{method}` | {stats['tau']:.2f} | {speed:.2f} | {decode:.2f} "
                        f"| {mb:.1f} | {'-' if r is None else f'{r:.1f}'} |")
    text = "\n".join(rows) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
