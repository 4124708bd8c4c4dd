"""`specframe generate --compare`: the pipeline against a baseline's plain decoding, timed alike.

The baseline is transformers' own `generate` on the target's model, or, for a backend that runs other
weights or kernels than the target's torch model (`BackendCapabilities.runs_target_model` False: llama.cpp
on the GGUF's quantized weights), plain decoding (drafter `none`) through that backend, so that both sides
compute with the same weights and greedy outputs can be compared token for token.

Both sides first decode the bench's warm-up prompt, untimed (a process's first forwards set up kernels and
memory). Then each side runs `repeats` times, alternating which goes first, so that a slow drift of the
machine (another process, the CPU's clock) hits both; every repeat of the pipeline uses a fresh decoder,
so a drafter that remembers earlier requests (`suffix`) cannot copy an earlier repeat's answer and every
repeat decodes alike. The report gives each side's median tokens/s and range, the median of the per-repeat
speedups and their range, and the baseline's own spread as the noise of the measurement. On a terminal a
progress bar counts the runs (stderr only; nothing where stderr is a pipe or a file).

transformers runs on the same model object, set up as specframe sets it up, and reads the prompt as
specframe does where the model allows (`specframe.bench.peers.prompt_cache`): all but the last token in one
forward, the last token as a plain step. Read with the whole prompt, the last token gets other bits in
bfloat16, and greedy outputs can part from the first new token. In half precision the report says what the
reference is (`half_precision_note`): a stock transformers model in bfloat16 computes attention and linears
with other kernels, which round differently, so its greedy text can part from specframe's after some tokens.
"""

from __future__ import annotations

import statistics

from specframe.support.progress import bar
from specframe.terms.kinds import PLAIN_DRAFTER
from specframe.terms.metrics import clock_name

BASELINE = "transformers.generate"


