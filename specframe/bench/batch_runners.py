"""How each side of a batch run decodes a chunk of prompts B rows at a time (`specframe.bench.batch`): a
specframe pipeline through `SpeculativeDecoder.generate_batch` (`PipelineBatches`), transformers' own batched
`generate` (`GeneratePeerBatches`), and what a record keeps of one call (`call_metrics`).
"""

from __future__ import annotations

import torch

from specframe.terms.metrics import now
from specframe.terms.target import Target
from specframe.runtime.devices import synchronize
from specframe.decode.loop import SpeculativeDecoder

from specframe.bench.peers import PeerSpec
from specframe.bench.runner import PipelineRunner


class PipelineBatches:
    """A specframe pipeline (a `PipelineRunner`) decoding a suite B rows at a time."""

    def __init__(self, runner: PipelineRunner):
        self.runner, self.label, self.baseline = runner, runner.label, runner.baseline
        self.lossless, self.remembers = runner.lossless, runner.remembers
        self.suite: SpeculativeDecoder | None = None  # a remembering drafter's, for this (B, repeat)

    def start_suite(self) -> None:
        """Before the first chunk of a (B, repeat): a drafter that remembers requests (suffix) gets a
        decoder with no memory, so that every B and repeat decodes the suite alike rather than copying the
        answers of the ones before it. The chunks after it keep that decoder, so that each finds the
        answers of the chunks before it (and its planner what they taught it), as one call over the whole
        suite would."""
        self.suite = self.fresh() if self.remembers else None

    def remember(self, prompts: list[list[int]], tokens: list[list[int]]) -> None:
        """A chunk of this (B, repeat) decoded by an earlier process: a drafter that remembers requests is
        given its recorded answers (`Drafter.remember`), so that the chunks still to run find what an
        uninterrupted run would have left them."""
        if self.remembers:
            for prompt, answer in zip(prompts, tokens):
                self.decoder().pipeline.drafter.remember(prompt, answer)

    def fresh(self) -> SpeculativeDecoder:
        decoder, spec = self.runner.decoder, self.runner.spec
        return SpeculativeDecoder.from_names(decoder.target, *spec.components, budget=spec.budget,
                                             sampling=decoder.sampling, registry=decoder.registry,
                                             phase_timing=decoder.phase_timing)

    def decoder(self) -> SpeculativeDecoder:
        """The decoder of the next call: the runner's own, or for a drafter that remembers requests this
        (B, repeat)'s (`start_suite`; a throwaway one before any, as for the warmup)."""
        if not self.remembers:
            return self.runner.decoder
        return self.suite if self.suite is not None else self.fresh()

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       size: int) -> tuple[list[list[int]], dict]:
        """Every prompt's new tokens, and the metrics of the whole call (`call_metrics`)."""
        decoder = self.decoder()
        device = decoder.target.device
        synchronize(device)
        start = now()
        results = decoder.generate_batch(prompts, max_new_tokens, batch_size=size)
        synchronize(device)
        wall = now() - start
        rows = [r.metrics for r in results]
        return [r.tokens for r in results], call_metrics(
            wall, [m.new_tokens for m in rows], [m.wall_s for m in rows], sum(m.steps for m in rows),
            sum(m.accepted_draft_tokens for m in rows), decoder.batch_metrics.to_dict())


class GeneratePeerBatches:
    """transformers' own greedy `generate` on the same target (peer `hf-generate`): B prompts per call,
    left padded. Every row of a call ends with the call, so each row's latency is its call's time."""

    lossless = False  # padding changes the numbers: its rows are counted against the baseline, not failed

    def __init__(self, target: Target, spec: PeerSpec, baseline: str):
        self.target, self.label, self.baseline = target, spec.label, baseline
        eos = sorted(target.eos_token_ids)
        pad = getattr(target.tokenizer, "pad_token_id", None)
        self.eos = set(eos)
        self.pad = eos[0] if eos else pad if pad is not None else 0

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       size: int) -> tuple[list[list[int]], dict]:
        """Every prompt's new tokens (cut after its first EOS), and the metrics of all the calls."""
        tokens, latency, wall = [], [], 0.0
        for first in range(0, len(prompts), size):
            rows, seconds = self.call(prompts[first:first + size], max_new_tokens)
            tokens += rows
            latency += [seconds] * len(rows)
            wall += seconds
        lengths = [len(t) for t in tokens]
        return tokens, call_metrics(wall, lengths, latency, sum(lengths), 0)  # a forward emits one token

    @torch.inference_mode()
    def call(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float]:
        """One `generate` call on `prompts`, left padded: their new tokens and its seconds."""
        device = self.target.device
        width = max(len(p) for p in prompts)
        padded = [[self.pad] * (width - len(p)) + p for p in prompts]
        input_ids = torch.tensor(padded, device=device)  # (B, L)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # (B, L)
        synchronize(device)
        start = now()
        stops = {"eos_token_id": sorted(self.eos)} if self.eos else {}  # where specframe's rows stop
        out = self.target.model.generate(input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                         do_sample=False, pad_token_id=self.pad, **stops)  # (B, L + new)
        synchronize(device)
        seconds = now() - start
        return [cut_after_eos(row, self.eos) for row in out[:, width:].tolist()], seconds


def cut_after_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to and including the first EOS: what follows in a batch is padding."""
    end = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    return tokens[:end]


def call_metrics(wall_s: float, new_tokens: list[int], latency_s: list[float], steps: int,
                 accepted: int, split: dict | None = None) -> dict:
    """What a record keeps of one batched call: its seconds, every row's new tokens and latency, the
    steps and accepted draft tokens of all rows (tau = (accepted + steps) / steps), and for a specframe
    pipeline the call's time split as a whole (`split`: `specframe.decode.batch.BatchMetrics.to_dict`:
    batched steps, prefill seconds, seconds and ms per batched step by phase)."""
    total = sum(new_tokens)
    return {"wall_s": wall_s, "new_tokens": total, "tokens_per_s": total / wall_s if wall_s > 0 else 0.0,
            "row_new_tokens": new_tokens, "latency_s": latency_s, "steps": steps,
            "accepted_draft_tokens": accepted, **(split or {})}
