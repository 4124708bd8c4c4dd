"""The tree forward and commit of LFM2's gated short convolution, swapped in for the layer's own forward
while a tree is scored, as `specframe_ssm.mixer` does for Mamba2.

The layer projects B, C and x, convolves B * x depthwise over the last few tokens (its only state is that
window) and gates the result with C. On a tree each node's window follows its ancestor chain
(`tree_conv`, the Mamba2 conv's tree form, without an activation); the commit keeps the last inputs of
the accepted path.
"""

from __future__ import annotations

import torch

from specframe_ssm.tree_ops import commit_conv, over_rows, tree_conv


def tree_short_conv_forward(layer, run, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Layer output (R, T, D) for the packed trees in `hidden_states` (R, T, D); saves the conv inputs."""
    B, C, x = layer.in_proj(hidden_states).chunk(3, dim=-1)  # (R, T, D) each
    bx = B * x
    conv_state, _ = run.states[layer.layer_idx]
    weight = layer.conv.weight[:, 0, :]
    out = over_rows(lambda xs, conv, index: tree_conv(xs, conv, weight, layer.conv.bias, index, lambda v: v),
                    bx, conv_state, run.conv_index)  # (R, T, D)
    run.saved[layer.layer_idx] = bx
    return layer.out_proj(C * out)


def commit_short_conv(layer, state, bx: torch.Tensor, index: torch.Tensor, rule: str):
    """(conv (D, K), None): the window after the packed nodes `index`; the layer has no other state."""
    return commit_conv(state[0], bx.index_select(0, index)), None