class PlainRunner:
    """Plain decoding through the pipeline's backend as a baseline, run as a peer is: `generate` returns
    (new tokens, `DecodeMetrics.to_dict()`). One decoder serves every run: plain decoding keeps nothing from
    one request to the next. It is made (`make_plain()`) at the first run, after the pipeline's warm-up, so
    that a calibration that warm-up measured (`budget="auto"`) is handed to the baseline's backend too,
    which then pads its forwards as the pipeline's backend does."""

    def __init__(self, make_plain, stop):
        self.make_plain, self.stop, self.decoder = make_plain, stop, None

    def generate(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        if self.decoder is None:
            self.decoder = self.make_plain()
        result = self.decoder.generate(ids, max_new_tokens=max_new_tokens, stop=self.stop)
        return result.tokens, result.metrics.to_dict()


def plain_decoder(target, backend: str, sampling, phase_timing: bool = True):
    """A decoder of plain decoding (drafter `none`, `specframe.bench.methods.baseline_spec`) through the
    backend spec `backend`, sampling as `sampling` says."""
    from specframe.bench.methods import baseline_spec
    from specframe.decode.loop import SpeculativeDecoder
    from specframe.plugging.specs import ComponentSpec

    spec = baseline_spec(ComponentSpec.parse(backend), greedy=sampling.greedy)
    return SpeculativeDecoder.from_names(target, *spec.components, budget=spec.budget, sampling=sampling,
                                         phase_timing=phase_timing)


def baseline_for(target, backend: str, stop, sampling,
                 phase_timing: bool = True) -> tuple[str, object, str | None]:
    """`choose_baseline` for the pipeline's backend spec `backend` (`kv`, `llamacpp(...)`), its class
    looked up in the registry: what `specframe generate --compare` times against."""
    from specframe.plugging.registry import get_registry
    from specframe.plugging.specs import ComponentSpec
    from specframe.terms.kinds import ComponentKind

    backend_cls = get_registry().get(ComponentKind.BACKEND, ComponentSpec.parse(backend).name)
    return choose_baseline(target, backend_cls,
                           lambda: plain_decoder(target, backend, sampling, phase_timing), stop, sampling)


def choose_baseline(target, backend, make_plain, stop, sampling) -> tuple[str, object, str | None]:
    """(label, runner, note) of the baseline for a pipeline on `backend` (its class or an instance):
    transformers' `generate` where the backend runs the target's own model; plain decoding through the
    backend (`make_plain()`, a decoder with drafter `none`) where it does not, with a note saying why."""
    if backend.capabilities.runs_target_model:
        from specframe.bench.peers import PeerRunner, PeerSpec

        runner = PeerRunner(target, PeerSpec("hf-generate", "hf-generate"), sampling, split_prompt=True)
        return BASELINE, runner, None
    label = f"plain {backend.name} (drafter {PLAIN_DRAFTER})"
    note = (f"the baseline is plain decoding through '{backend.name}', on the weights and kernels the "
            "pipeline runs: transformers' generate would run another model (the one specframe converted for "
            "its tokenizer and drafters), so its speed and text would not compare")
    return label, PlainRunner(make_plain, stop), note


def compare_with_baseline(target, make_decoder, baseline: tuple[str, object, str | None], ids: list[int],
                          warmup_ids: list[int], max_new_tokens: int, stop, sampling, repeats: int,
                          drafter: str = "") -> dict:
    """Time the decoders `make_decoder` builds against `baseline` (`choose_baseline`'s label, runner and
    note) with the same settings, in this process, `repeats` runs each after a warm-up on `warmup_ids`
    (see the module docstring); `drafter` is the pipeline's drafter spec, for the notes. Returns the
    report's comparison fields and, under `result`, the pipeline's run of median speed (the text and
    metrics reported)."""
    import torch

    label, runner, baseline_note = baseline
    with bar(total=2 * repeats + 2, desc="--compare", unit="run", leave=False) as runs:
        warm_up(make_decoder(), runner, warmup_ids)
        runs.update(2)
        ours, theirs = [], []
        for repeat in range(repeats):
            decoder = make_decoder()
            for side in ("ours", "theirs") if repeat % 2 == 0 else ("theirs", "ours"):
                if side == "ours":
                    ours.append(decoder.generate(ids, max_new_tokens=max_new_tokens, stop=stop))
                else:
                    theirs.append(runner.generate(ids, max_new_tokens))
                runs.update()
    speed = [r.metrics.tokens_per_s for r in ours]
    base_speed = [metrics["tokens_per_s"] for _, metrics in theirs]
    speedups = [a / b if b else float("nan") for a, b in zip(speed, base_speed)]
    result = ours[speed.index(statistics.median_low(speed))]
    report = {"result": result, "baseline": label, "repeats": repeats, "clock": clock_name(),
              "threads": torch.get_num_threads(), "tokens_per_s_range": spread(speed),
              "baseline_tokens_per_s": statistics.median(base_speed),
              "baseline_tokens_per_s_range": spread(base_speed),
              "speedup": statistics.median(speedups), "speedup_range": spread(speedups),
              "noise": noise(base_speed)}
    if sampling.greedy:
        report["identical"] = theirs[0][0] == result.tokens
    else:  # two samplers draw different tokens by design: only the speed is compared
        report["compared"] = "speed only (sampled outputs are different draws)"
    notes = [baseline_note]
    if sampling.greedy and baseline_note is None:
        notes.append(half_precision_note(target.model, report["identical"]))
    notes.append(above_tau_note(report["speedup"], result.metrics.tau, report["noise"], label, drafter,
                                measured=repeats > 1))
    if any(notes):
        report["note"] = "; ".join(filter(None, notes))
    return report


def above_tau_note(speedup: float, tau: float, noise: float, baseline: str, drafter: str,
                   measured: bool = True) -> str | None:
    """A note on a speedup above tau by more than the measured `noise` and at the precision shown (a step
    emits at most tau tokens, so the baseline then ran slower per token than a step here, or the timing
    strayed), or None. `measured` False: one repeat, whose noise is unknown. It advises plain decoding
    (`--drafter none`) only to a pipeline that drafts."""
    if not (speedup > tau * (1 + noise) and round(speedup, 2) > round(tau, 2)):
        return None
    plain = drafter.partition("(")[0].strip() == PLAIN_DRAFTER
    advice = ("time it with --threads 1 --clock cpu, or raise --repeats" if plain
              else f"compare with --drafter {PLAIN_DRAFTER}, or raise --repeats")
    margin = (f"by more than the noise (±{100 * noise:.0f} %)" if measured
              else "(one repeat: the noise is not measured)")
    return (f"speedup {speedup:.2f}x is above tau {tau:.2f} {margin}: "
            f"a step cannot emit more than tau tokens, so {baseline}'s own per-token cost was higher than "
            f"a step here, or the timing strayed; {advice}")


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
    """Run the warm-up prompt `ids` (the bench's) through `decoder` and the `baseline`'s runner, untimed, so
    that neither side of `--compare` pays the process's first forwards (kernel set-up, allocations)."""
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
