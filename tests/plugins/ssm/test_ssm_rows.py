"""`ssm-tree`'s batch (`specframe_ssm.rows.SSMRows`): rows scored together in one forward give each row what
it gets alone (a batch of one row, as a single request is decoded), on every family ssm-tree serves
(Mamba2, the attention hybrids, gated DeltaNet, Kimi Linear's latent attention, Mamba-1, LFM2, Falcon-H1,
Zamba2), over steps with prompts of different lengths (a
one-token prompt among them), trees of different shapes and sizes (plain steps among them), random
accepted paths, idle rows, rows removed and added, and forwards padded to `min_rows`.

How exactness is obtained and checked. The batch computes each row with the one-row code (the same
tree forwards and commits, over a leading row dimension), so a row's logits differ from those it gets
alone only by float rounding (batched linears and scans, longer masked key ranges): `ROW_ATOL`, far
below what a leaked padding node, another row's state or another row's keys cause (1e-2 and more; the
mutants below show the check catches them). Greedy output is then checked end to end: every row of
`generate_batch` equals plain greedy decoding of its prompt with the unmodified model
(`ssm_models.reference_greedy`, one token per forward, up to the EOS where decoding stops), token for
token, on tiny Mamba2, Bamba, Qwen3-Next,
GraniteMoeHybrid and Kimi Linear targets, with rows finishing at different times."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from row_twins import RowTwins
from ssm_models import VOCAB, make_repetitive, reference_greedy, tiny_ssm_target

from specframe import SpeculativeDecoder, TokenTree
from specframe_ssm import SSMTreeBackend
from specframe_ssm.rows import SSMRows

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

# Rows together vs alone on the tiny float32 models: at most 1.7e-5 seen (Zamba2), most under 5e-6.
ROW_ATOL = 1e-4
BATCHED = ["mamba2", "bamba", "nemotronh", "granite_hybrid", "qwen3_next", "olmo_hybrid", "kimi_linear",
           "mamba", "falcon_mamba", "jamba", "lfm2", "falcon_h1", "zamba2"]


def random_tree(rng: np.random.Generator, nodes: int) -> TokenTree:
    parents = [int(rng.integers(-1, i)) if i else -1 for i in range(nodes)]
    return TokenTree(rng.integers(0, VOCAB, nodes), np.array(parents, np.int64))


class Twins(RowTwins):
    """`ssm-tree`'s batch and its rows alone, scored in one forward; hidden states compared within
    `ROW_ATOL`, logits measured (`worst`) for each test to judge."""

    def __init__(self, target, **options):
        close = partial(torch.testing.assert_close, atol=ROW_ATOL, rtol=0)
        super().__init__(target, SSMTreeBackend, hidden=close, one_forward=True, **options)
        assert isinstance(self.batch, SSMRows)


def drive(twins: Twins, seed: int, steps: int = 5) -> None:
    """Four rows (prompts of 1 to 30 tokens), `steps` steps of random trees of 0 to 12 nodes for all rows or
    some, random accepted paths, a row removed and one added midway."""
    rng = np.random.default_rng(seed)
    for length in (1, 30, 9, 17):
        twins.add(rng.integers(0, VOCAB, length).tolist())
    for step in range(steps):
        rows = sorted(twins.alone)
        if step % 2:  # some rows idle this step
            rows = sorted(rng.choice(rows, size=int(rng.integers(1, len(rows) + 1)), replace=False).tolist())
        trees = {row: random_tree(rng, int(rng.choice([0, 1, 3, 6, 12]))) for row in rows}
        picks = {row: (int(rng.integers(-1, len(tree))), int(rng.integers(0, VOCAB)))
                 for row, tree in trees.items()}
        twins.step(trees, picks)
        if step == steps // 2:
            twins.remove(rows[0])
            twins.add(rng.integers(0, VOCAB, 5).tolist())


@pytest.mark.parametrize("kind", BATCHED)
@pytest.mark.parametrize("min_rows", [1, 8])
def test_rows_together_equal_rows_alone(kind, min_rows):
    twins = Twins(tiny_ssm_target(kind, seed=1), want_hidden=True, min_rows=min_rows)
    drive(twins, seed=min_rows)
    assert twins.worst < ROW_ATOL


@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
@pytest.mark.parametrize("commit", ["replay", "closed"])
def test_commit_rules_and_a_dt_limit_hold_per_row(kind, commit):
    """The prompt's last token is clamped to `time_step_limit` in its own row only (rows whose root is a
    new token are not), and either commit rule absorbs each row's own path."""
    twins = Twins(tiny_ssm_target(kind, seed=2, dt_min=0.3, dt_max=0.9), commit=commit)
    drive(twins, seed=3, steps=4)
    assert twins.worst < ROW_ATOL


