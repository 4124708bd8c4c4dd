"""`specframe bench --batch B`: batched speculative decoding, timed against plain batched decoding through
the same backend and against transformers' own batched `generate` in the same process: the options of a
batch run, its chunks, and the peer `hf-generate`; the loop is the bench's one (`specframe.bench.loop`).

At B > 1, or in a sweep (`--batch 1,2,4,8`), every method and its plain baseline decode the first turn of
every question with `SpeculativeDecoder.generate_batch(..., batch_size=B)`: B rows at a time, a finished
row replaced at once by the next waiting prompt (continuous batching), greedily. The peer `hf-generate`
reads the same prompts B at a time, left padded, one `model.generate` call per B prompts (transformers
batches statically). Every method's rows must equal its baseline's token for token (lossless); the peer's
may differ (padding changes the numbers in float32), so its differing rows are counted, not failed.

The methods take turns chunk by chunk (`specframe.bench.loop.batch_plan`): on a shared machine whose load
drifts over minutes every method then meets the same load, where one call per method over the whole suite
would time each under another (`docs/how-to/benchmark.md` gives a measured case). The tables add a
method's chunks up and take the spread of its speedups from them
(`specframe.bench.batch_report.ratio_interval`).
"""

from __future__ import annotations

import math

import torch

from specframe.runtime.devices import synchronize
from specframe.terms.errors import ConfigurationError
from specframe.terms.metrics import now
from specframe.terms.sampling import SamplingParams
from specframe.terms.target import Target

from specframe.bench.peers import PeerSpec, parse_peers
from specframe.bench.store import call_metrics

BATCH_PEERS = ("hf-generate",)  # transformers' prompt lookup and assisted generation take one prompt
# Prompts per chunk at least (`chunk_size`): at B = 4 two fills of the batch, about a minute of decoding per
# method on one CPU thread at 128 new tokens, so that the methods' turns stay minutes apart.
MIN_CHUNK = 8


def parse_batches(text: str) -> list[int]:
    """`--batch`: one batch size (rows decoded together), or a comma list of them, a sweep."""
    sizes = []
    for part in str(text).split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise ConfigurationError(f"--batch takes a number of rows or a comma list of them (e.g. 4, or "
                                     f"1,2,4,8 for a sweep), got {text!r}") from None
        if size < 1:
            raise ConfigurationError(f"--batch sizes must be >= 1 (1 decodes one request at a time), got "
                                     f"{size} in {text!r}")
        sizes.append(size)
    if len(set(sizes)) < len(sizes):
        raise ConfigurationError(f"--batch names a size twice in {text!r}: list each batch size once")
    return sizes


def batched(sizes: list[int]) -> bool:
    """Whether `--batch` asks for batched decoding: anything but the default one request at a time."""
    return sizes != [1]


def chunk_size(size: int, chunk: int | None = None) -> int:
    """Prompts per chunk at batch size `size`: `chunk` when given (`--batch-chunk`), else 2 `size`, at
    least `MIN_CHUNK`, a multiple of `size`. Small, so that every method decodes a chunk within minutes of
    the others; at least two fills of the batch, so that a chunk's rows are refilled before it drains (its
    last rows decode in a batch of fewer than B, which costs every method some throughput); a multiple of
    B, so that hf-generate's calls group the same prompts as they would over the whole suite."""
    return chunk or size * max(2, math.ceil(MIN_CHUNK / size))


def chunks(count: int, size: int) -> list[range]:
    """The indices of `count` prompts cut into consecutive chunks of `size` (the last may be shorter)."""
    return [range(first, min(first + size, count)) for first in range(0, count, size)]


def batch_peers(text: str) -> list[PeerSpec]:
    """`--peers` at B > 1: `all` is `hf-generate`, the one transformers peer that decodes batches."""
    peers = parse_peers("hf-generate" if text.strip() == "all" else text)
    for peer in peers:
        if peer.name not in BATCH_PEERS:
            raise ConfigurationError(
                f"peer '{peer.label}' cannot decode batches (it takes one prompt at a time): at --batch > 1 "
                f"pass --peers {' or '.join(BATCH_PEERS)}, or --peers none")
    return peers


def check_batch_options(sizes: list[int], *, sampling: SamplingParams, ray: str | None, shard: str | None,
                        synthetic_acceptance: float | None, max_turns: int | None, chunk: int | None) -> None:
    """Refuse, before a model is loaded, every option a batch run (`sizes` other than [1]) cannot honour."""
    refused = {"--temperature": not sampling.greedy, "--ray": ray is not None, "--shard": shard is not None,
               "--synthetic-acceptance": synthetic_acceptance is not None}
    why = {"--temperature": "batched runs decode greedily, so that every row is checked against plain "
                            "decoding; drop --temperature",
           "--ray": "a batch run decodes in one process; drop --ray",
           "--shard": "a batch run takes its methods in turns over the whole suite; cut it with --limit "
                      "instead",
           "--synthetic-acceptance": "its drafter reads the baseline's answer one request at a time; run "
                                     "it at --batch 1"}
    for option, bad in refused.items():
        if bad:
            raise ConfigurationError(f"{option} does not go with --batch {','.join(map(str, sizes))}: "
                                     f"{why[option]}")
    if max_turns is not None and max_turns != 1:
        raise ConfigurationError(f"--turns {max_turns} does not go with --batch {','.join(map(str, sizes))}: "
                                 "a batch run decodes the first turn of every question only; drop --turns, "
                                 "or run at --batch 1 to decode later turns")
    if chunk is not None and chunk < 1:
        raise ConfigurationError(f"--batch-chunk takes the prompts each method decodes before the next "
                                 f"method takes its turn, at least 1, got {chunk}; leave it out for 2 B")


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
