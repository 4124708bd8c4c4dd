"""Plain decoding through specframe against transformers' own `generate`, step for step.

Both decode the same prompt greedily in one process, in two threads that take turns after every step
(specframe's `on_step` hook, transformers' streamer), so that each pair of steps sees the same load of a
shared machine; a step is timed from the moment its side gets the turn to the end of its step. Neither
side runs in the main thread (whose allocator arena differs from a worker's: placed there, either side
measured about 0.6 % faster), and the side that starts alternates from prompt to prompt. Each prompt's
ratio is the median over its steps of specframe's step time over the paired `generate` step's; the
outputs must be equal token for token. Prints, per prompt and over all, the median step of each side
(and how much of it the model's forward took) and specframe's speed relative to `generate`.

    OMP_NUM_THREADS=1 python benchmarks/plain_vs_generate.py --suite humaneval --prompts 8
    OMP_NUM_THREADS=1 python benchmarks/plain_vs_generate.py --backend "kv(min_rows=4)"  # padded steps
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

import specframe
from specframe.support.prompt_suites import encode_turn, load_suite

SIDES = ("specframe", "generate")


class Turns:
    """Two sides taking turns: `mark(side)` ends the side's step, hands the turn over and waits for it."""

    def __init__(self, forward_s: threading.local):
        self.forward_s = forward_s  # per thread: seconds spent in the model's forward so far
        self.turn = {side: threading.Semaphore(0) for side in SIDES}
        self.done = {side: False for side in SIDES}
        self.steps: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}  # (step, forward) s
        self.start: dict[str, tuple[float, float]] = {}

    def begin(self, side: str) -> None:
        self.start[side] = (time.perf_counter(), getattr(self.forward_s, "seconds", 0.0))

    def mark(self, side: str) -> None:
        if side in self.start:
            began, forward = self.start[side]
            self.steps[side].append((time.perf_counter() - began,
                                     getattr(self.forward_s, "seconds", 0.0) - forward))
        other = SIDES[1 - SIDES.index(side)]
        if not self.done[other]:
            self.turn[other].release()
            self.turn[side].acquire()
        self.begin(side)

    def finish(self, side: str) -> None:
        self.done[side] = True
        self.turn[SIDES[1 - SIDES.index(side)]].release()


class StepHook:
    """The specframe side's end of a step (`on_step`), for the turns of the prompt being decoded."""

    turns: Turns | None = None

    @specframe.hookimpl
    def on_step(self, event) -> None:
        if self.turns is not None:
            self.turns.mark("specframe")


class Streamer:
    """The `generate` side's end of a step: transformers calls `put` with the prompt, then every step."""

    def __init__(self, turns: Turns):
        self.turns = turns

    def put(self, value) -> None:
        self.turns.mark("generate")

    def end(self) -> None:
        pass


def pair(target, decoder, hook: StepHook, forward_s, prompt: list[int], new_tokens: int,
         first: str) -> dict[str, list[tuple[float, float]]]:
    """Decode `prompt` on both sides in turns, `first` starting; each side's (step, forward) seconds of
    its steps after the first (the prefill's)."""
    turns, out = Turns(forward_s), {}
    hook.turns = turns
    eos = sorted(target.eos_token_ids)

    def specframe_side():
        turns.begin("specframe")
        out["specframe"] = decoder.generate(prompt, max_new_tokens=new_tokens).tokens
        turns.finish("specframe")

    @torch.inference_mode()
    def generate_side():
        ids = torch.tensor([prompt])  # (1, P)
        tokens = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                       do_sample=False, streamer=Streamer(turns),
                                       pad_token_id=eos[0] if eos else None)
        out["generate"] = tokens[0, len(prompt):].tolist()
        turns.finish("generate")

    bodies = {"specframe": specframe_side, "generate": generate_side}

    def side(name):
        turns.turn[name].acquire()
        bodies[name]()

    threads = [threading.Thread(target=side, args=(name,)) for name in SIDES]
    for thread in threads:
        thread.start()
    turns.turn[first].release()
    for thread in threads:
        thread.join()
    hook.turns = None
    if out["specframe"] != out["generate"]:
        raise SystemExit("plain decoding through specframe and transformers' generate gave different tokens")
    return {name: turns.steps[name][1:] for name in SIDES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="kv", help="the backend of plain decoding, e.g. kv(min_rows=4)")
    parser.add_argument("--suite", default="humaneval", help="humaneval, spec-bench or mt-bench")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = specframe.load_target(args.model, device="cpu")
    forward_s, model_forward = threading.local(), type(target.model).forward

    def timed_forward(model, *a, **k):
        start = time.perf_counter()
        try:
            return model_forward(model, *a, **k)
        finally:
            forward_s.seconds = getattr(forward_s, "seconds", 0.0) + time.perf_counter() - start

    type(target.model).forward = timed_forward
    hook = StepHook()
    registry = specframe.get_registry()
    registry.register_plugin(hook, name="plain-vs-generate-steps")
    decoder = specframe.SpeculativeDecoder.from_names(target, "none", "chain", "greedy", args.backend,
                                                      budget=1, registry=registry)
    per_suite = None if args.suite == "humaneval" else 1  # one question per category, round-robin
    prompts = load_suite(args.suite, per_suite)[:args.prompts]
    pair(target, decoder, hook, forward_s, encode_turn(target.tokenizer, prompts[0], 0, [])[:40], 8,
         "generate")  # warm-up: kernels, caches, allocator
    print(f"{args.model}, plain `{args.backend}` (min_rows {decoder.pipeline.backend.min_rows}) against "
          f"`generate`, {args.threads} thread(s), {args.max_new_tokens} new tokens, wall clock\n\n"
          "| prompt | steps | specframe ms (forward) | generate ms (forward) | specframe speed / generate |\n"
          "|---|---|---|---|---|")
    ratios, medians = [], {name: [] for name in SIDES}
    for index, prompt in enumerate(prompts):
        steps = pair(target, decoder, hook, forward_s, encode_turn(target.tokenizer, prompt, 0, []),
                     args.max_new_tokens, SIDES[index % 2])
        n = min(len(steps[name]) for name in SIDES)
        ratio = statistics.median(steps["generate"][i][0] / steps["specframe"][i][0] for i in range(n))
        ratios.append(ratio)
        cells = []
        for name in SIDES:
            step, forward = (statistics.median(s[k] for s in steps[name]) * 1e3 for k in (0, 1))
            medians[name].append(step)
            cells.append(f"{step:.2f} ({forward:.2f})")
        print(f"| {prompt.qid} | {n} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
    print(f"\nmedian step: specframe {statistics.median(medians['specframe']):.2f} ms, generate "
          f"{statistics.median(medians['generate']):.2f} ms; specframe speed / generate, median over "
          f"prompts: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
