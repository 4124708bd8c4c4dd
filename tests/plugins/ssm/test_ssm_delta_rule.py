"""The tree form of the gated delta rule (specframe_ssm.delta_rule) against the plain recurrence, run
node by node along every root-to-node chain of random trees; and its two commit rules against each other."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st
from test_ssm_tree_ops import ancestor_mask, chain_of

from specframe_ssm.delta_rule import commit_delta_closed, commit_delta_replay, l2norm, tree_delta_rule


def random_delta_inputs(T: int, H: int, dk: int, dv: int, seed: int, beta_max: float = 1.0,
                        per_channel: bool = False):
    """Inputs of one layer; `per_channel`: one log-decay per key channel (Kimi delta attention)."""
    gen = torch.Generator().manual_seed(seed)
    return dict(q=l2norm(torch.randn(T, H, dk, generator=gen)) / dk ** 0.5,
                k=l2norm(torch.randn(T, H, dk, generator=gen)), v=torch.randn(T, H, dv, generator=gen),
                log_decay=-torch.rand(T, H, *([dk] if per_channel else []), generator=gen) * 2,
                beta=torch.rand(T, H, generator=gen) * beta_max,
                h0=torch.randn(H, dk, dv, generator=gen))


def recurrent_step(h, q, k, v, log_decay, beta):
    """One step of the gated delta rule as transformers' recurrent references write it."""
    h = h * torch.exp(log_decay).reshape(h.shape[0], -1, 1)
    delta = (v - torch.einsum("hkv,hk->hv", h, k)) * beta[:, None]
    h = h + k[:, :, None] * delta[:, None, :]
    return h, torch.einsum("hkv,hk->hv", h, q)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=14), st.sampled_from([1.0, 2.0]),
       st.booleans(), st.booleans())
def test_tree_delta_rule_equals_the_recurrence_on_every_chain(seeds, beta_max, with_state, per_channel):
    """beta up to 2 covers OLMo-hybrid's negative eigenvalues; without a state, the zero state; per-channel
    decays, Kimi delta attention."""
    parents = [-1] + [s % i for i, s in enumerate(seeds[1:], start=1)]
    inputs = random_delta_inputs(len(parents), 3, 4, 5, sum(seeds), beta_max, per_channel)
    h0 = inputs.pop("h0") * (1.0 if with_state else 0.0)
    out, _ = tree_delta_rule(**inputs, mask=ancestor_mask(parents), h0=h0 if with_state else None)
    for leaf in range(len(parents)):
        h = h0.clone()
        for j in chain_of(leaf, parents):
            h, want = recurrent_step(h, *(inputs[n][j] for n in ("q", "k", "v", "log_decay", "beta")))
            torch.testing.assert_close(out[j], want, atol=1e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=10), st.booleans(), st.booleans())
def test_commit_rules_agree_on_any_path_of_a_tree(seeds, with_state, per_channel):
    parents = [-1] + [s % i for i, s in enumerate(seeds[1:], start=1)]
    inputs = random_delta_inputs(len(parents), 2, 4, 3, sum(seeds), 2.0, per_channel)
    h0 = inputs.pop("h0")
    h0 = h0 if with_state else None
    _, u = tree_delta_rule(**inputs, mask=ancestor_mask(parents), h0=h0)
    path = chain_of(len(parents) - 1, parents)
    picked = [inputs[n][path] for n in ("k", "v", "log_decay", "beta")]
    replay = commit_delta_replay(h0, *picked)
    torch.testing.assert_close(commit_delta_closed(h0, *picked, u=u[path]), replay, atol=1e-5, rtol=1e-5)
    h = torch.zeros_like(replay) if h0 is None else h0.clone()
    for j in path:
        h, _ = recurrent_step(h, *(inputs[n][j] for n in ("q", "k", "v", "log_decay", "beta")))
    torch.testing.assert_close(replay, h, atol=1e-6, rtol=1e-6)
