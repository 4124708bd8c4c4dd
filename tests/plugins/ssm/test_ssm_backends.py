"""`ssm-tree` and `ssm-unrolled` against the naive per-path reference (tests/helpers/ssm_models.py), on
Mamba2,
Bamba, NemotronH, the delta-rule hybrids Qwen3-Next, OLMo-hybrid and Kimi Linear, the Mamba-1 models Mamba,
FalconMamba and Jamba, and LFM2's short convolutions: tree logits
equal plain per-path logits, scoring never touches the committed state, and after committing any path the
conv state, SSM state, KV cache and next-token logits equal those of the plain sequential run."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from ssm_models import (
    VOCAB, committed_state, make_repetitive, path_reference, prefix_cache, run_sequence, state_tensors,
    tiny_ssm_target,
)
from transformers import LlamaConfig, LlamaForCausalLM

from specframe import SpeculativeDecoder, Target, TokenTree, UnsupportedModelError, get_registry
from first_party import first_party_registry, own_words
from specframe.plugging.pipeline import backend_refusal

PROMPT = [5, 9, 3, 7, 11, 2, 8, 9, 3]
TREES = {
    "chain": [-1, 0, 1, 2, 3, 4],
    "star": [-1, -1, -1, -1, -1],
    "shallow": [-1, 0, 0, 1, -1],  # depth 2, below the conv width
    "deep": [-1, 0, 1, 2, 3, 1, 5, 6, 7],  # depth 5, the conv window leaves the committed state
    "several roots": [-1, -1, 1, 0, 2, -1, 5],
}
ATOL = 1e-5
# Deeper stacks round a little more (two gated DeltaNet layers with beta up to 2 in OLMo-hybrid, Zamba2's
# shared blocks, the triangular solve of the tree delta rule): a few 1e-5 of logits up to ~4. Hypothesis
# found 6.1e-5 on a Qwen3-Next star of 7 nodes, and 2.1e-5 on a Jamba star of 7 nodes under one root
# after a one-token prompt; a wrong mask or decay moves logits by 1e-2 and more.
LOOSE_ATOL = 1e-4
DELTA_FAMILIES = ("qwen3_next", "olmo_hybrid", "kimi_linear")
SHORT_CONV_FAMILIES = ("lfm2",)
# Mamba2 and attention in one layer: in parallel with muP scalings (Falcon-H1), after a shared block (Zamba2)
PARALLEL_FAMILIES = ("falcon_h1", "falcon_h1_norm", "zamba2")
MAMBA1_FAMILIES = ("mamba", "falcon_mamba", "jamba")  # ssm-tree only: see test_unrolled_refuses_mamba1


def backend_cls(name: str):
    return get_registry().get("backend", name)


def make_tree(parents: list[int], seed: int = 0) -> TokenTree:
    rng = np.random.default_rng(seed)
    return TokenTree(rng.integers(0, VOCAB, len(parents)), np.array(parents))


def packed_path(path: list[int]) -> list[int]:
    return [0] + [i + 1 for i in path]


def tolerance(target: Target) -> float:
    loose = (*DELTA_FAMILIES, "zamba2", "granite_hybrid", "jamba")
    return LOOSE_ATOL if target.name.removeprefix("tiny-") in loose else ATOL


def check_scores(target: Target, backend: str, tree: TokenTree, prompt=PROMPT, **options):
    """Score `tree`; compare every root-to-leaf path with the reference (the unmodified model continuing a
    plain run of the prompt); check nothing committed moved."""
    b = backend_cls(backend)(target, **options)
    b.prefill(prompt)
    before = committed_state(b)
    scores = b.score(tree)
    assert scores.logits.shape == (len(tree) + 1, target.vocab_size)
    after = committed_state(b)
    assert sorted(after) == sorted(before)
    for name, tensor in before.items():
        torch.testing.assert_close(after[name], tensor, atol=0, rtol=0)
    start, committed = len(prompt) - 1, prefix_cache(target.model, prompt[:-1])
    for path in tree.paths or [[]]:
        tokens = [prompt[-1], *tree.tokens[path].tolist()]
        want, _ = path_reference(target.model, committed, start, tokens)
        atol = tolerance(target)
        torch.testing.assert_close(scores.logits[packed_path(path)], want, atol=atol, rtol=atol)
    return b, scores


def check_commit(target: Target, backend: str, tree: TokenTree, node: int, prompt=PROMPT, **options):
    """Commit the path to `node` (-1: the root alone); compare states and next logits with a plain run."""
    b = backend_cls(backend)(target, **options)
    b.prefill(prompt)
    scores = b.score(tree)
    path = tree.path_to(node) if node >= 0 else []
    tokens = [prompt[-1], *tree.tokens[path].tolist()]
    committed = prefix_cache(target.model, prompt[:-1])
    _, want_cache = path_reference(target.model, committed, len(prompt) - 1, tokens)
    bonus = 13
    b.commit(scores, path, bonus)
    assert b.committed_length == len(prompt) - 1 + len(tokens)
    got, want = committed_state(b), state_tensors(want_cache)
    assert sorted(got) == sorted(want)
    atol = tolerance(target)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=atol, msg=name)
    next_logits = b.score(TokenTree.empty()).logits[0]
    want_next = run_sequence(target.model, want_cache, b.committed_length, [bonus])[0]  # a one-token step
    torch.testing.assert_close(next_logits, want_next, atol=atol, rtol=atol)


FAMILIES = ["mamba2", "bamba", "nemotronh", "granite_hybrid", *DELTA_FAMILIES, *MAMBA1_FAMILIES,
            *SHORT_CONV_FAMILIES, *PARALLEL_FAMILIES]


@pytest.fixture(scope="module", params=FAMILIES)
def target(request) -> Target:
    return tiny_ssm_target(request.param)


@pytest.mark.parametrize("backend", ["ssm-tree", "ssm-unrolled"])
@pytest.mark.parametrize("shape", list(TREES))
def test_tree_logits_equal_per_path_logits(target, backend, shape):
    if backend == "ssm-unrolled" and target.name.removeprefix("tiny-") in MAMBA1_FAMILIES:
        pytest.skip("ssm-unrolled refuses Mamba-1 models (test_unrolled_refuses_mamba1)")
    check_scores(target, backend, make_tree(TREES[shape]))


@pytest.mark.parametrize("shape", ["deep", "several roots"])
def test_commit_any_path_equals_sequential_run(target, shape):
    tree = make_tree(TREES[shape])
    for node in range(-1, len(tree)):
        check_commit(target, "ssm-tree", tree, node)


@pytest.mark.parametrize("min_rows", [1, 4, 7])
def test_padding_changes_neither_scores_nor_commits(target, min_rows):
    """`ssm-tree` pads every forward, a plain step included, with a throwaway chain up to `min_rows` rows
    (4 on the CPU): the real rows' logits and the state after any commit are the reference's."""
    for parents, node in (([], -1), ([-1], 0), ([-1, 0, -1], 1), ([-1, 0, -1], 2)):
        tree = make_tree(parents)
        _, scores = check_scores(target, "ssm-tree", tree, min_rows=min_rows)
        assert scores.tree is tree
        check_commit(target, "ssm-tree", tree, node=node, min_rows=min_rows)


def test_unrolled_commit_equals_sequential_run(target):
    if target.name.removeprefix("tiny-") in MAMBA1_FAMILIES:
        pytest.skip("ssm-unrolled refuses Mamba-1 models (test_unrolled_refuses_mamba1)")
    tree = make_tree(TREES["several roots"])
    for node in (-1, 4, 6):
        check_commit(target, "ssm-unrolled", tree, node)


@pytest.mark.parametrize("kind", ["mamba2", *DELTA_FAMILIES, *MAMBA1_FAMILIES, *SHORT_CONV_FAMILIES])
@pytest.mark.parametrize("commit", ["replay", "closed"])
def test_commit_rules_agree_with_the_reference(kind, commit):
    target = tiny_ssm_target(kind)
    check_commit(target, "ssm-tree", make_tree(TREES["deep"]), node=8, commit=commit)


@pytest.mark.parametrize("kind", ["mamba2", *DELTA_FAMILIES, *MAMBA1_FAMILIES, *SHORT_CONV_FAMILIES])
@pytest.mark.parametrize(("groups", "conv"), [(1, 4), (2, 2), (4, 3)])
def test_group_counts_and_conv_widths(kind, groups, conv):
    """Mamba2 B/C groups, or gated DeltaNet key heads shared by 4, 2 or 1 value heads (other families ignore
    `groups`); conv widths below and above the deep tree's depth."""
    target = tiny_ssm_target(kind, groups=groups, conv=conv, seed=groups + conv)
    tree = make_tree(TREES["deep"])
    check_scores(target, "ssm-tree", tree)
    check_commit(target, "ssm-tree", tree, node=7)


