"""Forward time and peak memory of one target call, packed tree (`ssm-tree`) vs unrolled (`ssm-unrolled`).

Full binary trees of depth 4, 5 and 6 (15, 31, 63 packed nodes) on random-weight models with Mamba2-2.7B
layer dimensions (d_model 2560, 80 heads x 64, d_state 128, 1 group, conv 4, vocab 50288), float32:
- `ssm`: a Mamba2ForCausalLM with `--layers` Mamba2 layers;
- `hybrid`: a NemotronH model in the Mamba2-attention 2.7B layout, one attention layer (20 heads x 128) per
  ten layers, `--hybrid-layers` layers in all;
- `gdn`: a Qwen3-Next model with the gated DeltaNet dimensions of Qwen3-Next-80B-A3B (d_model 2048, 16 key
  heads and 32 value heads of 128, conv 4), three DeltaNet layers per gated attention layer (16 heads of
  256, 2 KV heads), a dense MLP of 5120 instead of the MoE, the same vocabulary; `--gdn-layers` in all;
- `mamba1`: a Mamba (Mamba-1) model with Mamba-2.8B layer dimensions (d_model 2560, 5120 channels, d_state
  16, dt rank 160, conv 4), `--layers` layers. transformers cannot continue a Mamba-1 cache with several
  tokens at once, so there is no unrolled baseline: `own-step` times the model's own one-token step, the
  unit of verifying nodes one at a time;
- `smollm2-hybrid`: the trained `smollm2-135m-hybrid` (SmolLM2-135M with 7 of its 30 attention layers
  distilled into Mamba2 mixers; its own layer count, whatever `--layers` says);
- `lfm2`: an LFM2 model with LFM2-1.2B dimensions (d_model 2048, MLP 8192, 32 heads, 8 KV heads, conv
  window 3), attention at every third layer, `--gdn-layers` layers.
Each (model, backend, depth) runs in a fresh subprocess. Peak memory is the growth of the process's peak
resident set during the call (VmHWM reset through /proc/self/clear_refs, freed heap trimmed first); on a
GPU it is torch.cuda.max_memory_allocated growth. Time is the minimum of `--repeats` calls after a warm-up,
as wall time and as process CPU time; on a shared CPU run with `--threads 1` and read the CPU time, which
other processes' load does not inflate.
Then the STree paper's runtime models are fitted per backend: t = kN + C (ssm), t = aN^2 + bN + c (hybrid).

    python benchmarks/measure_ssm_tree.py --layers 4 --hybrid-layers 10 --threads 1 --time cpu \
        --out results/ssm_tree
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

DIMS = dict(hidden=2560, heads=80, head_dim=64, state=128, groups=1, conv=4, vocab=50288)


def build_model(kind: str, layers: int, chunk: int):
    from transformers import Mamba2Config, Mamba2ForCausalLM, NemotronHConfig, NemotronHForCausalLM

    d = DIMS
    if kind == "smollm2-hybrid":  # the trained hybrid: SmolLM2 with 7 of 30 layers distilled into Mamba2
        import specframe

        return specframe.load_target("smollm2-135m-hybrid", device="cpu", dtype="float32").model
    if kind == "ssm":
        config = Mamba2Config(vocab_size=d["vocab"], hidden_size=d["hidden"], num_hidden_layers=layers,
                              num_heads=d["heads"], head_dim=d["head_dim"], state_size=d["state"],
                              n_groups=d["groups"], expand=2, conv_kernel=d["conv"], chunk_size=chunk)
        return Mamba2ForCausalLM(config)
    if kind == "mamba1":
        from transformers import MambaConfig, MambaForCausalLM

        config = MambaConfig(vocab_size=d["vocab"], hidden_size=2560, num_hidden_layers=layers, state_size=16,
                             expand=2, conv_kernel=d["conv"], time_step_rank=160)
        return MambaForCausalLM(config)
    if kind == "lfm2":
        from transformers import Lfm2Config, Lfm2ForCausalLM

        types = ["full_attention" if i % 3 == 2 else "conv" for i in range(layers)]
        return Lfm2ForCausalLM(Lfm2Config(vocab_size=d["vocab"], hidden_size=2048, intermediate_size=8192,
                                          num_hidden_layers=layers, layer_types=types, num_attention_heads=32,
                                          num_key_value_heads=8, conv_L_cache=3))
    if kind == "gdn":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        config = Qwen3NextConfig(vocab_size=d["vocab"], hidden_size=2048, num_hidden_layers=layers,
                                 layer_types=types, linear_num_key_heads=16, linear_num_value_heads=32,
                                 linear_key_head_dim=128, linear_value_head_dim=128,
                                 linear_conv_kernel_dim=d["conv"], num_attention_heads=16,
                                 num_key_value_heads=2, head_dim=256, intermediate_size=5120, num_experts=0)
        return Qwen3NextForCausalLM(config)
    types = ["full_attention" if i % 10 == 9 else "linear_attention" for i in range(layers)]
    config = NemotronHConfig(vocab_size=d["vocab"], hidden_size=d["hidden"], layers_block_type=types,
                             mamba_num_heads=d["heads"], mamba_head_dim=d["head_dim"], n_groups=d["groups"],
                             ssm_state_size=d["state"], conv_kernel=d["conv"], chunk_size=chunk, expand=2,
                             num_attention_heads=20, num_key_value_heads=20, head_dim=128)
    return NemotronHForCausalLM(config)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def one_case(kind: str, layers: int, backend_name: str, depth: int, prefix: int, repeats: int,
             chunk: int, device: str) -> dict:
    """Build the model, prefill `prefix` tokens, score one full binary tree; time and memory of `score`.
    Backend `own-step` times the model's own one-token forward instead (the tree is not used)."""
    import specframe
    from specframe_ssm import full_binary_tree

    torch.manual_seed(0)
    own = backend_name == "own-step"
    model = build_model(kind, layers, chunk).to(device).eval()
    target = specframe.Target(model=model, tokenizer=None, name=f"{kind}-{layers}L")
    backend = specframe.get_registry().get("backend", "ssm-tree" if own else backend_name)(target)
    rng = np.random.default_rng(0)
    vocab = target.vocab_size
    backend.prefill(rng.integers(0, vocab, prefix).tolist())
    parents = [] if own else full_binary_tree(depth)
    tree = specframe.TokenTree(rng.integers(0, vocab, len(parents)), np.array(parents))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if own:  # the model's own one-token step on a copy of the committed cache, as generate() runs it
        step = torch.tensor([[1]], device=device)
        copies = [copy.deepcopy(backend.cache) for _ in range(repeats + 2)]  # copied outside the timing

        def score(_tree):
            with torch.inference_mode():
                model(input_ids=step, use_cache=True, **{backend.layout.cache_kwarg: copies.pop()})

        backend.score = score
    backend.score(tree)  # warm-up
    times, cpu_times = [], []
    for _ in range(repeats):
        sync()
        start, cpu_start = time.perf_counter(), time.process_time()
        backend.score(tree)
        sync()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        backend.score(tree)
        peak = torch.cuda.max_memory_allocated() - base
    else:
        _reset_peak()
        base = _rss_kib("VmRSS")
        backend.score(tree)
        peak = (_rss_kib("VmHWM") - base) * 1024
    return dict(kind=kind, layers=layers, backend=backend_name, depth=depth, nodes=len(tree) + 1,
                prefix=prefix, seconds=min(times), all_seconds=times, cpu_seconds=min(cpu_times),
                all_cpu_seconds=cpu_times, peak_bytes=int(peak),
                threads=torch.get_num_threads(), device=device)


