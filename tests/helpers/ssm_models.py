"""Tiny random targets of every family ssm-tree serves (Mamba2, Bamba, NemotronH, Qwen3-Next, OLMo-hybrid,
Mamba, FalconMamba, Jamba, and specframe_hybrid's GraniteMoeHybrid conversion of a Llama), and the naive
per-path reference the SSM tests use.

The reference deep-copies the committed cache and runs the unmodified transformers model on one
root-to-leaf path as a plain sequence with explicit positions: no tree code is involved.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import torch
import transformers
from transformers import (
    BambaConfig, BambaForCausalLM, Mamba2Config, Mamba2ForCausalLM, NemotronHConfig, NemotronHForCausalLM,
)

from specframe import Target, TokenTree

VOCAB = 64


def _randomize_ssm(model: torch.nn.Module, seed: int) -> None:
    """Random A_log, dt_bias and (Mamba2) D so decays, clamps and skips are all exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "A_log") and hasattr(m, "dt_bias"):
                m.A_log.copy_(torch.rand(m.A_log.shape, generator=gen) * 2.0 - 1.0)
                m.dt_bias.copy_(torch.randn(m.dt_bias.shape, generator=gen))
                if hasattr(m, "D"):
                    m.D.copy_(torch.randn(m.D.shape, generator=gen))


# Gated DeltaNet hybrids: the recurrent layers first (as in both models), attention after.
_DELTA = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              linear_key_head_dim=8, linear_value_head_dim=8, initializer_range=0.2)


def tiny_ssm_target(kind: str = "mamba2", *, groups: int = 2, conv: int = 4, dt_min: float = 0.0,
                    dt_max: float = float("inf"), seed: int = 0) -> Target:
    """A tiny random target of family `kind` ("mamba2", "bamba", "nemotronh", or the gated DeltaNet hybrids
    "qwen3_next" and "olmo_hybrid", where `groups` is the key head count), float32, eval mode. Mamba2-type
    mixers clamp their time steps to (`dt_min`, `dt_max`) in multi-token forwards."""
    torch.manual_seed(seed)
    # A wide init so that every layer, the SSM ones included, moves the logits visibly.
    common = dict(vocab_size=VOCAB, hidden_size=32, initializer_range=0.2)
    if kind == "mamba2":
        config = Mamba2Config(**common, num_hidden_layers=3, num_heads=4, head_dim=16, state_size=8,
                              n_groups=groups, expand=2, conv_kernel=conv, chunk_size=8,
                              time_step_limit=(dt_min, dt_max))
        model = Mamba2ForCausalLM(config)
    elif kind == "bamba":
        config = BambaConfig(**common, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4,
                             mamba_d_head=16, mamba_n_groups=groups, mamba_d_state=8, mamba_expand=2,
                             mamba_d_conv=conv, mamba_chunk_size=8, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48)
        model = BambaForCausalLM(config)
    elif kind == "nemotronh":
        config = NemotronHConfig(**common, layers_block_type=["linear_attention", "mlp", "full_attention",
                                                               "linear_attention"],
                                 mamba_num_heads=4, mamba_head_dim=16, n_groups=groups, ssm_state_size=8,
                                 conv_kernel=conv, chunk_size=8, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=8, intermediate_size=48, expand=2)
        model = NemotronHForCausalLM(config)
    elif kind == "qwen3_next":
        config = transformers.Qwen3NextConfig(
            **_NO_SPECIAL_IDS, **_DELTA, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            linear_num_key_heads=groups, linear_num_value_heads=4, linear_conv_kernel_dim=conv, num_experts=0)
        model = transformers.Qwen3NextForCausalLM(config)
    elif kind == "olmo_hybrid":
        config = transformers.OlmoHybridConfig(
            **_NO_SPECIAL_IDS, **_DELTA, num_hidden_layers=3,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
            linear_num_key_heads=groups, linear_num_value_heads=4, linear_conv_kernel_dim=conv)
        model = transformers.OlmoHybridForCausalLM(config)
    elif kind in ("mamba", "falcon_mamba"):
        prefix = "Mamba" if kind == "mamba" else "FalconMamba"
        config = getattr(transformers, f"{prefix}Config")(
            **_NO_SPECIAL_IDS, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=conv,
            time_step_rank=4, initializer_range=0.2)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    elif kind == "jamba":
        config = transformers.JambaConfig(
            **_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48, num_hidden_layers=4, attn_layer_period=2,
            attn_layer_offset=1, expert_layer_period=10, num_attention_heads=4, num_key_value_heads=2,
            mamba_d_state=8, mamba_d_conv=conv, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False,
            initializer_range=0.2)
        model = transformers.JambaForCausalLM(config)
    elif kind == "kimi_linear":
        config = transformers.KimiLinearConfig(
            **_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48, num_attention_heads=4,
            num_key_value_heads=4, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_heads=4,
            linear_head_dim=8, linear_conv_kernel_dim=conv, kv_lora_rank=8, qk_rope_head_dim=4,
            qk_nope_head_dim=4, v_head_dim=8, num_local_experts=2, num_experts_per_tok=1,
            moe_intermediate_size=8, initializer_range=0.2)
        model = transformers.KimiLinearForCausalLM(config)
    elif kind in ("falcon_h1", "falcon_h1_norm"):  # without and with the mixer's gated RMS norm
        config = transformers.FalconH1Config(
            **_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_d_state=8, mamba_n_heads=4,
            mamba_d_head=16, mamba_n_groups=groups, mamba_d_ssm=64, mamba_d_conv=conv, mamba_chunk_size=8,
            initializer_range=0.2, ssm_multipliers=[0.8, 1.3, 0.7, 1.1, 0.9], ssm_in_multiplier=1.4,
            ssm_out_multiplier=0.6, attention_in_multiplier=1.2, attention_out_multiplier=0.9,
            mamba_rms_norm=kind == "falcon_h1_norm")
        model = transformers.FalconH1ForCausalLM(config)
    elif kind == "zamba2":  # one shared attention block used by two hybrid layers, with its own RoPE
        config = transformers.Zamba2Config(
            **_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
            layer_types=["mamba", "hybrid", "mamba", "hybrid"], hybrid_layer_ids=[1, 3], num_mem_blocks=1,
            num_attention_heads=4, num_key_value_heads=4, mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8,
            mamba_ngroups=groups, mamba_d_conv=conv, chunk_size=8, use_mem_rope=True, use_mamba_kernels=False,
            initializer_range=0.2)
        model = transformers.Zamba2ForCausalLM(config)
    elif kind == "granite_hybrid":  # specframe_hybrid's conversion of a tiny Llama: layers 1 and 3 Mamba2
        model = tiny_converted_hybrid(seed, mamba_layers=[1, 3])
    elif kind == "lfm2":
        config = transformers.Lfm2Config(
            **_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
            conv_L_cache=conv,
            initializer_range=0.2)
        model = transformers.Lfm2ForCausalLM(config)
    else:
        raise ValueError(kind)
    _randomize_ssm(model, seed)
    if kind != "mamba2" and (dt_min or dt_max != float("inf")):
        for m in model.modules():
            if hasattr(m, "time_step_limit"):
                m.time_step_limit = (dt_min, dt_max)
    model.eval()
    return Target(model=model, tokenizer=None, name=f"tiny-{kind}")