# --- the check can fail: a batch that mixes rows is caught ------------------------------------------------


STACKED_STATES, MASK = SSMRows._stacked_states, SSMRows._mask


def _swap_row_states(self, states):
    stacked = STACKED_STATES(self, states)
    return {idx: (conv.flip(0), None if h is None else h.flip(0)) for idx, (conv, h) in stacked.items()}


def _mask_showing_every_column(self, lengths, ancestors, width):
    mask = MASK(self, lengths, ancestors, width)
    return torch.zeros_like(mask)  # padding, other rows' longer prefixes and stale keys all visible


@pytest.mark.parametrize(("kind", "mutant"), [("mamba2", _swap_row_states), ("qwen3_next", _swap_row_states),
                                              ("bamba", _mask_showing_every_column)])
def test_the_check_catches_rows_mixed_up(kind, mutant, monkeypatch):
    twins = Twins(tiny_ssm_target(kind, seed=1))
    monkeypatch.setattr(SSMRows, "_stacked_states" if mutant is _swap_row_states else "_mask", mutant)
    rng = np.random.default_rng(0)
    for length in (12, 3):
        twins.add(rng.integers(0, VOCAB, length).tolist())
    for _ in range(2):
        trees = {row: random_tree(rng, n) for row, n in zip(sorted(twins.alone), (2, 7))}
        twins.step(trees, {row: (len(tree) - 1, 1) for row, tree in trees.items()})
    assert twins.worst > 1e-2


# --- the pieces ---------------------------------------------------------------------------------------


def test_forward_rows_is_one_padded_forward():
    batch = SSMTreeBackend(tiny_ssm_target("bamba"), min_rows=8).batch()
    rows = [batch.add([3, 4, 5][:n]) for n in (1, 2, 3)]
    assert batch.forward_rows(dict(zip(rows, (0, 5, 2)))) == [3 * 6]  # every row padded to 5 nodes + root
    assert batch.forward_rows({rows[0]: 0, rows[1]: 1}) == [2 * 4]  # small: padded up to min_rows


def test_stale_and_partial_commits_are_refused():
    batch = SSMTreeBackend(tiny_ssm_target("mamba2")).batch()
    rows = [batch.add(list(range(5, 5 + n))) for n in (4, 9)]
    chains = {row: TokenTree(np.array([3, 4]), np.array([-1, 0])) for row in rows}
    old = batch.score(chains)
    new = batch.score(chains)
    with pytest.raises(ValueError, match="other than those of the latest score"):
        batch.commit({row: (old[row], [0], 1) for row in rows})
    with pytest.raises(ValueError, match=rf"rows \[{rows[1]}\] were scored but are not in commit"):
        batch.commit({rows[0]: (new[rows[0]], [0], 1)})
    batch.commit({row: (new[row], [0], 1) for row in rows})
    assert [batch.committed_length(row) for row in rows] == [3 + 2, 8 + 2]


def test_kimi_linear_keys_and_values_keep_their_own_head_sizes():
    """Kimi Linear's latent attention caches its compressed latent as keys and its rotary key part as values,
    of different head sizes: the shared ragged cache holds each with its own, so its rows are batched like
    the others (test_rows_together_equal_rows_alone checks them)."""
    batch = SSMTreeBackend(tiny_ssm_target("kimi_linear")).batch()
    rows = [batch.add(list(range(5, 5 + n))) for n in (4, 9)]
    batch.score({row: TokenTree(np.array([3, 4]), np.array([-1, 0])) for row in rows})
    layer = batch.kv.layers[0]
    # tiny_ssm_target's kv_lora_rank and qk_rope_head_dim
    assert (layer.key_buffer.shape[-1], layer.value_buffer.shape[-1]) == (8, 4)


