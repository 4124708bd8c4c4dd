"""The tree forward and commit of a gated delta-rule layer (gated DeltaNet in Qwen3-Next and OLMo-hybrid,
Kimi delta attention in Kimi Linear), swapped in for the layer's own forward while a tree is scored, as
`specframe_ssm.mixer` does for Mamba2.

All three project q, k, v (one depthwise causal conv over their concatenation, then SiLU), a gate for the
output norm, beta = sigmoid(b) and a log-decay; they differ in how the projections are laid out and in
the decay: one per head, -exp(A_log) softplus(a + dt_bias), for gated DeltaNet, one per key channel
(the forget gate) for Kimi (`delta_inputs`, `head_dims`). The conv runs along each node's ancestor chain
(`tree_conv`), the recurrence through `tree_delta_rule`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from specframe_ssm.delta_rule import commit_delta_closed, commit_delta_replay, l2norm, tree_delta_rule
from specframe_ssm.tree_ops import commit_conv, over_rows, tree_conv

COMMIT_RULES = {"replay": commit_delta_replay, "closed": commit_delta_closed}


@dataclass
class DeltaInputs:
    """One layer's per-token inputs to the conv and the recurrence, R rows of T tokens."""

    mixed: torch.Tensor  # (R, T, 2 key_dim + value_dim) q, k, v before the conv
    gate: torch.Tensor  # (R, T, H, dv) the output norm's gate
    beta: torch.Tensor  # (R, T, H)
    log_decay: torch.Tensor  # (R, T, H), or (R, T, H, dk) per key channel (Kimi); float32, <= 0


@dataclass
class SavedDeltaNodes:
    """Per-node activations of one gated DeltaNet layer on the scored trees (R rows), kept for the commit."""

    mixed: torch.Tensor  # (R, T, Cd) pre-conv inputs
    k: torch.Tensor  # (R, T, H, dk) normalised keys, repeated to the value heads
    v: torch.Tensor  # (R, T, H, dv)
    log_decay: torch.Tensor  # (R, T, H) or (R, T, H, dk)
    beta: torch.Tensor  # (R, T, H)
    u: torch.Tensor  # (R, T, H, dv) delta updates along each node's path


def _log_decay(layer, a: torch.Tensor) -> torch.Tensor:
    return -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)  # (T, H)


def head_dims(layer) -> tuple[int, int, int, int, int, int]:
    """(key_dim, value_dim, key heads, value heads, key head dim, value head dim) of the layer."""
    if hasattr(layer, "forget_gate"):  # Kimi: as many key as value heads, one head dim
        return layer.qkv_dim, layer.qkv_dim, layer.num_heads, layer.num_heads, layer.head_dim, layer.head_dim
    return (layer.key_dim, layer.value_dim, layer.num_k_heads, layer.num_v_heads, layer.head_k_dim,
            layer.head_v_dim)


def delta_inputs(layer, hidden: torch.Tensor) -> DeltaInputs:
    """The projections of `hidden` (R, T, D) by a Qwen3-Next, OLMo-hybrid or Kimi Linear delta layer."""
    R, T = hidden.shape[:2]
    if hasattr(layer, "forget_gate"):  # Kimi delta attention: low-rank gates, a decay per key channel
        mixed = torch.cat([layer.q_proj(hidden), layer.k_proj(hidden), layer.v_proj(hidden)], dim=-1)
        gate = layer.g_b_proj(layer.g_a_proj(hidden)).reshape(R, T, layer.num_heads, layer.head_dim)
        beta = layer.b_proj(hidden).sigmoid()
        return DeltaInputs(mixed, gate, beta, layer.forget_gate(hidden).float())  # decay (R, T, H, dk)
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: fused, grouped by key head
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(hidden),
                                                              layer.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(R, T, -1) for x in (q, k, v)], dim=-1)
        return DeltaInputs(mixed, z, b.sigmoid(), _log_decay(layer, a))
    # OLMo-hybrid: separate projections, beta optionally doubled (negative eigenvalues allowed)
    mixed = torch.cat([layer.q_proj(hidden), layer.k_proj(hidden), layer.v_proj(hidden)], dim=-1)
    beta = layer.b_proj(hidden).sigmoid() * (2.0 if layer.allow_neg_eigval else 1.0)
    gate = layer.g_proj(hidden).reshape(R, T, -1, layer.head_v_dim)
    return DeltaInputs(mixed, gate, beta, _log_decay(layer, layer.a_proj(hidden)))


def _output_modules(layer):
    """(gated RMS norm, output projection) of the layer."""
    if hasattr(layer, "in_proj_qkvz"):
        return layer.norm, layer.out_proj
    return layer.o_norm, layer.o_proj


def tree_delta_forward(layer, run, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Layer output (R, T, D) for the packed trees in `hidden_states` (R, T, D); saves what commit needs."""
    dtype, (R, T) = hidden_states.dtype, hidden_states.shape[:2]
    inputs = delta_inputs(layer, hidden_states)
    conv_state, h0 = run.states[layer.layer_idx]
    weight, act = layer.conv1d.weight[:, 0, :], ACT2FN[layer.activation]
    mixed = over_rows(lambda xs, conv, index: tree_conv(xs, conv, weight, layer.conv1d.bias, index, act),
                      inputs.mixed, conv_state, run.conv_index)  # (R, T, Cd)
    key_dim, value_dim, k_heads, heads, dk, dv = head_dims(layer)
    q, k, v = mixed.split([key_dim, key_dim, value_dim], dim=-1)
    q = q.reshape(R, T, k_heads, dk).repeat_interleave(heads // k_heads, dim=2)
    k = k.reshape(R, T, k_heads, dk).repeat_interleave(heads // k_heads, dim=2)
    v = v.reshape(R, T, heads, dv)
    q = l2norm(q.float()) / dk ** 0.5  # (R, T, H, dk)
    k = l2norm(k.float())
    out, u = over_rows(tree_delta_rule, q, k, v, inputs.log_decay, inputs.beta, run.mask, h0)  # (R, T, H, dv)
    run.saved[layer.layer_idx] = SavedDeltaNodes(inputs.mixed, k, v.float(), inputs.log_decay,
                                                 inputs.beta.float(), u)
    norm, project = _output_modules(layer)
    out = norm(out.to(dtype).reshape(-1, dv), inputs.gate.reshape(-1, dv))
    return project(out.reshape(R, T, -1))  # (R, T, D)


def commit_delta(layer, state, nodes: SavedDeltaNodes, index: torch.Tensor, rule: str):
    """(conv (Cd, K), recurrent state (H, dk, dv)) after the packed nodes `index` (root first)."""
    conv, h0 = state
    pick = [t.index_select(0, index) for t in (nodes.k, nodes.v, nodes.log_decay, nodes.beta, nodes.u)]
    return commit_conv(conv, nodes.mixed.index_select(0, index)), COMMIT_RULES[rule](h0, *pick)
