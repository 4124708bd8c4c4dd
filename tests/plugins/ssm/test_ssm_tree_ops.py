"""Tree conv, commit rules and the tree-scan reference, checked against plain sequential computations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specframe_kernels import tree_scan, tree_scan_ref
from specframe_ssm.tree_ops import (
    commit_conv, commit_ssm_closed, commit_ssm_replay, conv_window_index, discretize, tree_conv,
)


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def chain_of(node: int, parents: list[int]) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def test_conv_window_index_by_hand():
    # packed root 0, child 1, grandchild 2, and a second child 3 of the root; K = 4: ext rows 0..3 are the
    # committed columns (3 newest), rows 4.. are the nodes.
    index = conv_window_index(torch.tensor([-1, 0, 1, 0]), 4)
    assert index.tolist() == [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6], [2, 3, 4, 7]]


def test_conv_window_index_deeper_than_the_kernel():
    index = conv_window_index(torch.tensor([-1, 0, 1, 2, 3, 4]), 3)
    assert index[5].tolist() == [3 + 3, 3 + 4, 3 + 5]  # only tree nodes, no committed column


def sequential_conv(conv: torch.Tensor, xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """F.conv1d over [committed | sequence], as transformers does for a plain continuation."""
    full = torch.cat([conv, xbc.t()], dim=1)[None]  # (1, Cd, K + m)
    out = torch.nn.functional.conv1d(full, weight[:, None, :], bias, groups=weight.shape[0])  # (1, Cd, m + 1)
    return torch.nn.functional.silu(out[0, :, 1:].t())  # (m, Cd)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 1_000_000), min_size=1, max_size=14), st.integers(2, 5))
def test_tree_conv_equals_sequential_conv_on_every_chain(seeds, width):
    parents = [-1] + [s % (i + 1) - 1 for i, s in enumerate(seeds[1:], start=1)]  # a forest: -1 allowed
    T, Cd = len(parents), 6
    gen = torch.Generator().manual_seed(len(seeds) * 7 + width)
    conv, xbc = torch.randn(Cd, width, generator=gen), torch.randn(T, Cd, generator=gen)
    weight, bias = torch.randn(Cd, width, generator=gen), torch.randn(Cd, generator=gen)
    out = tree_conv(xbc, conv, weight, bias, conv_window_index(torch.tensor(parents), width),
                    torch.nn.functional.silu)  # (T, Cd)
    for leaf in range(T):
        chain = chain_of(leaf, parents)
        want = sequential_conv(conv, xbc[chain], weight, bias)
        torch.testing.assert_close(out[chain], want, atol=1e-5, rtol=1e-5)
        new = commit_conv(conv, xbc[chain])
        torch.testing.assert_close(new, torch.cat([conv, xbc[chain].t()], 1)[:, -width:])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.sampled_from([1, 2]), st.integers(0, 10_000))
def test_replay_and_closed_form_commit_agree(length, groups, seed):
    gen = torch.Generator().manual_seed(seed)
    H, P, N = 4, 3, 5
    h0, x = torch.randn(H, P, N, generator=gen), torch.randn(length, H, P, generator=gen)
    dt, A = torch.rand(length, H, generator=gen), -torch.rand(H, generator=gen) * 2
    B = torch.randn(length, groups, N, generator=gen)
    torch.testing.assert_close(commit_ssm_closed(h0, x, dt, A, B), commit_ssm_replay(h0, x, dt, A, B),
                               atol=1e-5, rtol=1e-5)


def test_discretize_applies_softplus_then_clamp():
    dt = discretize(torch.tensor([[-30.0, 0.0, 30.0]]), torch.zeros(3), (0.1, 5.0))
    torch.testing.assert_close(dt, torch.tensor([[0.1, 0.6931472, 5.0]]))


def random_scan_inputs(T: int, H: int, G: int, P: int, N: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(T, H, P, generator=gen), dt=torch.rand(T, H, generator=gen) * 0.7,
                A=-torch.rand(H, generator=gen) * 3, B=torch.randn(T, G, N, generator=gen),
                C=torch.randn(T, G, N, generator=gen), D=torch.randn(H, generator=gen),
                h0=torch.randn(H, P, N, generator=gen))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=12), st.sampled_from([1, 2, 4]))
def test_tree_scan_ref_equals_sequential_recurrence_on_every_chain(seeds, groups):
    parents = [-1] + [s % i for i, s in enumerate(seeds[1:], start=1)]
    T, H, P, N = len(parents), 4, 3, 5
    inputs = random_scan_inputs(T, H, groups, P, N, sum(seeds))
    y = tree_scan_ref(mask=ancestor_mask(parents), **inputs)  # (T, H, P)
    Bh = inputs["B"].repeat_interleave(H // groups, 1)
    Ch = inputs["C"].repeat_interleave(H // groups, 1)
    for leaf in range(T):
        h = inputs["h0"].clone()
        for j in chain_of(leaf, parents):  # h <- exp(dt A) h + dt x B^T ; y = C h + D x
            dt = inputs["dt"][j]
            update = (dt[:, None] * inputs["x"][j])[..., None] * Bh[j][:, None]  # (H, P, N)
            h = torch.exp(dt * inputs["A"])[:, None, None] * h + update
            want = torch.einsum("hpn,hn->hp", h, Ch[j]) + inputs["D"][:, None] * inputs["x"][j]
            torch.testing.assert_close(y[j], want, atol=1e-5, rtol=1e-5)


def test_tree_scan_without_state_or_skip_and_with_per_channel_skip():
    inputs = random_scan_inputs(5, 2, 1, 3, 4, seed=3)
    mask = ancestor_mask([-1, 0, 0, 1, 3])
    base = tree_scan_ref(**{**inputs, "h0": None, "D": None}, mask=mask)
    with_state = tree_scan_ref(**{**inputs, "D": None}, mask=mask)
    assert not torch.allclose(base, with_state)
    per_channel = inputs["D"][:, None].expand(2, 3)
    torch.testing.assert_close(tree_scan_ref(**{**inputs, "D": per_channel}, mask=mask),
                               tree_scan_ref(**inputs, mask=mask))


def test_tree_scan_dispatch_uses_torch_on_cpu_and_rejects_unknown_impl():
    inputs = random_scan_inputs(4, 2, 1, 3, 4, seed=1)
    mask = ancestor_mask([-1, 0, 1, 0])
    torch.testing.assert_close(tree_scan(**inputs, mask=mask), tree_scan_ref(**inputs, mask=mask))
    with pytest.raises(ValueError, match="impl"):
        tree_scan(**inputs, mask=mask, impl="cuda")
