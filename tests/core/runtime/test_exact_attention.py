"""`specframe_exact`: in bfloat16 a tree forward reproduces plain decoding steps bit for bit.

The mutants: torch's attention (`specframe_sdpa`), linears that multiply more rows at once than their
kernel keeps row-invariant (packed, unpacked, or a kernel that changes rows past 3), and one forward over
more rows than exact attention takes all fail the same comparisons, so the checks can fail.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from specframe import SpeculativeDecoder, TokenTree
from specframe.runtime.attention import (EXACT, EXACT_ROWS, exact_attention_forward, exact_rows,
                                         use_attention)
from specframe.runtime.attention import NAME as GROUPED
from specframe.runtime.load import load_target
from specframe.runtime.packed_linear import INVARIANT_ROWS, PackedLinear, invariant_rows, native_bfloat16
from specframe_kv import KVCacheBackend

from conftest import tiny_llama

needs_bf16 = pytest.mark.skipif(not native_bfloat16(), reason="this CPU has no native bfloat16 products")


@pytest.fixture(scope="module")
def smollm2_bf16():
    return load_target("smollm2-135m", dtype="bfloat16")


def _prompt(target) -> list[int]:
    text = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."
    return target.tokenizer(text)["input_ids"]


def _plain_logits(target, ids: list[int], steps: int) -> list[tuple[int, torch.Tensor]]:
    """(greedy token, logits) of `steps` plain decoding steps after `ids`, each a forward of one row
    (`min_rows=1`; the backend's default pads them to 4 rows on the CPU), the strictest reference."""
    backend, out = KVCacheBackend(target, min_rows=1), []
    backend.prefill(ids)
    for _ in range(steps):
        scored = backend.score(TokenTree.empty())
        token = int(scored.logits[0].argmax())
        out.append((token, scored.logits[0]))
        backend.commit(scored, [], token)
    return out


def _tree_with_greedy_chain(plain, siblings: int, vocab: int, seed: int = 0) -> tuple[TokenTree, list[int]]:
    """The greedy chain of `plain` with `siblings` random siblings before each chain node; the chain's
    packed rows (0 = the root)."""
    rng, tokens, parents, chain, parent = np.random.default_rng(seed), [], [], [], -1
    for token, _ in plain[:-1]:
        for _ in range(siblings):
            tokens.append(int(rng.integers(0, vocab)))
            parents.append(parent)
        tokens.append(token)
        parents.append(parent)
        parent = len(tokens) - 1
        chain.append(parent + 1)
    return TokenTree(np.array(tokens), np.array(parents)), [0, *chain]


def _mismatched_rows(target, siblings: int, max_rows: int | None = -1, ids: list[int] | None = None) -> int:
    """Rows of a tree around the greedy chain whose logits differ from plain steps' (`max_rows`: the
    backend's rows per forward, -1 for its own choice)."""
    ids = ids or _prompt(target)
    plain = _plain_logits(target, ids, steps=6)
    tree, rows = _tree_with_greedy_chain(plain, siblings, target.vocab_size)
    backend = KVCacheBackend(target)
    if max_rows != -1:
        backend.max_rows = max_rows
    backend.prefill(ids)
    scored = backend.score(tree)
    return sum(not torch.equal(scored.logits[row], logits) for row, (_, logits) in zip(rows, plain))


@needs_bf16
@pytest.mark.parametrize("siblings", [0, 2])  # a chain (causal mask made by the model) and a tree
def test_tree_rows_equal_plain_steps_bit_for_bit_in_bfloat16(smollm2_bf16, siblings):
    assert smollm2_bf16.model.config._attn_implementation == EXACT
    assert _mismatched_rows(smollm2_bf16, siblings) == 0


@needs_bf16
def test_the_mutant_torch_attention_is_caught(smollm2_bf16):
    use_attention(smollm2_bf16.model, GROUPED)
    try:
        assert _mismatched_rows(smollm2_bf16, siblings=2) >= 3
    finally:
        use_attention(smollm2_bf16.model, EXACT)


def _linears_exact_up_to(model, rows: int) -> None:
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.exact_rows = rows


@needs_bf16
def test_trees_beyond_the_linear_kernels_rows_are_multiplied_in_blocks(smollm2_bf16):
    """A 40-node tree in one forward: exact because each linear multiplies 32 rows at a time (and one
    row as two); the mutant, linears that multiply the rows as they come, is not."""
    assert _mismatched_rows(smollm2_bf16, siblings=7) == 0
    _linears_exact_up_to(smollm2_bf16.model, 0)
    try:
        with warnings.catch_warnings():  # where one row takes another kernel, exact_rows warns of it
            warnings.simplefilter("ignore")
            assert exact_rows(smollm2_bf16.model) <= INVARIANT_ROWS  # a backend would chunk: force one
            assert _mismatched_rows(smollm2_bf16, siblings=7, max_rows=EXACT_ROWS) >= 3
    finally:
        _linears_exact_up_to(smollm2_bf16.model, EXACT_ROWS)


def _swap_linears(model, kind: type, make) -> list[tuple]:
    """Replace each layer of exactly class `kind` by `make(in, out, bias=...)` over the same parameters;
    (parent, name, old layer) of each, to put them back."""
    swaps = []
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is kind:
                swapped = make(child.in_features, child.out_features, bias=child.bias is not None)
                swapped.weight, swapped.bias = child.weight, child.bias
                setattr(parent, name, swapped)
                swaps.append((parent, name, child))
    return swaps


class RowDependentLinear(torch.nn.Linear):
    """A mutant kernel: a product of more than `exact` rows gives each row other bits than that row
    alone. Up to `exact` rows each row is multiplied alone, so the limit is exactly `exact` whatever the
    CPU's own kernels keep."""

    def exact(self) -> int:
        return 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch.cat([super(RowDependentLinear, self).forward(row) for row in flat.split(1)])
        out = out.view(*x.shape[:-1], self.out_features)
        if len(flat) <= self.exact():
            return out
        return (out.float() * (1 + 2 ** -6)).to(out.dtype)


class RareOneRowLinear(RowDependentLinear):
    """A mutant kernel as on the AMD EPYC of `specframe.runtime.packed_linear`: a row multiplied alone gets
    other bits in about one output in 6,000 (the last bit of those whose bits hash to 0 modulo 6,000)."""

    def exact(self) -> int:
        return 64

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if x.numel() // self.in_features > 1:
            return out
        bits = out.view(torch.int16)
        bits[(bits.long() * 2654435761 >> 13) % 6000 == 0] += 1
        return out


@needs_bf16
def test_a_single_row_is_multiplied_as_two_so_a_one_row_kernel_cannot_split_plain_from_tree_steps(
        smollm2_bf16, monkeypatch):
    """The AMD EPYC's one-row kernel, played on any CPU: oneDNN's product perturbed as `RareOneRowLinear`
    perturbs it, for one row. Plain steps and tree rows still agree, because no exact layer multiplies
    one row alone; without that (the mutant `_exact_product`), they do not."""
    product = PackedLinear._product

    def one_row_kernel(self, x, weight):
        out = product(self, x, weight)
        if x.numel() // self.in_features == 1:
            bits = out.view(torch.int16)
            bits[(bits.long() * 2654435761 >> 13) % 6000 == 0] += 1
        return out

    monkeypatch.setattr(PackedLinear, "_product", one_row_kernel)
    assert _mismatched_rows(smollm2_bf16, siblings=0) == 0
    monkeypatch.setattr(PackedLinear, "_exact_product", lambda self, x, weight: self._product(x, weight))
    assert _mismatched_rows(smollm2_bf16, siblings=0) >= 3


def test_the_probe_catches_a_one_row_kernel_that_rounds_rarely_otherwise():
    """Comparing a few rows' outputs is not enough: over 64 rows such a kernel shows a handful of
    differences, which the products of the first 2, 3, ... rows reach late or never (the earlier probe,
    which compared only those, measured 64, 23 and 25 rows here)."""
    torch.manual_seed(0)
    for features, out in ((576, 576), (1536, 576), (576, 192)):
        linear = RareOneRowLinear(features, out, bias=False).to(torch.bfloat16)
        assert invariant_rows(linear, EXACT_ROWS) == 1, (features, out)


def test_linears_are_probed_so_a_kernel_exact_for_fewer_rows_chunks_trees():
    """`exact_rows` measures the linears instead of trusting them: with linears whose rows change in
    products of more than 3 rows, trees are scored in forwards of 3 rows and match plain steps; one
    forward (the mutant backend) does not."""
    target = tiny_llama(seed=3, layers=2)
    target.model.to(torch.bfloat16)
    use_attention(target.model, EXACT)
    _swap_linears(target.model, torch.nn.Linear, RowDependentLinear)
    ids = list(range(5, 30))
    with pytest.warns(UserWarning, match="3 rows per forward"):
        assert exact_rows(target.model) == 3
    with pytest.warns(UserWarning):  # each backend built says so
        assert _mismatched_rows(target, siblings=2, ids=ids) == 0
        assert _mismatched_rows(target, siblings=2, max_rows=None, ids=ids) >= 3


class ThreadDependentLinear(RowDependentLinear):
    """A mutant kernel that keeps as many rows exact as torch has threads, as real kernels' limits can
    depend on the thread count."""

    def exact(self) -> int:
        return torch.get_num_threads()


def test_the_row_limit_follows_the_thread_count_after_the_backend_is_built():
    """A program may change torch's thread count after building the backend: the limit is measured again
    for the new count, not kept from the one the backend was built at."""
    target = tiny_llama(seed=3, layers=2)
    target.model.to(torch.bfloat16)
    use_attention(target.model, EXACT)
    _swap_linears(target.model, torch.nn.Linear, ThreadDependentLinear)
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():  # few rows: exact_rows says so, rightly
            warnings.simplefilter("ignore")
            torch.set_num_threads(2)
            backend = KVCacheBackend(target)
            torch.set_num_threads(1)
            at_one = backend.max_rows
            torch.set_num_threads(2)
            at_two = backend.max_rows
    finally:
        torch.set_num_threads(threads)
    assert (at_one, at_two) == (1, 2)


@needs_bf16
def test_unpacked_bfloat16_linears_are_held_to_the_rows_they_keep_exact(smollm2_bf16):
    """With torch's own bfloat16 linears (`SPECFRAME_CPU_LINEAR=torch`) the CPU's kernels keep fewer rows
    invariant than 64 (32 on an Intel Xeon with AMX; 1 on an AMD EPYC, whose one-row kernel sums in
    another order): a 40-node tree is scored in forwards of that many rows and matches plain steps; in
    one forward (what `exact_rows` said before it measured the linears) it does not."""
    model = smollm2_bf16.model
    swaps = _swap_linears(model, PackedLinear, torch.nn.Linear)
    try:
        with warnings.catch_warnings():  # one row per forward warns that it is slow, rightly
            warnings.simplefilter("ignore")
            assert exact_rows(model) <= INVARIANT_ROWS
            assert _mismatched_rows(smollm2_bf16, siblings=7) == 0
            assert _mismatched_rows(smollm2_bf16, siblings=7, max_rows=EXACT_ROWS) >= 3  # trusting 64 rows
    finally:
        for parent, name, child in swaps:
            setattr(parent, name, child)


@needs_bf16
def test_trees_beyond_exact_attentions_rows_are_scored_in_chunks(smollm2_bf16):
    """A 70-node tree: exact in forwards of 64 and 7 rows; one forward of 71 rows (the mutant), which
    attention and linears compute as a prompt, is not."""
    assert exact_rows(smollm2_bf16.model) == EXACT_ROWS
    assert _mismatched_rows(smollm2_bf16, siblings=13) == 0
    assert _mismatched_rows(smollm2_bf16, siblings=13, max_rows=None) >= 3


@needs_bf16
def test_greedy_speculative_decoding_equals_plain_in_bfloat16(smollm2_bf16):
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    plain = SpeculativeDecoder.from_names(smollm2_bf16, "none", budget=1).generate(prompt, max_new_tokens=48)
    for tree in ("chain", "trie"):
        decoder = SpeculativeDecoder.from_names(smollm2_bf16, "pld", tree, budget=24)
        out = decoder.generate(prompt, max_new_tokens=48)
        assert out.tokens == plain.tokens, tree
        assert out.metrics.accepted_draft_tokens > 0, tree  # drafts were verified and accepted


@needs_bf16
def test_bfloat16_linear_rows_are_invariant_up_to_the_limit():
    """The assumption `INVARIANT_ROWS` rests on, for SmolLM2's shapes: row r of a product of m <= 32
    rows equals the product of row r alone (multiplied as two rows); with `exact_rows=64`, so does a
    product of up to 64 rows."""
    torch.manual_seed(0)
    for features, out in ((576, 1536), (1536, 576), (576, 192)):
        weights = torch.nn.Linear(features, out, bias=False).to(torch.bfloat16)
        linear = PackedLinear(weights, bfloat16=True, exact_rows=EXACT_ROWS)
        x = torch.randn(EXACT_ROWS, features, dtype=torch.bfloat16)
        with torch.inference_mode():
            alone = torch.cat([linear(x[r:r + 1]) for r in range(EXACT_ROWS)])
            for rows in (2, 5, 17, INVARIANT_ROWS, INVARIANT_ROWS + 1, 41, EXACT_ROWS):
                assert torch.equal(linear(x[:rows]), alone[:rows]), rows
            assert torch.equal(linear(x[None, :41]), alone[None, :41])  # (batch, rows, features) too


def _reference(query, key, value, allowed):
    """Attention in float64, one row at a time over its allowed keys."""
    groups = query.shape[1] // key.shape[1]
    out = torch.empty(query.shape, dtype=torch.float64)
    for head in range(query.shape[1]):
        for row in range(query.shape[2]):
            keys = key[0, head // groups].double()[allowed[row]]
            weights = torch.softmax(keys @ query[0, head, row].double() / query.shape[-1] ** 0.5, 0)
            out[0, head, row] = weights @ value[0, head // groups].double()[allowed[row]]
    return out.transpose(1, 2)


@pytest.mark.parametrize("form", ["none", "bool", "additive"])
def test_masks_of_every_form_give_attention(form):
    torch.manual_seed(1)
    rows, length = 3, 7
    query, key, value = torch.randn(1, 4, rows, 8), torch.randn(1, 2, length, 8), torch.randn(1, 2, length, 8)
    allowed = torch.ones(rows, length, dtype=torch.bool).tril(length - rows)
    if form != "none":
        allowed[2, 5] = False  # a tree: the last row does not see the row before it
    additive = torch.zeros(rows, length).masked_fill(~allowed, torch.finfo(torch.float32).min)
    mask = {"none": None, "bool": allowed[None, None], "additive": additive[None, None]}
    out, _ = exact_attention_forward(torch.nn.Module(), query, key, value, mask[form])
    torch.testing.assert_close(out.double(), _reference(query, key, value, allowed), rtol=1e-6, atol=1e-6)


def test_what_it_does_not_compute_goes_to_torch():
    """A soft-capped call (and a prefill of many rows) is passed on, not computed wrongly."""
    target = tiny_llama(seed=8)
    use_attention(target.model, EXACT)
    query, key = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="softcap"):  # transformers' sdpa refuses soft-capping itself
        exact_attention_forward(target.model.model.layers[0].self_attn, query, key, key, None, softcap=30.0)
    ids = torch.arange(3, 80)[None]  # 77 rows: more than the exact path takes
    logits = target.model(ids).logits
    use_attention(target.model, "sdpa")
    torch.testing.assert_close(target.model(ids).logits, logits, rtol=1e-5, atol=1e-5)