@torch.inference_mode()
def stepwise_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(1 + m, V) logits as `generate` computes them: the prompt in one forward (its last row), then each
    of `tokens` in a forward of its own."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    rows = [run_sequence(model, cache, 0, prompt)[-1]]
    for i, token in enumerate(tokens):
        rows.append(run_sequence(model, cache, len(prompt) + i, [token])[0])
    return torch.stack(rows)


@pytest.mark.parametrize("backend_name", ["ssm-tree", "ssm-unrolled"])
@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
@pytest.mark.parametrize("limit", [(0.6, float("inf")), (0.0, 0.3)], ids=["lower", "upper"])
def test_a_dt_limit_is_applied_as_plain_greedy_decoding_applies_it(kind, limit, backend_name):
    """transformers clamps dt to `time_step_limit` in a multi-token forward (the prompt) but not in its
    one-token step (each new token, as `generate` feeds them): both backends score and commit as
    `generate` decodes, and their output equals `generate`'s."""
    target = make_repetitive(tiny_ssm_target(kind, dt_min=limit[0], dt_max=limit[1], seed=3))
    free = make_repetitive(tiny_ssm_target(kind, seed=3))
    prompt, tree = [5, 9, 3, 7, 11, 2, 8, 9, 3, 7], make_tree(TREES["shallow"])
    backend = backend_cls(backend_name)(target)
    backend.prefill(prompt)
    first = backend.score(tree)
    # The clamp moves logits by more than 1e-3 (asserted below); Bamba's attention layer rounds by up to a
    # few 1e-5 against step-by-step decoding on some CPUs' kernels, so the deeper stacks' tolerance applies.
    for path in tree.paths:
        want = stepwise_logits(target.model, prompt, tree.tokens[path].tolist())
        torch.testing.assert_close(first.logits[packed_path(path)], want, atol=LOOSE_ATOL, rtol=ATOL)
    path, bonus = tree.path_to(3), 13
    backend.commit(first, path, bonus)
    history = [*tree.tokens[path].tolist(), bonus]
    second = backend.score(tree)
    for path in tree.paths:
        want = stepwise_logits(target.model, prompt, history + tree.tokens[path].tolist())[len(history):]
        torch.testing.assert_close(second.logits[packed_path(path)], want, atol=LOOSE_ATOL, rtol=ATOL)
        unclamped = stepwise_logits(free.model, prompt, history + tree.tokens[path].tolist())[len(history):]
        assert not torch.allclose(want, unclamped, atol=1e-3)  # the clamp binds in the prompt
    ids = torch.tensor([prompt])
    generated = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                      do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    decoder = SpeculativeDecoder.from_names(target, "pld", backend=backend_name, budget=4)
    assert decoder.generate(prompt, 16).tokens == generated


