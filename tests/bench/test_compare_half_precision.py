"""`specframe generate --compare` in bfloat16: transformers' `generate` reads the prompt as specframe does
(`specframe.bench.peers.prompt_cache`), so greedy outputs are identical; where it cannot (layers other than
attention), a mismatch comes with a note that names the reference."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from ssm_models import tiny_ssm_target

from specframe import SpeculativeDecoder, TokenTree
from specframe.bench import compare
from specframe.runtime.attention import use_cpu_attention
from specframe.bench.peers import PeerRunner, PeerSpec, prompt_cache, splits_prompt
from specframe.runtime.attention import EXACT_ROWS
from specframe.runtime.packed_linear import native_bfloat16, pack_linear_layers
from specframe.terms.sampling import SamplingParams
from specframe.testing.targets import tiny_target
from specframe_kv import KVCacheBackend

VOCAB = 256
PROMPT_TOKENS = 80  # more than EXACT_ROWS: read in one forward, the last token takes torch's kernels
SEEDS = range(4)


def bfloat16_target(seed: int):
    """A tiny Llama set up as `load_target(dtype="bfloat16")` sets up a CPU model."""
    target = tiny_target(seed=seed, vocab_size=VOCAB, hidden_size=64)
    target.model.to(torch.bfloat16)
    if native_bfloat16():
        pack_linear_layers(target.model, bfloat16=True, exact_rows=EXACT_ROWS)
    use_cpu_attention(target.model)
    return target


def prompt(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, PROMPT_TOKENS).tolist()


def plain_logits(target, ids: list[int], steps: int) -> list[torch.Tensor]:
    """specframe's plain greedy decoding, step by step: each step's logits at the root."""
    backend, out = KVCacheBackend(target), []
    backend.prefill(ids)
    for _ in range(steps):
        scored = backend.score(TokenTree.empty())
        out.append(scored.logits[0])
        backend.commit(scored, [], int(scored.logits[0].argmax()))
    return out


@torch.inference_mode()
def generate_logits(target, ids: list[int], steps: int, split: bool) -> list[torch.Tensor]:
    x = torch.tensor([ids])
    cache = {"past_key_values": prompt_cache(target.model, x)} if split else {}
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=steps, do_sample=False,
                                output_logits=True, return_dict_in_generate=True, **cache)
    return [logits[0].float() for logits in out.logits]


def test_generate_reading_the_prompt_as_specframe_gives_plain_decodings_logits_bit_for_bit():
    """Read whole, the prompt's last token gets other bfloat16 bits than as a plain step (the cause of
    the mismatch); read as specframe reads it, every step's logits are plain decoding's exactly."""
    whole_differs = 0
    for seed in SEEDS:
        target, ids = bfloat16_target(seed), prompt(seed)
        plain = plain_logits(target, ids, 6)
        split = generate_logits(target, ids, 6, split=True)
        assert all(torch.equal(a, b) for a, b in zip(plain, split, strict=True))
        whole_differs += not torch.equal(plain[0], generate_logits(target, ids, 1, split=False)[0])
    assert whole_differs > 0


def test_the_compare_baseline_emits_plain_decodings_tokens_in_bfloat16():
    sampling = SamplingParams()
    for seed in SEEDS:
        target, ids = bfloat16_target(seed), prompt(seed)
        plain = SpeculativeDecoder.from_names(target, drafter="none", budget=4).generate(ids,
                                                                                         max_new_tokens=24)
        runner = PeerRunner(target, PeerSpec("hf-generate", "hf-generate"), sampling, split_prompt=True)
        tokens, metrics = runner.generate(ids, 24)
        assert tokens == list(plain.tokens)
        assert metrics["new_tokens"] == 24


def test_models_with_recurrent_layers_read_the_whole_prompt_and_a_half_precision_mismatch_says_why():
    models = {"hybrid": tiny_ssm_target("bamba").model.to(torch.bfloat16), "llama": bfloat16_target(0).model,
              "float32": tiny_ssm_target("bamba").model}
    assert not splits_prompt(models["hybrid"]) and splits_prompt(models["llama"])

    class Different:  # transformers' side emits other tokens
        def generate(self, ids, max_new_tokens):
            return [9, 9, 9], {"tokens_per_s": 10.0}

    def make_decoder():
        metrics = SimpleNamespace(tokens_per_s=10.0, tau=1.0)
        return SimpleNamespace(generate=lambda *a, **k: SimpleNamespace(tokens=[1, 2, 3], metrics=metrics))

    notes = {}
    for name, model in models.items():
        target = SimpleNamespace(model=model)
        baseline = (compare.BASELINE, Different(), None)
        report = compare.compare_with_baseline(target, make_decoder, baseline, [1], [2], 3, (),
                                               SamplingParams(), repeats=1)
        assert report["identical"] is False
        notes[name] = report.get("note")
    assert notes["hybrid"] == compare.WHOLE_PROMPT_NOTE and "--drafter none" in notes["hybrid"]
    assert notes["llama"] == compare.HALF_PRECISION_NOTE  # it read the prompt as specframe does
    assert "reference is specframe's own plain decoding" in notes["llama"] and "stock" in notes["llama"]
    assert notes["float32"] is None

