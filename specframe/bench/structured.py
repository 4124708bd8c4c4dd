"""The structured-output suite and its run: constrained plain decoding, constrained speculative methods and
transformers' `generate` with the same llguidance masks as a logits processor, on the same prompts.

The suite (`specframe/support/data/structured.jsonl`, written for this project) holds 33 prompts with their
JSON schemas: facts extracted from a passage, function-call arguments, schema-bound answers. Each method
decodes every prompt greedily under its schema; a row reports the share of valid outputs (parsed and
validated against the schema), the share identical to constrained plain decoding, tokens per second over
the whole suite, tau, and the speed over constrained plain decoding. Every method runs once untimed first.

    python -m specframe.bench.structured --limit 4 --methods "pld+chain@8,forced(then=pld)+chain@8"
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from importlib import resources

from specframe.terms.constraint import Constraint
from specframe.terms.metrics import now
from specframe.terms.target import Target

DEFAULT_METHODS = "pld+chain@8,forced(then=pld)+chain@8,forced(then='pld(matches=4)')+trie@8"


@dataclass(frozen=True)
class StructuredPrompt:
    qid: str
    category: str
    prompt: str
    schema: dict


def load_structured_suite(limit: int | None = None) -> list[StructuredPrompt]:
    """The shipped suite's prompts, at most `limit` per category (in file order)."""
    text = resources.files("specframe.support").joinpath("data", "structured.jsonl").read_text("utf-8")
    prompts, taken = [], {}
    for line in text.splitlines():
        row = json.loads(line)
        if limit is not None and taken.get(row["category"], 0) >= limit:
            continue
        taken[row["category"]] = taken.get(row["category"], 0) + 1
        prompts.append(StructuredPrompt(row["question_id"], row["category"], row["turns"][0], row["schema"]))
    return prompts


def is_valid(text: str, schema: dict) -> bool:
    """Whether `text` is JSON that `schema` accepts."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


@dataclass
class MethodRun:
    """What one method did over the suite."""

    name: str
    tokens: dict[str, list[int]] = field(default_factory=dict)
    valid: int = 0
    seconds: float = 0.0
    steps: int = 0

    def row(self, plain: MethodRun | None) -> dict:
        new = sum(len(t) for t in self.tokens.values())
        same = sum(plain is not None and t == plain.tokens.get(q) for q, t in self.tokens.items())
        speed = new / self.seconds if self.seconds else 0.0
        plain_speed = (sum(len(t) for t in plain.tokens.values()) / plain.seconds) if plain else 0.0
        return {"method": self.name, "valid": self.valid / max(len(self.tokens), 1),
                "identical": same / max(len(self.tokens), 1), "tokens_per_s": speed,
                "tau": new / self.steps if self.steps else None,
                "speedup": speed / plain_speed if plain_speed else None}


def run_method(target: Target, spec: str, prompts: list[StructuredPrompt], constraints: dict[str, Constraint],
               max_new_tokens: int) -> MethodRun:
    """`spec` (`DRAFTER+TREE@BUDGET`, or `transformers`) on every prompt, greedy, after one untimed run."""
    from specframe.decode.loop import SpeculativeDecoder

    decode = transformers_decode if spec == "transformers" else None
    if decode is None:
        pipeline, _, budget = spec.partition("@")
        drafter, _, tree = pipeline.partition("+")
        decoder = SpeculativeDecoder.from_names(target, drafter, tree or "chain", budget=int(budget or 8),
                                                phase_timing=False)

        def decode(target, ids, constraint, limit):
            result = decoder.generate(ids, max_new_tokens=limit, constraint=constraint)
            return result.tokens, result.metrics.steps

    run = MethodRun(spec)
    warm = prompts[0]
    decode(target, encode(target, warm.prompt), constraints[warm.qid], max_new_tokens)
    for prompt in prompts:
        ids = encode(target, prompt.prompt)
        start = now()
        tokens, steps = decode(target, ids, constraints[prompt.qid], max_new_tokens)
        run.seconds += now() - start
        run.steps += steps
        run.tokens[prompt.qid] = tokens
        text = target.tokenizer.decode(tokens, skip_special_tokens=True)
        run.valid += is_valid(text, prompt.schema)
    return run


def encode(target: Target, text: str) -> list[int]:
    return list(target.tokenizer(text, add_special_tokens=False)["input_ids"])


class GuidanceProcessor:
    """A transformers logits processor masking each step's scores by `constraint` after the tokens
    generated so far (one row)."""

    def __init__(self, constraint: Constraint, prompt_length: int):
        self.state, self.prompt_length, self.seen = constraint.start(), prompt_length, prompt_length
        self.complete_at: int | None = None  # new tokens when the constraint was complete with no EOS left

    def __call__(self, input_ids, scores):
        import torch

        if self.complete_at is not None:  # a target without EOS: generate runs on, its tokens are cut
            return scores
        for token in input_ids[0, self.seen:].tolist():
            self.state = self.state.advance(token)
        self.seen = input_ids.shape[1]
        mask = torch.from_numpy(self.state.allowed())
        if not mask.any():
            self.complete_at = self.seen - self.prompt_length
            return scores
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
        allowed[: len(mask)] = mask[: scores.shape[-1]]
        return scores.masked_fill(~allowed, float("-inf"))


def transformers_decode(target: Target, ids: list[int], constraint: Constraint, limit: int):
    """transformers' greedy `generate` with `GuidanceProcessor`: (new tokens, forwards)."""
    import torch
    from transformers import LogitsProcessorList

    processor = GuidanceProcessor(constraint, len(ids))
    with torch.inference_mode():
        prompt = torch.tensor([ids])  # (1, L)
        out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=limit, logits_processor=LogitsProcessorList([processor]),
                                    pad_token_id=min(target.eos_token_ids, default=0))
    tokens = out[0, len(ids):].tolist()
    return tokens[: processor.complete_at], len(tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated DRAFTER+TREE@BUDGET")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target
    from specframe.runtime.structured import constraint_for

    torch.set_num_threads(1)
    target = load_target(args.model, recipes=model_recipes)
    prompts = load_structured_suite(args.limit)
    constraints = {p.qid: constraint_for(target, json_schema=p.schema) for p in prompts}
    peers = [] if args.no_transformers else ["transformers"]
    methods = ["none+chain@1", *split_methods(args.methods), *peers]
    runs = [run_method(target, m, prompts, constraints, args.max_new_tokens) for m in methods]
    print(f"{len(prompts)} prompts, greedy, max {args.max_new_tokens} new tokens, one thread, {args.model}")
    print("| method | valid | identical to plain | tokens/s | tau | speed over plain |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        row = run.row(runs[0])
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        print(f"| `{row['method']}` | {row['valid']:.0%} | {row['identical']:.0%} | "
              f"{row['tokens_per_s']:.1f} | {tau} | {row['speedup']:.2f}x |")


def split_methods(text: str) -> list[str]:
    """Comma-separated method specs, commas inside parentheses kept."""
    out, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += char
    return [m for m in [*out, current.strip()] if m]


if __name__ == "__main__":
    main()