@pytest.mark.parametrize("kind", ["mamba2", "bamba", *DELTA_FAMILIES, *MAMBA1_FAMILIES, *SHORT_CONV_FAMILIES])
def test_single_token_prompt_starts_from_an_empty_state(kind):
    target = tiny_ssm_target(kind)
    tree = make_tree(TREES["deep"])
    check_scores(target, "ssm-tree", tree, prompt=[4])
    check_commit(target, "ssm-tree", tree, node=4, prompt=[4])


def test_scoring_twice_then_committing(target):
    b = backend_cls("ssm-tree")(target)
    b.prefill(PROMPT)
    stale = b.score(make_tree(TREES["star"], seed=1))
    tree = make_tree(TREES["deep"])
    scores = b.score(tree)
    with pytest.raises(ValueError, match="latest score"):
        b.commit(stale, [0], 7)  # its per-node states belong to a discarded scoring
    b.commit(scores, tree.path_to(3), 7)
    fresh = backend_cls("ssm-tree")(target)
    fresh.prefill(PROMPT)
    fresh_scores = fresh.score(tree)
    torch.testing.assert_close(fresh_scores.logits, scores.logits)
    fresh.commit(fresh_scores, tree.path_to(3), 7)
    for name, tensor in committed_state(fresh).items():
        torch.testing.assert_close(committed_state(b)[name], tensor)


