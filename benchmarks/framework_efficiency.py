"""Framework efficiency at scale: the realised speedup of speculative decoding over its ideal.

A random-weight Llama with the dimensions of Llama-3-8B (or a tiny one, for a CPU smoke run) decodes a
random prompt plainly, then with the synthetic drafter (`specframe/bench/synthetic.py`: it proposes the
plain output, each token kept with probability P, so every depth is accepted with probability P) on a
chain of N nodes. The ideal speedup of a step that emits tau tokens on average is tau * t(1) / t(N), with
t(N) the measured time of a forward over the root and N nodes (`specframe calibrate`'s cost model); the
realised speedup is plain wall time over speculative wall time, measured side by side. Their ratio is
what the framework keeps of the ideal, and the per-phase split says where the rest of the step goes.

    python benchmarks/framework_efficiency.py --dims llama3-8b --device cuda --dtype bfloat16
    python benchmarks/framework_efficiency.py --dims tiny --device cpu      # smoke run, seconds

Writes `efficiency.json` and `efficiency.md` under `--out`. Random weights suffice: the speed of a
forward does not depend on the weights' values, and the synthetic drafter fixes the acceptance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import specframe
from specframe.decode.calibration import calibrate
from specframe.bench.synthetic import SyntheticDrafter
from specframe.runtime.devices import resolve_device, resolve_dtype, synchronize
from specframe.terms.metrics import PHASES

DIMS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                      rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048),
}


def random_llama(dims: str, device: torch.device, dtype: torch.dtype) -> specframe.Target:
    """A Llama with `DIMS[dims]` and random weights, built directly on `device` in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**DIMS[dims], eos_token_id=None, bos_token_id=None, pad_token_id=None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    return specframe.Target(model=model, tokenizer=None, name=f"random-llama-{dims}")


def timed(decoder, prompt: list[int], new_tokens: int) -> tuple[float, object]:
    synchronize(decoder.target.device)
    start = time.perf_counter()
    result = decoder.generate(prompt, max_new_tokens=new_tokens)
    return time.perf_counter() - start, result


def measure(target, prompt: list[int], new_tokens: int, acceptances: list[float], budgets: list[int],
            repeats: int) -> dict:
    plain = specframe.SpeculativeDecoder.from_names(target, "none", budget=1)
    _, reference = timed(plain, prompt, new_tokens)  # also the warm-up
    cost = calibrate(plain.pipeline.backend, sizes=sorted({0, 1, *budgets}), progress=False)
    t1 = cost.step_seconds(0, 0)
    rows = []
    for p in acceptances:
        for n in budgets:
            decoder = specframe.SpeculativeDecoder.from_names(target, "pld", "chain", budget=n)
            drafter = SyntheticDrafter(target, acceptance=p)
            drafter.reference = list(reference.tokens)
            decoder.pipeline.drafter = drafter
            timed(decoder, prompt, new_tokens)  # warm-up
            plain_s, spec_s, results = [], [], []
            for _ in range(repeats):  # interleaved, so drift hits both alike
                plain_s.append(timed(plain, prompt, new_tokens)[0])
                seconds, result = timed(decoder, prompt, new_tokens)
                spec_s.append(seconds)
                results.append(result)
            assert results[-1].tokens == reference.tokens, "synthetic drafts changed the greedy output"
            metrics = results[-1].metrics
            tau = metrics.new_tokens / metrics.steps
            ideal = tau * t1 / cost.step_seconds(n, n)
            realised = statistics.median(plain_s) / statistics.median(spec_s)
            split = {phase: 1000 * metrics.time.get(phase, 0.0) / metrics.steps for phase in PHASES}
            rows.append({"acceptance": p, "budget": n, "tau": tau, "t1_ms": 1000 * t1,
                         "tN_ms": 1000 * cost.step_seconds(n, n), "ideal": ideal, "realised": realised,
                         "efficiency": realised / ideal, "step_ms": split})
    return {"rows": rows, "t1_ms": 1000 * t1}


def report(settings: dict, measured: dict) -> str:
    lines = [f"## Framework efficiency: {settings['model']} on {settings['device']}, {settings['dtype']}",
             "", f"Command: `{settings['command']}`", "",
             "| P | N | tau | t(1) ms | t(N) ms | ideal | realised | realised / ideal | "
             + " | ".join(f"{p} ms" for p in PHASES) + " |",
             "|" + "---|" * (8 + len(PHASES))]
    for r in measured["rows"]:
        lines.append(f"| {r['acceptance']:.1f} | {r['budget']} | {r['tau']:.2f} | {r['t1_ms']:.1f} | "
                     f"{r['tN_ms']:.1f} | {r['ideal']:.2f} | {r['realised']:.2f} | {r['efficiency']:.2f} | "
                     + " | ".join(f"{r['step_ms'][p]:.2f}" for p in PHASES) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", choices=sorted(DIMS), default="llama3-8b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--acceptance", type=float, nargs="+", default=[0.6, 0.8])
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/efficiency"))
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    target = random_llama(args.dims, device, dtype)
    prompt = np.random.default_rng(0).integers(0, target.vocab_size, args.prompt_tokens).tolist()
    measured = measure(target, prompt, args.new_tokens, args.acceptance, args.budgets, args.repeats)
    settings = {"model": target.name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(), "torch": torch.__version__,
                "command": "python benchmarks/framework_efficiency.py " + " ".join(argv or [])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "efficiency.json").write_text(json.dumps({**settings, **measured}, indent=2))
    text = report(settings, measured)
    (args.out / "efficiency.md").write_text(text)
    print(text)
    return measured


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