def fit(rows: list[dict], key: str = "seconds") -> dict:
    """Per (kind, backend): t = kN + C for ssm, t = aN^2 + bN + c for hybrid (seconds, N packed nodes)."""
    from specframe import PolynomialCost

    fits = {}
    for kind in sorted({r["kind"] for r in rows}):
        for backend in sorted({r["backend"] for r in rows}):
            sel = [r for r in rows if r["kind"] == kind and r["backend"] == backend]
            if len(sel) >= 3:
                model = PolynomialCost.fit([r["nodes"] for r in sel], [r[key] for r in sel],
                                           1 if kind == "ssm" else 2)
                fits[f"{kind}/{backend}"] = dict(coefficients=model.coefficients, layers=sel[0]["layers"])
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hybrid-layers", type=int, default=10)
    parser.add_argument("--gdn-layers", type=int, default=8)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument("--prefix", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=8, help="HF chunk size; >= the longest path avoids "
                        "padding each unrolled path to a long chunk")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kinds", nargs="+", default=["ssm", "hybrid"],
                        choices=["ssm", "hybrid", "gdn", "mamba1", "lfm2", "smollm2-hybrid"])
    parser.add_argument("--out", default="results/ssm_tree")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--time", choices=["wall", "cpu"], default="wall", help="which time the fits use")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.case:  # child process: one measurement, JSON on stdout
        kind, backend, depth = args.case.split(":")
        layers = {"ssm": args.layers, "hybrid": args.hybrid_layers, "gdn": args.gdn_layers,
                  "mamba1": args.layers, "lfm2": args.gdn_layers, "smollm2-hybrid": 30}[kind]
        print(json.dumps(one_case(kind, layers, backend, int(depth), args.prefix, args.repeats, args.chunk,
                                  args.device)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in args.kinds:
        baseline = "own-step" if kind == "mamba1" else "ssm-unrolled"
        for depth in args.depths:
            for backend in ("ssm-tree", baseline):
                if backend == "own-step" and depth != args.depths[0]:
                    continue  # one tree-independent measurement
                cmd = [sys.executable, __file__, "--case", f"{kind}:{backend}:{depth}", *_passthrough(args)]
                result = subprocess.run(cmd, capture_output=True, text=True, check=True)
                row = json.loads(result.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"{kind:6s} {backend:12s} depth {depth} N={row['nodes']:3d} "
                      f"wall {row['seconds'] * 1e3:9.1f} ms  cpu {row['cpu_seconds'] * 1e3:9.1f} ms  "
                      f"peak {row['peak_bytes'] / 2**20:8.1f} MiB", flush=True)
                (out / "rows.json").write_text(json.dumps(rows, indent=1))
    fits = fit(rows, "seconds" if args.time == "wall" else "cpu_seconds")
    (out / "fits.json").write_text(json.dumps(fits, indent=1))
    print(json.dumps(fits, indent=1))
    table = markdown_table(rows, "seconds" if args.time == "wall" else "cpu_seconds")
    (out / "table.md").write_text(table)
    print(table)


def markdown_table(rows: list[dict], key: str) -> str:
    """Per kind and depth: the packed tree against its baseline (unrolled paths, or for Mamba-1 N of the
    model's own one-token steps), time (ms, `key`) and peak memory growth."""
    lines = ["| model | depth | nodes N | ssm-tree ms | baseline | baseline ms | speed-up "
             "| ssm-tree peak MiB | baseline peak MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        step = next((r for r in mine if r["backend"] == "own-step"), None)
        for tree in (r for r in mine if r["backend"] == "ssm-tree"):
            base = step or next(r for r in mine
                                if r["backend"] == "ssm-unrolled" and r["depth"] == tree["depth"])
            name, base_s = (("N x own step", tree["nodes"] * base[key]) if step
                            else ("ssm-unrolled", base[key]))
            lines.append(f"| {kind} | {tree['depth']} | {tree['nodes']} | {tree[key] * 1e3:.0f} | {name} "
                         f"| {base_s * 1e3:.0f} | {base_s / tree[key]:.2f}x "
                         f"| {tree['peak_bytes'] / 2**20:.1f} | {base['peak_bytes'] / 2**20:.1f} |")
    return "\n".join(lines) + "\n"


def _passthrough(args) -> list[str]:
    return ["--layers", str(args.layers), "--hybrid-layers", str(args.hybrid_layers),
            "--gdn-layers", str(args.gdn_layers),
            "--prefix", str(args.prefix), "--repeats", str(args.repeats), "--chunk", str(args.chunk),
            "--device", args.device, "--threads", str(args.threads)]


if __name__ == "__main__":
    main()