def tiny_llama(seed: int = 0, layers: int = 4) -> transformers.LlamaForCausalLM:
    """A tiny random Llama with grouped-query attention (4 query heads on 2 key/value heads), float32."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**_NO_SPECIAL_IDS, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      initializer_range=0.2, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def tiny_converted_hybrid(seed: int = 0, mamba_layers=(1, 3)) -> torch.nn.Module:
    """A tiny Llama converted by `specframe_hybrid.convert` (GraniteMoeHybrid format), mixers randomized."""
    from specframe_hybrid.convert import convert

    return convert(tiny_llama(seed), list(mamba_layers), seed=seed)


_NO_SPECIAL_IDS = dict(vocab_size=VOCAB, pad_token_id=None, bos_token_id=None, eos_token_id=None)
def cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params else "cache_params"


def one_token_at_a_time(model) -> bool:
    """Mamba-1 models: transformers' multi-token forward restarts their selective scan from a zero state
    (it takes no initial state), so a reference continuing a cache must feed one token per call."""
    from specframe_ssm.layout import MAMBA1, recurrent_layers

    return any(kind == MAMBA1 for _, _, kind in recurrent_layers(model))


@torch.inference_mode()
def run_sequence(model, cache, start: int, tokens: list[int]):
    """Logits (m, V) of the unmodified model on `tokens` at positions start.., extending `cache` in place."""
    if len(tokens) > 1 and one_token_at_a_time(model) and start > 0:
        return torch.cat([run_sequence(model, cache, start + i, [t]) for i, t in enumerate(tokens)])
    ids = torch.tensor([tokens])
    kwargs = {cache_kwarg(model): cache, "use_cache": True}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = start + torch.arange(len(tokens))[None]
    return model(input_ids=ids, **kwargs).logits[0]


def path_reference(model, committed_cache, start: int, tokens: list[int]):
    """(logits (m, V), cache after) of a plain run of `tokens` on a copy of the committed cache."""
    cache = copy.deepcopy(committed_cache)
    return run_sequence(model, cache, start, tokens), cache


def state_tensors(cache) -> dict[str, torch.Tensor]:
    """Every committed tensor of a cache by name: conv/ssm states and attention keys/values."""
    out = {}
    for i, layer in enumerate(cache.layers):
        if hasattr(layer, "conv_states"):
            if layer.has_previous_state[0]:
                out[f"conv{i}"] = layer.conv_states[0].clone()
                if layer.recurrent_states[0] is not None:  # LFM2's short convs keep a conv window only
                    out[f"ssm{i}"] = layer.recurrent_states[0].clone()
        # not `elif`: Falcon-H1's layers hold both recurrent states and keys/values
        if getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None:
            out[f"keys{i}"] = layer.keys.clone()
            out[f"values{i}"] = layer.values.clone()
    return out


@torch.inference_mode()
def prefix_cache(model, tokens: list[int]):
    """The cache after a plain run of `tokens` from an empty state (the committed state a reference continues
    from; empty for no tokens)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if tokens:
        run_sequence(model, cache, 0, tokens)
    return cache