_TARGETS: dict[str, Target] = {}


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_trees(data):
    kind = data.draw(st.sampled_from(FAMILIES))
    target = _TARGETS.setdefault(kind, tiny_ssm_target(kind))
    size = data.draw(st.integers(1, 12))
    parents = [data.draw(st.integers(-1, i - 1)) for i in range(size)]
    tree = make_tree(parents, seed=data.draw(st.integers(0, 1000)))
    prompt = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12))
    check_scores(target, "ssm-tree", tree, prompt=prompt)
    check_commit(target, "ssm-tree", tree, node=data.draw(st.integers(-1, size - 1)), prompt=prompt)


@pytest.mark.parametrize("kind", MAMBA1_FAMILIES)
def test_unrolled_refuses_mamba1(kind):
    """transformers' multi-token Mamba-1 forward starts its scan from zeros: paths cannot run as sequences
    after a prefix, so ssm-unrolled says so and names ssm-tree, which serves the model."""
    target = tiny_ssm_target(kind)
    assert backend_cls("ssm-tree").unsupported_reason(target) is None
    reason = refusal(target, "ssm-unrolled")
    assert "zero state" in reason and reason.count("use the 'ssm-tree' backend") == 1, reason
    with pytest.raises(UnsupportedModelError, match="ssm-unrolled"):
        backend_cls("ssm-unrolled")(target)
    check_recommendations(target)


def test_attention_only_model_is_refused():
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    target = Target(model, None, "tiny-llama")
    assert "no Mamba2 layers" in backend_cls("ssm-tree").unsupported_reason(target)
    reason = refusal(target, "ssm-tree")  # the registry adds: kv serves it
    assert "no Mamba2 layers" in reason and "use the 'kv' backend" in reason
    check_recommendations(target)


def test_kv_backend_refuses_ssm_models(target):
    assert "use the 'ssm-tree' backend" in refusal(target, "kv")
    check_recommendations(target)


RECOMMENDS = re.compile(r"(?:use|or) the '([\w-]+)' backend")


def refusal(target: Target, backend: str) -> str | None:
    """`backend`'s refusal of `target` as the registry composes it, among specframe's own backends."""
    return backend_refusal(target, backend, first_party_registry())


def check_recommendations(target: Target) -> None:
    """A backend's refusal, as the registry composes it, recommends only backends that accept the model
    (naming one in an explanation, as in "the Mamba2 tree scan (ssm-tree)", is not a recommendation)."""
    for name in ("kv", "ssm-tree"):
        reason = refusal(target, name) or ""
        for other in RECOMMENDS.findall(own_words(reason)):
            assert backend_cls(other).unsupported_reason(target) is None, f"{name} names {other}: {reason}"


@pytest.mark.parametrize(("family", "renamed", "what"), [
    ("mamba", "ZambaMambaMixer", "a Mamba-1 selective scan (ZambaMambaMixer)"),
    ("qwen3_next", "FutureGatedDeltaNet", "a gated delta-rule linear attention (FutureGatedDeltaNet)"),
    ("lfm2", "FutureShortConv", "a gated short convolution (FutureShortConv)"),
])
def test_recurrent_layers_of_unknown_classes_are_refused_with_what_they_are(family, renamed, what):
    """A layer of a kind ssm-tree knows but of a class it has no tree form for (Zamba's mixers, whose A is
    laid out per head; a future delta-rule or short-conv layer) is refused by every backend, named."""
    target = tiny_ssm_target(family)
    for module in list(target.model.modules()):
        if type(module).__name__ in ("MambaMixer", "Qwen3NextGatedDeltaNet", "Lfm2ShortConv"):
            module.__class__ = type(renamed, (type(module),), {})
    for name in ("kv", "ssm-tree", "ssm-unrolled"):
        reason = refusal(target, name)
        assert what in reason and "no installed backend serves it yet" in reason, reason
        assert not RECOMMENDS.search(own_words(reason)), reason
        with pytest.raises(UnsupportedModelError, match=renamed):
            SpeculativeDecoder.from_names(target, "pld", backend=name)


def test_unknown_options_are_refused(target):
    from specframe import ConfigurationError

    with pytest.raises(ConfigurationError, match="commit"):
        backend_cls("ssm-tree")(target, commit="lazy")
    with pytest.raises(ConfigurationError, match="scan"):
        backend_cls("ssm-tree")(target, scan="cuda")
    for rows in (0, -2, 2.5, True):
        with pytest.raises(ConfigurationError, match="min_rows must be an integer >= 1"):
            backend_cls("ssm-tree")(target, min_rows=rows)
