"""`specframe generate --compare`: the pipeline against transformers' own `generate`, timed alike.

Both sides first decode the bench's warm-up prompt, untimed (a process's first forwards set up kernels and
memory). Then each side runs `repeats` times, alternating which goes first, so that a slow drift of the
machine (another process, the CPU's clock) hits both; every repeat of the pipeline uses a fresh decoder,
so a drafter that remembers earlier requests (`suffix`) cannot copy an earlier repeat's answer and every
repeat decodes alike. The report gives each side's median tokens/s and range, the median of the per-repeat
speedups and their range, and the baseline's own spread as the noise of the measurement.

transformers runs on the same model object, set up as specframe sets it up, and reads the prompt as
specframe does where the model allows (`specframe.bench.peers.prompt_cache`): all but the last token in one
forward, the last token as a plain step. Read with the whole prompt, the last token gets other bits in
bfloat16, and greedy outputs can part from the first new token. In half precision the report says what the
reference is (`half_precision_note`): a stock transformers model in bfloat16 computes attention and linears
with other kernels, which round differently, so its greedy text can part from specframe's after some tokens.
"""

from __future__ import annotations

import statistics

from specframe.terms.metrics import clock_name

BASELINE = "transformers.generate"


def compare_with_transformers(target, make_decoder, ids: list[int], warmup_ids: list[int],
                              max_new_tokens: int, stop, sampling, repeats: int) -> dict:
    """Time the decoders `make_decoder` builds against `model.generate` with the same settings, in this
    process, `repeats` runs each after a warm-up on `warmup_ids` (see the module docstring). Returns the
    report's comparison fields and, under `result`, the pipeline's run of median speed (the text and
    metrics reported)."""
    import torch

    from specframe.bench.peers import PeerRunner, PeerSpec

    baseline = PeerRunner(target, PeerSpec("hf-generate", "hf-generate"), sampling, split_prompt=True)
    warm_up(make_decoder(), baseline, warmup_ids)
    ours, theirs = [], []
    for repeat in range(repeats):
        decoder = make_decoder()
        for side in ("ours", "theirs") if repeat % 2 == 0 else ("theirs", "ours"):
            if side == "ours":
                ours.append(decoder.generate(ids, max_new_tokens=max_new_tokens, stop=stop))
            else:
                theirs.append(baseline.generate(ids, max_new_tokens))
    speed = [r.metrics.tokens_per_s for r in ours]
    base_speed = [metrics["tokens_per_s"] for _, metrics in theirs]
    speedups = [a / b if b else float("nan") for a, b in zip(speed, base_speed)]
    result = ours[speed.index(statistics.median_low(speed))]
    report = {"result": result, "baseline": BASELINE, "repeats": repeats, "clock": clock_name(),
              "threads": torch.get_num_threads(), "tokens_per_s_range": spread(speed),
              "baseline_tokens_per_s": statistics.median(base_speed),
              "baseline_tokens_per_s_range": spread(base_speed),
              "speedup": statistics.median(speedups), "speedup_range": spread(speedups),
              "noise": noise(base_speed)}
    if sampling.greedy:
        report["identical"] = theirs[0][0] == result.tokens
    else:  # two samplers draw different tokens by design: only the speed is compared
        report["compared"] = "speed only (sampled outputs are different draws)"
    notes = [half_precision_note(target.model, report["identical"])] if sampling.greedy else []
    tau = result.metrics.tau
    if report["speedup"] > tau:
        notes.append(f"speedup {report['speedup']:.2f}x is above tau {tau:.2f}: a step cannot emit more "
                     "than tau tokens, so transformers' own per-token cost was higher than a step here, "
                     "or the timing is noise; compare with --drafter none, or raise --repeats")
    if any(notes):
        report["note"] = "; ".join(filter(None, notes))
    return report


# What a greedy `--compare` of a half-precision model compares with, and why stock transformers differs.
HALF_PRECISION_NOTE = (
    "in half precision the reference is specframe's own plain decoding: transformers' generate ran on this "
    "model as specframe set it up (attention summed in float64, linears whose rows do not depend on each "
    "other, so that speculative steps equal plain ones bit for bit) and read the prompt as specframe does; "
    "a stock transformers model in bfloat16 rounds differently, so its greedy text can part from this one "
    "after some tokens (docs/explanation/metrics-and-costs.md)")
# The same where `generate` read the whole prompt at once (layers other than attention) and differed.
WHOLE_PROMPT_NOTE = (
    "in half precision the reference is specframe's own plain decoding (--drafter none), which speculative "
    "decoding matches exactly: transformers' generate read this model's whole prompt in one forward (its "
    "layers are not attention alone), specframe all but the last token and then that token as a plain step, "
    "and half precision rounds the two differently (docs/explanation/metrics-and-costs.md)")


def half_precision_note(model, identical: bool) -> str | None:
    """What a greedy comparison of `model` says about its reference: for a CPU model in bfloat16 or float16
    (which `load_target` sets up to compute every row exactly) `HALF_PRECISION_NOTE`, or `WHOLE_PROMPT_NOTE`
    where the outputs differ and `generate` read the whole prompt at once (`specframe.bench.peers.
    splits_prompt` is false); nothing otherwise."""
    import torch

    from specframe.bench.peers import splits_prompt

    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return None
    return WHOLE_PROMPT_NOTE if not identical and not splits_prompt(model) else HALF_PRECISION_NOTE


def warm_up(decoder, baseline, ids: list[int]) -> None:
    """Run the warm-up prompt `ids` (the bench's) through `decoder` and the transformers `baseline`, untimed,
    so that neither side of `--compare` pays the process's first forwards (kernel set-up, allocations)."""
    from specframe.bench.runner import WARMUP_TOKENS

    decoder.generate(ids, max_new_tokens=WARMUP_TOKENS)
    baseline.generate(ids, WARMUP_TOKENS)


def spread(values: list[float]) -> list[float]:
    """[min, max] of `values`."""
    return [min(values), max(values)]


def noise(values: list[float]) -> float:
    """Half the range of repeated timings of one thing, relative to their median (0.04: +-4 %): how far a
    single run may stray, and so how far apart two methods must be before the difference means anything."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / (2 * middle) if middle else float("nan")
