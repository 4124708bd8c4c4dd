"""`kv`'s batch (`specframe_kv.rows.KVRows`): rows scored together in one forward give each row what the
single-row backend gives it alone, bit for bit in bfloat16 with exact attention and within `FLOAT32_TOL`
in float32, over steps that commit random paths, score some rows and idle others, add and remove rows,
and mix plain steps with big trees; stale or partial commits are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from row_twins import RowTwins

from specframe import TokenTree
from specframe.runtime.attention import EXACT, NAME, exact_attention_forward, use_attention
from specframe.runtime.cpu_patches import patch_cpu_model
from specframe.runtime.packed_linear import native_bfloat16
from specframe_kv import KVCacheBackend
from specframe_kv.rows import KVRows

from conftest import tiny_llama

VOCAB = 96
# Float32 rows scored together differ from rows alone in the last bits (torch's kernels sum in another
# order for another batch shape): at most 1e-6 seen on the tiny models, 7e-5 on SmolLM2 (logits of 10-30).
FLOAT32_TOL = 5e-4
needs_bf16 = pytest.mark.skipif(not native_bfloat16(), reason="this CPU has no native bfloat16 products")
pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def _bfloat16(target):
    """`target` as `load_target` makes a bfloat16 CPU model: packed row-invariant linears, exact rows."""
    target.model.to(torch.bfloat16)
    patch_cpu_model(target.model, torch.bfloat16, "onednn")
    assert target.model.config._attn_implementation == EXACT
    return target


@pytest.fixture(scope="module")
def tiny_f32():
    return tiny_llama(seed=3)


@pytest.fixture(scope="module")
def tiny_bf16():
    return _bfloat16(tiny_llama(seed=3))


def random_tree(draw, vocab: int, nodes: int) -> TokenTree:
    parents = [draw(st.integers(-1, i - 1)) for i in range(nodes)]
    tokens = [draw(st.integers(0, vocab - 1)) for _ in range(nodes)]
    return TokenTree(np.array(tokens, np.int64), np.array(parents, np.int64))


class Twins(RowTwins):
    """`kv`'s batch and its rows alone, their logits and hidden states compared with `compare`."""

    def __init__(self, target, compare, **options):
        super().__init__(target, KVCacheBackend, logits=compare, hidden=compare, **options)


def bit_for_bit(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"max |difference| {float((a.float() - b.float()).abs().max())}"


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=FLOAT32_TOL)


def drive(twins: Twins, data, steps: int) -> None:
    """3-5 rows of prompts of different lengths, `steps` steps of random trees (plain steps among them)
    for all rows or some, random accepted paths, a row removed and one added midway."""
    draw = data.draw
    prompt = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)
    for _ in range(draw(st.integers(3, 5))):
        twins.add(draw(prompt))
    for step in range(steps):
        rows = sorted(twins.alone)
        if draw(st.booleans()):  # some rows idle this step
            rows = draw(st.lists(st.sampled_from(rows), min_size=1, unique=True))
        sizes = {row: draw(st.sampled_from([0, 0, 1, 2, 5, 12, 20])) for row in rows}
        trees = {row: random_tree(draw, VOCAB, sizes[row]) for row in rows}
        picks = {row: (draw(st.integers(-1, sizes[row] - 1)), draw(st.integers(0, VOCAB - 1)))
                 for row in rows}
        twins.step(trees, picks)
        if step == steps // 2:
            twins.remove(draw(st.sampled_from(sorted(twins.alone))))
            twins.add(draw(prompt))


@needs_bf16
# max_rows None: the backend's measured limit (64 rows here); 24: several forwards of whole rows; 7: big
# trees chunked. min_rows 4: small forwards padded, as where calibration measured padding to pay.
@pytest.mark.parametrize("max_rows,min_rows", [(None, 1), (None, 4), (24, 4), (7, 4)])
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_rows_together_equal_rows_alone_bit_for_bit_in_bfloat16(tiny_bf16, max_rows, min_rows, data):
    twins = Twins(tiny_bf16, bit_for_bit, want_hidden=True, min_rows=min_rows)
    if max_rows is not None:  # the rows alone keep the backend's own limit
        twins.batch.backend.max_rows = max_rows
    drive(twins, data, steps=4)


@pytest.mark.parametrize("min_rows", [1, 4])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_rows_together_equal_rows_alone_closely_in_float32(tiny_f32, min_rows, data):
    drive(Twins(tiny_f32, close, min_rows=min_rows), data, steps=5)