def committed_state(backend) -> dict[str, torch.Tensor]:
    """`state_tensors` of the committed state of an SSM backend decoding one sequence: `ssm-unrolled`'s cache
    without a scored tree's keys, or the one row `ssm-tree`'s rows form holds for it (`SSMRows`), named as
    transformers' cache of that sequence would name them."""
    from specframe_ssm.cache import crop_kv

    if backend.name == "ssm-unrolled":
        cache = copy.deepcopy(backend.cache)
        crop_kv(cache, backend.layout.attention, backend.committed_length)
        return state_tensors(cache)
    rows, row = backend._sequence  # the contract's one-row batch (`StateBackend.prefill`)
    state, out = rows.rows[row], {}
    if not state.length:
        return out  # nothing fed yet: transformers' cache holds no state either
    for i, (conv, h) in state.states.items():
        out[f"conv{i}"] = conv[None].clone()
        if h is not None:
            out[f"ssm{i}"] = h[None].clone()
    for i, layer in zip(backend.layout.attention, rows.kv.layers if rows.kv else []):
        out[f"keys{i}"] = layer.key_buffer[state.slot, :, :state.length][None].clone()
        out[f"values{i}"] = layer.value_buffer[state.slot, :, :state.length][None].clone()
    return out


@torch.inference_mode()
def reference_greedy(target: Target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding with the unmodified model, one token per forward."""
    from transformers import DynamicCache

    model = target.model
    cache = DynamicCache(config=model.config)
    logits = run_sequence(model, cache, 0, prompt)[-1]
    out: list[int] = []
    while len(out) < max_new_tokens:
        out.append(int(logits.argmax()))
        logits = run_sequence(model, cache, len(prompt) + len(out) - 1, [out[-1]])[-1]
    return out


def make_repetitive(target: Target, cycle: int = 5, boost: float = 4.0) -> Target:
    """Point the output head at a permutation of the input embeddings (cycles of `cycle` tokens) and make
    the embeddings `boost` times larger, so greedy text tends to loop and prompt lookup drafts get
    accepted. The SSM and attention layers still shape the logits; the head is untied from the embeddings."""
    model = target.model
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(boost)
    emb = model.get_input_embeddings().weight.detach().clone()  # (V, D)
    vocab = emb.shape[0]
    succ = torch.arange(vocab)
    full = vocab - vocab % cycle
    succ[:full] = (succ[:full] // cycle) * cycle + (succ[:full] % cycle + 1) % cycle
    head = torch.empty_like(emb)
    head[succ] = emb  # the logit of succ(t) is large when the hidden state looks like emb[t]
    model.lm_head.weight = torch.nn.Parameter(head)
    return target


def scores_by_scan(target: Target) -> dict[str, torch.Tensor]:
    """The logits `ssm-tree` gives one forest of two trees after a four-token prompt, with the PyTorch scan
    (`torch`) and with the Triton kernel (`triton`): the kernel tests compare the two."""
    from specframe_ssm import SSMTreeBackend

    tree = TokenTree(np.array([1, 2, 3, 4, 5, 6]), np.array([-1, 0, 0, 1, -1, 4]))
    scores = {}
    for scan in ("torch", "triton"):
        backend = SSMTreeBackend(target, scan=scan)
        backend.prefill([7, 8, 9, 10])
        scores[scan] = backend.score(tree).logits
    return scores