# --- end to end ---------------------------------------------------------------------------------------

PROMPTS = [[3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 9, 10, 11, 3, 4, 5, 6], [8], [20, 21, 22, 20, 21, 22, 20],
           [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4]]
LIMITS = [32, 7, 20, 26]  # rows finish at different times


@pytest.mark.parametrize(("kind", "seed", "boost"), [("mamba2", 1, 4.0), ("bamba", 1, 4.0),
                                                     ("qwen3_next", 4, 8.0), ("granite_hybrid", 1, 4.0),
                                                     ("kimi_linear", 1, 4.0)])
@pytest.mark.parametrize("batch_size", [None, 2])  # all rows at once; two at a time, rows joining
def test_generate_batch_equals_plain_greedy_per_row(kind, seed, boost, batch_size):
    target = make_repetitive(tiny_ssm_target(kind, seed=seed), boost=boost)
    decoder = SpeculativeDecoder.from_names(target, "pld(matches=3, num_tokens=4)", "trie", "greedy",
                                            "ssm-tree", budget=8)
    assert isinstance(decoder.pipeline.backend.batch(), SSMRows)
    plain = SpeculativeDecoder.from_names(target, "none", "chain", "greedy", "ssm-tree")
    results = decoder.generate_batch(PROMPTS, LIMITS, batch_size=batch_size)
    for prompt, limit, result in zip(PROMPTS, LIMITS, results):
        alone = plain.generate(prompt, max_new_tokens=limit).tokens  # stops at EOS, as the batch does
        assert alone == reference_greedy(target, prompt, limit)[:len(alone)]
        assert result.tokens == alone
    assert sum(r.metrics.accepted_draft_tokens for r in results) > 0  # drafts were accepted
    assert len({len(tree_sizes) for tree_sizes in (r.metrics.tree_sizes for r in results)}) > 1


# --- the real model ----------------------------------------------------------------------------------------

# Rows together vs alone on SmolLM2-135M converted to a hybrid (GraniteMoeHybrid, Mamba2 every fourth
# layer), float32: 6.7e-5 seen on logits of 10-30, as `kv`'s batch differs on SmolLM2 itself.
REAL_ATOL = 5e-4
TEXTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "The capital of France is",
         "Write a short story about a robot who learns to paint. Once upon a time, in a small town,",
         "import numpy as np\n\ndef softmax(x):\n"]


@pytest.fixture(scope="module")
def hybrid():
    import specframe

    return specframe.load_target("smollm2-135m-hybrid")


@pytest.mark.slow
def test_hybrid_rows_together_equal_rows_alone(hybrid):
    twins, rng = Twins(hybrid), np.random.default_rng(4)
    for text in TEXTS:
        twins.add(hybrid.tokenizer.encode(text))
    for step in range(3):
        twins.step_binary_trees(np.roll([0, 3, 9, 6], step), rng)
    assert twins.worst < REAL_ATOL


@pytest.mark.slow
def test_hybrid_generate_batch_equals_plain_greedy_per_row(hybrid):
    decoder = SpeculativeDecoder.from_names(hybrid, "pld(matches=3, num_tokens=4)", "trie", "greedy",
                                            "ssm-tree", budget=8)
    prompts, limits = [hybrid.tokenizer.encode(text) for text in TEXTS], [40, 12, 32, 24]
    results = decoder.generate_batch(prompts, limits)
    for prompt, limit, result in zip(prompts, limits, results):
        expected = reference_greedy(hybrid, prompt, limit)
        assert result.tokens == expected[:len(result.tokens)]
        assert len(result.tokens) == limit or result.tokens[-1] == hybrid.tokenizer.eos_token_id
    assert sum(r.metrics.accepted_draft_tokens for r in results) > 0