@needs_bf16
def test_the_check_catches_torch_attention_in_bfloat16(tiny_bf16):
    """The mutant: bfloat16 rows through torch's attention kernel differ, together and alone."""
    use_attention(tiny_bf16.model, NAME)
    try:
        twins, rng = Twins(tiny_bf16, lambda a, b: None), np.random.default_rng(0)
        for length in (30, 7, 19):
            twins.add(rng.integers(0, VOCAB, length).tolist())
        for _ in range(3):
            trees = {row: TokenTree(rng.integers(0, VOCAB, 12), np.arange(12) - 1) for row in twins.alone}
            twins.step(trees, {row: (11, 1) for row in trees})
        assert twins.worst > 0
    finally:
        use_attention(tiny_bf16.model, EXACT)


def test_plain_steps_and_big_trees_share_a_forward(tiny_f32):
    """Rows with no tree (a plain step: the root alone) beside a 30-node tree: each gets its own rows."""
    twins, rng = Twins(tiny_f32, close), np.random.default_rng(1)
    rows = [twins.add(rng.integers(0, VOCAB, length).tolist()) for length in (3, 25, 11, 1)]
    big = TokenTree(rng.integers(0, VOCAB, 30), (np.arange(30) - 1) // 2)  # a binary tree
    for step in range(3):
        trees = {row: TokenTree.empty() for row in rows}
        trees[rows[step]] = big
        twins.step(trees, {row: (len(trees[row]) - 1, 5 + step) for row in rows})


def test_a_batch_of_one_row_is_the_single_backend(tiny_f32):
    twins = Twins(tiny_f32, bit_for_bit)
    row = twins.add(list(range(10, 30)))
    tree = TokenTree(np.arange(6) + 3, np.array([-1, 0, 0, 1, -1, 4]))
    for step in range(3):
        twins.step({row: tree}, {row: (step + 1, 7)})


# --- stale and partial commits -----------------------------------------------------------------------


def _two_rows(target) -> tuple[KVRows, list[int]]:
    batch = KVCacheBackend(target).batch()
    return batch, [batch.add(list(range(5, 5 + length))) for length in (4, 9)]


def _chains(rows: list[int]) -> dict[int, TokenTree]:
    return {row: TokenTree(np.array([3, 4]), np.array([-1, 0])) for row in rows}


def test_scores_replaced_by_a_newer_score_are_refused(tiny_f32):
    batch, rows = _two_rows(tiny_f32)
    old = batch.score(_chains(rows))
    new = batch.score(_chains(rows))
    with pytest.raises(ValueError, match="other than those of the latest score"):
        batch.commit({row: (old[row], [0], 1) for row in rows})
    batch.commit({row: (new[row], [0], 1) for row in rows})
    with pytest.raises(ValueError, match="committed already"):  # twice
        batch.commit({row: (new[row], [0], 1) for row in rows})
    assert [batch.committed_length(row) for row in rows] == [3 + 2, 8 + 2]


def test_a_commit_must_hold_every_scored_row_and_only_its_own_scores(tiny_f32):
    batch, rows = _two_rows(tiny_f32)
    scored = batch.score(_chains(rows))
    with pytest.raises(ValueError, match=rf"rows \[{rows[1]}\] were scored but are not in commit"):
        batch.commit({rows[0]: (scored[rows[0]], [], 1)})
    with pytest.raises(ValueError, match=f"scores for row {rows[0]} other than"):  # another row's scores
        batch.commit({rows[0]: (scored[rows[1]], [], 1), rows[1]: (scored[rows[1]], [], 1)})
    assert [batch.committed_length(row) for row in rows] == [3, 8]  # nothing committed by a refusal
    batch.commit({row: (scored[row], [], 1) for row in rows})


def test_a_row_removed_after_scoring_leaves_the_others_committable(tiny_f32):
    twins, rng = Twins(tiny_f32, close), np.random.default_rng(2)
    rows = [twins.add(rng.integers(0, VOCAB, length).tolist()) for length in (6, 14, 9)]
    trees = _chains(rows)
    scored = twins.batch.score(trees)
    twins.remove(rows[0])  # the last slot's row moves into its slot, scored rows and all
    twins.batch.commit({row: (scored[row], [0, 1], 2) for row in rows[1:]})
    for row in rows[1:]:
        twins.alone[row].commit(twins.alone[row].score(trees[row]), [0, 1], 2)
    twins.step(_chains(rows[1:]), {row: (1, 3) for row in rows[1:]})
    with pytest.raises(KeyError, match=f"row {rows[0]} is not in this batch"):
        twins.batch.committed_length(rows[0])


# --- the pieces: exact attention per batch row, the ragged cache --------------------------------------


def test_exact_attention_computes_each_batch_row_as_alone():
    """Three sequences with their own masks (one seeing fewer keys) in one call give each sequence's
    rows the bits of a call with that sequence alone."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 5, 8, generator=gen).to(torch.bfloat16)  # (B, heads, rows, dim)
    key, value = (torch.randn(3, 2, 11, 8, generator=gen).to(torch.bfloat16) for _ in range(2))
    allowed = torch.rand(3, 1, 5, 11, generator=gen) > 0.4
    allowed[..., 6:] = torch.eye(5, dtype=torch.bool)  # no query without a key
    allowed[1, ..., 3:6] = False  # a shorter sequence, padded
    mask = torch.zeros(allowed.shape, dtype=torch.bfloat16).masked_fill_(~allowed, -3.0e38)
    module = torch.nn.Module()
    together, _ = exact_attention_forward(module, query, key, value, mask)
    for b in range(3):
        alone, _ = exact_attention_forward(module, query[b:b + 1], key[b:b + 1], value[b:b + 1],
                                           mask[b:b + 1].clone())
        assert torch.equal(together[b:b + 1], alone)


def test_the_ragged_cache_reads_views_for_consecutive_slots_and_keeps_rows_as_it_grows(tiny_f32):
    twins, rng = Twins(tiny_f32, close), np.random.default_rng(3)
    rows = [twins.add(rng.integers(0, VOCAB, length).tolist()) for length in (5, 300, 40)]
    layer = twins.batch.cache.layers[0]
    twins.step(_chains(rows), {row: (1, 4) for row in rows})  # every slot: views of the buffers
    assert layer.keys.data_ptr() == layer.key_buffer.data_ptr()
    twins.step(_chains(rows[::2]), {row: (0, 4) for row in rows[::2]})  # slots 0 and 2: a copy
    assert layer.keys.data_ptr() != layer.key_buffer.data_ptr() and layer.keys.shape[0] == 2
    for _ in range(3):  # more slots than the buffers hold: they grow, keeping every row
        rows.append(twins.add(rng.integers(0, VOCAB, 500).tolist()))
    twins.step(_chains(rows), {row: (1, 4) for row in rows})


# --- the real model --------------------------------------------------------------------------------------


def _smollm2_rows(target, compare, max_rows=-1) -> Twins:
    """Four chat-length prompts of different lengths, four steps of trees from 0 to 20 nodes."""
    twins, rng = Twins(target, compare), np.random.default_rng(4)
    if max_rows != -1:
        twins.batch.backend.max_rows = max_rows
    for length in (12, 40, 25, 3):
        twins.add(rng.integers(0, target.vocab_size, length).tolist())
    for step in range(4):
        twins.step_binary_trees(np.roll([0, 3, 9, 20], step), rng)
        if step == 1:
            twins.remove(sorted(twins.alone)[1])
            twins.add(rng.integers(0, target.vocab_size, 17).tolist())
    return twins


@pytest.fixture(scope="module")
def smollm2_bf16():
    from specframe.runtime.load import load_target

    return load_target("smollm2-135m", dtype="bfloat16")


@pytest.mark.slow
@needs_bf16
@pytest.mark.parametrize("max_rows", [-1, 24])  # the backend's own limit (64 rows); several forwards
def test_smollm2_rows_together_equal_rows_alone_bit_for_bit_in_bfloat16(smollm2_bf16, max_rows):
    _smollm2_rows(smollm2_bf16, bit_for_bit, max_rows)


@pytest.mark.slow
def test_smollm2_rows_together_equal_rows_alone_closely_in_float32(smollm2):
    """On oneDNN's float32 linears rows agree within a tolerance only; on `block_linear` (the default where
    the CPU has AVX-512: SmolLM2's weights are the GGUF's blocks) with exact attention, bit for bit."""
    from specframe.runtime.packed_linear import linear_kernel

    worst = _smollm2_rows(smollm2, close).worst
    assert worst == 0 if linear_kernel(smollm2.model) == "blocks" else worst > 0
