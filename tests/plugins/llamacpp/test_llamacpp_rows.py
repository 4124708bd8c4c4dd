"""`llamacpp`'s rows (`specframe_llamacpp.rows.LlamaRows`, its only form): rows as sequences of one llama.cpp
context give every row the logits it gets alone, bit for bit (rows of different lengths, trees, idle rows,
rows leaving and joining, the cache packed and grown, steps padded to `min_rows`), in one `llama_decode`
per step; greedy `generate_batch` rows are plain greedy decoding's; stale and partial commits, and steps
past the sequences or the context, are refused. On the tiny GGUF Llama, and on the real SmolLM2 GGUF
(slow). Skipped where llama-cpp-python is not installed."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest
import torch
from llamacpp_tests import gguf_target, require_llama_cpp  # noqa: F401 (the target fixture)
from row_twins import RowTwins

from specframe import ConfigurationError, SpeculativeDecoder, TokenTree, assemble
from specframe.testing.checks import check_batch_rows
from specframe.testing.targets import repetitive_prompt
from specframe_llamacpp import LlamaCppBackend
from specframe_llamacpp.rows import LlamaRows

require_llama_cpp()

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def same(together: torch.Tensor, alone: torch.Tensor) -> None:
    assert torch.equal(together, alone), f"differ by up to {float((together - alone).abs().max())}"


@pytest.fixture
def decodes(monkeypatch) -> list[tuple[int, int]]:
    """The context and rows of every `llama_decode` call made while the test runs (`of` picks a batch's)."""
    calls: list[tuple[int, int]] = []
    real = llama_cpp.llama_decode

    def counted(ctx, batch):
        calls.append((address(ctx), int(batch.n_tokens)))
        return real(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", counted)
    return calls


def address(ctx) -> int:
    return ctypes.cast(ctx, ctypes.c_void_p).value


def of(batch: LlamaRows, decodes: list[tuple[int, int]]) -> list[int]:
    """The rows of each `llama_decode` call on `batch`'s context."""
    return [rows for ctx, rows in decodes if ctx == address(batch.engine.ctx)]


def prompts(vocab: int, lengths) -> list[list[int]]:
    return [repetitive_prompt(vocab, n, seed=n) for n in lengths]


def test_the_batch_is_llama_rows_in_one_forward(target):
    batch = LlamaCppBackend(target).batch()
    assert isinstance(batch, LlamaRows) and batch.one_forward
    assert not LlamaCppBackend.capabilities.fresh_state_per_copy
    assert batch.forward_rows({0: 3, 1: 0, 2: 10}) == [16] and batch.forward_rows({}) == []


def test_rows_equal_rows_alone_bit_for_bit_as_rows_idle_leave_and_join(target, decodes):
    """Random binary trees (the accepted path mostly not the first rows), a small context so that the
    cache is packed and then grown on the way: every row's logits are its own backend's alone."""
    twins = RowTwins(target, LlamaCppBackend, logits=same, context=256)
    rng = np.random.default_rng(0)
    rows = [twins.add(ids) for ids in prompts(target.vocab_size, (40, 17, 90))]
    first_cells = twins.batch.engine.cells
    for step in range(24):
        if step == 5:
            twins.remove(rows[1])
        if step == 8:
            rows.append(twins.add(prompts(target.vocab_size, (60,))[0]))
        if step % 4 == 3:  # the first row idles
            idle = {row: TokenTree(rng.integers(0, target.vocab_size, 3), np.array([-1, 0, 0]))
                    for row in sorted(twins.alone)[1:]}
            twins.step(idle, {row: (2, 7) for row in idle})
            continue
        decodes.clear()
        sizes = [int(n) for n in rng.integers(0, 9, len(twins.alone))]
        twins.step_binary_trees(sizes, rng)
        assert of(twins.batch, decodes) == [sum(sizes) + len(sizes)], "one llama_decode for every row's tree"
    assert twins.worst == 0.0 and twins.batch.engine.cells > first_cells


def test_a_row_added_to_an_emptied_batch_reads_its_prompt_as_alone(target):
    """Requests decoded one at a time in one batch: each row, added once the last has left, empties the
    context and reads its prompt straight into it, and then scores as alone."""
    twins = RowTwins(target, LlamaCppBackend, logits=same)
    rng = np.random.default_rng(4)
    for ids in prompts(target.vocab_size, (30, 45, 12)):
        row = twins.add(ids)
        for _ in range(3):
            twins.step_binary_trees([int(rng.integers(0, 9))], rng)
        twins.remove(row)
    assert twins.worst == 0.0


def test_trees_past_one_micro_batch_run_in_order_in_micro_batches_of_ubatch_rows(target, decodes):
    twins = RowTwins(target, LlamaCppBackend, logits=same, ubatch=8)
    rng = np.random.default_rng(1)
    for ids in prompts(target.vocab_size, (30, 12)):
        twins.add(ids)
    decodes.clear()
    twins.step_binary_trees([9, 6], rng)
    assert of(twins.batch, decodes) == [8, 8, 1]


def test_a_step_of_fewer_rows_is_padded_to_min_rows_and_scores_alike(target, decodes):
    """Throwaway rows after the last row's tree bring a step to `min_rows` rows (as `forward_rows` tells
    the planner); no row's logits change, then or after the commit."""
    ids = prompts(target.vocab_size, (20, 25))
    trees = [TokenTree(np.array([1, 2]), np.array([-1, 0])), TokenTree.empty()]
    logits = []
    for min_rows in (12, 1):
        batch = LlamaCppBackend(target, min_rows=min_rows).batch()
        rows = [batch.add(prompt) for prompt in ids]
        sizes = {row: len(tree) for row, tree in zip(rows, trees)}
        decodes.clear()
        scores = batch.score(dict(zip(rows, trees)))
        assert of(batch, decodes) == batch.forward_rows(sizes) == [max(4, min_rows)]
        batch.commit({rows[0]: (scores[rows[0]], [0, 1], 5), rows[1]: (scores[rows[1]], [], 6)})
        after = batch.score(dict(zip(rows, trees)))
        logits.append([scores[row].logits for row in rows] + [after[row].logits for row in rows])
    assert all(torch.equal(padded, unpadded) for padded, unpadded in zip(*logits))


def test_generate_batch_rows_are_plain_greedy_decoding(target):
    ids = prompts(target.vocab_size, (30, 12, 45))

    def make_decoder(drafter="pld", tree="chain", budget=4):
        pipeline = assemble(target, drafter, tree, "greedy", "llamacpp")
        return SpeculativeDecoder(target, pipeline, budget=budget)

    check_batch_rows(make_decoder, ids, max_new_tokens=24, label="pld+chain on llamacpp")
    rows = make_decoder().generate_batch(ids, 24, batch_size=3)
    plain = make_decoder("none", "chain", 1)
    assert [row.tokens for row in rows] == [plain.generate(p, max_new_tokens=24).tokens for p in ids]


def test_stale_and_partial_commits_are_refused(target):
    batch = LlamaCppBackend(target).batch()
    a, b = (batch.add(ids) for ids in prompts(target.vocab_size, (20, 25)))
    tree = TokenTree(np.array([1, 2]), np.array([-1, 0]))
    old = batch.score({a: tree, b: tree})
    new = batch.score({a: tree, b: tree})
    with pytest.raises(ValueError, match=r"rows \[1\] were scored but are not in commit"):
        batch.commit({a: (new[a], [0], 3)})
    with pytest.raises(ValueError, match="other than those of the latest score"):
        batch.commit({a: (old[a], [0], 3), b: (new[b], [], 3)})
    batch.commit({a: (new[a], [0, 1], 3), b: (new[b], [], 4)})
    assert (batch.committed_length(a), batch.committed_length(b)) == (19 + 3, 24 + 1)
    with pytest.raises(ValueError, match="other than those of the latest score"):
        batch.commit({a: (new[a], [], 3), b: (new[b], [], 4)})


def test_a_step_past_the_sequences_is_refused_before_any_work(target, decodes):
    batch = LlamaCppBackend(target).batch()
    rows = [batch.add(ids) for ids in prompts(target.vocab_size, (10, 11, 12, 13))]
    fan = TokenTree(np.arange(64) % target.vocab_size, np.full(64, -1))  # 64 root-to-leaf paths
    decodes.clear()
    with pytest.raises(ConfigurationError, match="need 256 llama.cpp sequences.*holds 255.*batch_size"):
        batch.score(dict.fromkeys(rows, fan))
    assert decodes == []
    assert batch.engine.sequences == 65  # max_leaves + 1: one row's tree and the spare
    batch.score(dict.fromkeys(rows[:3], fan))  # 3 + 3 * 63 sequences fit
    assert batch.engine.sequences == 256  # the rows moved into a context of every id


def test_a_row_past_its_context_is_refused_before_any_work(target, decodes):
    batch = LlamaCppBackend(target, context=64).batch()
    row = batch.add(prompts(target.vocab_size, (50,))[0])
    decodes.clear()
    with pytest.raises(ConfigurationError, match=r"needs 70 positions.*holds 64.*llamacpp\(context=N\)"):
        batch.score({row: TokenTree(np.ones(20, np.int64), np.arange(20) - 1)})
    assert decodes == []
    with pytest.raises(ConfigurationError, match="a tree of 65 root-to-leaf paths.*max_leaves=65"):
        batch.score({row: TokenTree(np.arange(65) % target.vocab_size, np.full(65, -1))})


# --- the real model (slow) ---------------------------------------------------------------------

CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
TEXTS = (CODE, "The capital of France is", "List the days of the week, one per line, then backwards:\n")


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2):
    return [smollm2.tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


@pytest.mark.slow
def test_smollm2_rows_equal_rows_alone_bit_for_bit(smollm2, smollm2_prompts, decodes):
    twins = RowTwins(smollm2, LlamaCppBackend, logits=same)
    rng = np.random.default_rng(2)
    rows = [twins.add(ids) for ids in smollm2_prompts]
    for step in range(8):
        if step == 3:
            twins.remove(rows[0])
        if step == 5:
            twins.add(smollm2_prompts[0][:9])
        if step == 6:  # the first row idles
            idle = sorted(twins.alone)[1:]
            twins.step({row: TokenTree(np.array([198, 198]), np.array([-1, -1])) for row in idle},
                       dict.fromkeys(idle, (1, 198)))
            continue
        decodes.clear()
        sizes = [int(n) for n in rng.integers(0, 10, len(twins.alone))]
        twins.step_binary_trees(sizes, rng)
        assert len(of(twins.batch, decodes)) == 1
    assert twins.worst == 0.0


@pytest.mark.slow
def test_smollm2_greedy_generate_batch_rows_are_plain_greedy_decoding(smollm2, smollm2_prompts):
    def make_decoder(drafter="suffix", tree="trie", budget=12):
        return SpeculativeDecoder(smollm2, assemble(smollm2, drafter, tree, "greedy", "llamacpp"),
                                  budget=budget)

    plain = make_decoder("none", "chain", 1)
    plain = [plain.generate(ids, max_new_tokens=32).tokens for ids in smollm2_prompts]
    for drafter, tree in (("none", "chain"), ("suffix", "trie")):
        rows = make_decoder(drafter, tree).generate_batch(smollm2_prompts, 32, batch_size=3)
        assert [row.tokens for row in rows] == plain, f"{drafter}+{tree}"
    check_batch_rows(make_decoder, smollm2_prompts, max_new_tokens=32, label="suffix+trie on llamacpp")
