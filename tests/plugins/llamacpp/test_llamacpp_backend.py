"""The `llamacpp` backend on a tiny random Llama written as a GGUF (`tiny_gguf`), one request at a time (a
batch of one row, through `StateBackend.prefill`, `score`, `commit`): every tree row's logits equal a plain
step's bit for bit, commits leave the state plain decoding leaves (also when the accepted branch is not the
tree's first), greedy speculative decoding emits plain greedy decoding's tokens, requests reuse the
backend's llama.cpp contexts, and every refusal says what to do. Skipped where llama-cpp-python is not
installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llamacpp_tests import gguf_target, plain_logits, require_llama_cpp  # noqa: F401 (the target fixture)

import specframe
from specframe import ConfigurationError, PolynomialCost, SpeculativeDecoder, TokenTree, assemble
from specframe.testing.synthetic import random_tree
from specframe.testing.targets import repetitive_prompt, tiny_target
from specframe_llamacpp import LlamaCppBackend

require_llama_cpp()

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def prompt(target):
    return repetitive_prompt(target.vocab_size, 40, seed=0)


def plain_steps(backend: LlamaCppBackend, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """The logits of plain decoding through `backend` fed `tokens` after `prompt`, one step per token."""
    backend.prefill(prompt)
    rows = []
    for token in tokens:
        scores = backend.score(TokenTree.empty())
        rows.append(scores.logits[0])
        backend.commit(scores, [], token)
    return rows


def test_registered_under_its_name():
    assert specframe.get_registry().get("backend", "llamacpp") is LlamaCppBackend


@pytest.mark.parametrize("rows", [1, 2, 5, 31, 32, 33, 70])  # micro-batches of 32 rows: across the edges
def test_a_chain_in_one_batch_equals_plain_steps_bit_for_bit(target, prompt, rows):
    backend = LlamaCppBackend(target)
    tokens = repetitive_prompt(target.vocab_size, rows, seed=1)
    plain = plain_steps(backend, prompt, tokens)
    backend.prefill(prompt)
    chain = backend.score(TokenTree(np.array(tokens[:-1]), np.arange(rows - 1) - 1)).logits
    assert all(torch.equal(chain[i], plain[i]) for i in range(rows))


def test_after_a_long_prompt_read_in_one_micro_batch_a_tree_still_equals_plain_steps(target):
    """A prompt is read as llama.cpp reads one (micro-batches of up to 512 rows, whose rows need not equal
    plain steps: plain and speculative decoding read it alike); the steps after it are exact."""
    backend, reference = LlamaCppBackend(target), LlamaCppBackend(target)
    long_prompt = repetitive_prompt(target.vocab_size, 300, seed=2)
    tree = random_tree(np.random.default_rng(3), target.vocab_size, 40)
    backend.prefill(long_prompt)
    scores = backend.score(tree)
    for node in range(-1, len(tree)):
        path = tree.path_to(node) if node >= 0 else []
        expected = plain_logits(reference, long_prompt, tree.tokens[path].tolist())
        assert torch.equal(scores.logits[node + 1], expected), f"node {node}"


def test_tree_rows_and_commits_equal_plain_steps_bit_for_bit(target, prompt):
    """Random trees up to 40 nodes (past one 32-row call), each followed by a commit of a random branch
    (most of them not the first rows, so the accepted cells are moved together): every row equals a plain
    step after its path, and after all commits the state is plain decoding's."""
    backend, reference = LlamaCppBackend(target), LlamaCppBackend(target)
    rng = np.random.default_rng(0)
    history = list(prompt)
    backend.prefill(history)
    moved = 0
    for _ in range(8):
        tree = random_tree(rng, target.vocab_size, int(rng.integers(0, 41)))
        scores = backend.score(tree)
        for node in range(-1, len(tree)):
            path = tree.path_to(node) if node >= 0 else []
            expected = plain_logits(reference, prompt, history[len(prompt):] + tree.tokens[path].tolist())
            assert torch.equal(scores.logits[node + 1], expected), f"node {node} of {tree.parents.tolist()}"
        path = tree.path_to(int(rng.integers(len(tree)))) if len(tree) else []
        moved += path != list(range(len(path)))
        bonus = int(rng.integers(target.vocab_size))
        backend.commit(scores, path, bonus)
        history += [int(t) for t in tree.tokens[path]] + [bonus]
        assert backend.committed_length == len(history) - 1
    assert moved >= 3
    after = plain_logits(reference, prompt, history[len(prompt):])
    assert torch.equal(backend.score(TokenTree.empty()).logits[0], after)


def test_with_the_rejected_cells_freed_the_next_steps_would_differ(target, prompt, monkeypatch):
    """The planted fault: commits that free the rejected cells instead of marking them discarded. When the
    accepted branch is not the tree's first, the next token is stored in the hole they leave, before
    accepted ones, and its logits then differ from plain decoding's (which the fault leaves as it is: a
    plain step has no rejected cell)."""
    import llama_cpp

    from specframe_llamacpp import engine

    def freeing(self, ids, start, kept, end):
        own = ids[0]
        llama_cpp.llama_memory_seq_rm(self.memory, own, end if kept == own else start, -1)
        if kept is not None and kept != own:
            llama_cpp.llama_memory_seq_cp(self.memory, kept, own, start, end)
        for seq in ids[1:]:
            llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)

    monkeypatch.setattr(engine.LlamaEngine, "settle", freeing)
    backend, reference = LlamaCppBackend(target), LlamaCppBackend(target)
    tree = TokenTree(np.array([5, 6, 7, 8]), np.array([-1, 0, -1, 2]))  # two chains under the root
    history = list(prompt)
    differ = 0
    backend.prefill(history)
    for bonus in (9, 10, 11, 12):
        backend.commit(backend.score(tree), [2, 3], bonus)  # the second chain: rows 1, 2 become a hole
        history += [7, 8, bonus]
        got = backend.score(TokenTree(np.array([3, 4]), np.array([-1, 0]))).logits
        expected = [plain_logits(reference, prompt, history[len(prompt):] + tail) for tail in ([], [3])]
        differ += not all(torch.equal(got[i], expected[i]) for i in range(2))
        backend.commit(backend.score(TokenTree.empty()), [], 1)
        history.append(1)
    assert differ


def test_scores_never_change_the_state_and_only_the_latest_commit(target, prompt):
    backend = LlamaCppBackend(target)
    backend.prefill(prompt)
    tree = TokenTree(np.array([1, 2, 3]), np.array([-1, 0, -1]))
    first = backend.score(tree)
    backend.score(TokenTree(np.array([4] * 9), np.arange(9) - 1))  # discarded
    again = backend.score(tree)
    assert torch.equal(first.logits, again.logits) and again.tree is tree
    with pytest.raises(ValueError, match="latest score"):
        backend.commit(first, [], 0)
    backend.commit(again, [2], 5)
    with pytest.raises(ValueError, match="latest score"):
        backend.commit(again, [], 0)
    assert backend.committed_length == len(prompt) + 1


PIPELINES = [("pld(matches=3)", "chain", 8), ("pld(matches=3)", "static", 12), ("suffix", "trie", 16),
             ("pld(matches=3)", "breadth-first", 6), ("pld(matches=3)", "chain", "auto:8")]
# What budget="auto" plans with here (a node at 2 % of a step), so its trees do not hang on timings
CHEAP_NODES = PolynomialCost((0.02, 1.0))


@pytest.mark.parametrize("drafter,tree,budget", PIPELINES)
def test_greedy_speculative_decoding_emits_plain_greedy_decodings_tokens(target, drafter, tree, budget):
    def decode(drafter, tree, budget, prompt):
        pipeline = assemble(target, drafter, tree, "greedy", "llamacpp")
        decoder = SpeculativeDecoder(target, pipeline, budget=budget, cost=CHEAP_NODES)
        return decoder.generate(prompt, max_new_tokens=48)

    accepted = 0
    for seed in range(3):
        prompt = repetitive_prompt(target.vocab_size, 40, seed=seed)
        result = decode(drafter, tree, budget, prompt)
        assert result.tokens == decode("none", "chain", 1, prompt).tokens, f"prompt {seed}"
        accepted += result.metrics.accepted_draft_tokens
    assert accepted > 0


def test_llama_cpp_runs_on_one_thread_and_says_so_when_asked_for_more(target, prompt):
    """On two threads llama.cpp computes a one-row step unlike the same token's row in a tree once the
    cache holds a few hundred cells, so the backend serves every request on one thread."""
    from llama_cpp import llama_n_threads

    batch = LlamaCppBackend(target).batch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.warns(specframe.SpecframeWarning, match="1 thread, not 2"):
            batch.add(prompt)
        assert llama_n_threads(batch.engine.ctx) == 1
    finally:
        torch.set_num_threads(threads)


def test_requests_one_after_another_reuse_one_llama_cpp_context(target, prompt, monkeypatch):
    """A request is a batch of one row, and the next request drops it before making its own: the backend
    keeps the context of a dropped batch, so a run of requests makes one, not one per request."""
    from specframe_llamacpp import engine

    made = []
    real = engine.LlamaEngine.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(engine.LlamaEngine, "__init__", counted)
    backend = LlamaCppBackend(target)
    first = None
    for _ in range(5):
        backend.prefill(prompt)
        scores = backend.score(TokenTree(np.array([1, 2]), np.array([-1, 0])))
        first = scores.logits if first is None else first
        assert torch.equal(scores.logits, first)
        backend.commit(scores, [0], 3)
    assert len(made) == 1


# --- refusals ------------------------------------------------------------------------------------------


def test_refuses_a_model_not_loaded_from_a_gguf():
    """llama.cpp says why it cannot run the model; the refusal a user sees adds the backend that can."""
    from specframe.plugging.pipeline import backend_refusal

    target = tiny_target(seed=0)
    reason = LlamaCppBackend.unsupported_reason(target)
    assert "GGUF" in reason and "--model" in reason and "'kv'" not in reason
    assert "use the 'kv' backend" in backend_refusal(target, "llamacpp")


def test_refuses_a_target_whose_vocabulary_is_not_the_ggufs(target):
    other = tiny_target(seed=0, vocab_size=128)
    reason = LlamaCppBackend.unsupported_reason(specframe.Target(other.model, None, target.name))
    assert "96 tokens" in reason and "128" in reason


def test_refuses_a_missing_gguf_file(tmp_path):
    reason = LlamaCppBackend.unsupported_reason(specframe.Target(tiny_target().model, None,
                                                                 str(tmp_path / "gone.gguf")))
    assert "does not exist" in reason


def test_a_tree_of_more_paths_than_the_context_holds_says_which_option_to_raise(target, prompt):
    backend = LlamaCppBackend(target, max_leaves=4)
    backend.prefill(prompt)
    with pytest.raises(ConfigurationError, match=r"5 root-to-leaf paths.*max_leaves=5"):
        backend.score(TokenTree(np.arange(5), np.full(5, -1)))


def test_a_context_overflow_says_which_option_to_raise(target, prompt):
    backend = LlamaCppBackend(target, context=48)
    backend.prefill(prompt)
    with pytest.raises(ConfigurationError, match=r"needs 49 positions.*holds 48.*context=N"):
        backend.score(TokenTree(np.arange(9), np.arange(9) - 1))
    with pytest.raises(ConfigurationError, match="the prompt needs 60 positions"):
        backend.prefill(list(range(60)))


BAD_OPTIONS = [({"ubatch": 0}, "ubatch must be an integer from 1"),
               ({"max_leaves": 10_000}, "max_leaves must be an integer from 1"),
               ({"context": 10_000}, "context must be an integer from 1 to 512"),
               ({"min_rows": 0}, "min_rows must be an integer >= 1")]


@pytest.mark.parametrize("options,message", BAD_OPTIONS)
def test_bad_options_are_refused_with_their_bounds(target, options, message):
    with pytest.raises(ConfigurationError, match=message):
        LlamaCppBackend(target, **options)


def test_calibration_measures_it_and_chooses_its_padding(target, prompt):
    """`specframe calibrate`'s measurement runs on it as on `kv`: with `min_rows` left to measurement it
    times a plain step alone and padded first on backends built for it, keeps the faster, then times flat
    trees and chains; a backend built afterwards is handed the choice."""
    from specframe.kit.backend import Calibration
    from specframe.plugging.calibration import measure_cost

    pipeline = specframe.assemble(target, backend="llamacpp")
    backend = pipeline.backend
    assert backend.pads_by_measurement() and backend.cost_options() == {"min_rows": "auto", "ubatch": 32}
    cost = measure_cost(pipeline.build_backend, progress=False, sizes=(0, 1, 2, 4), rounds=1)
    assert cost.sizes == (0, 1, 2, 4) and len(cost.padding_s) == 2 and cost.min_rows in (1, 4)
    assert pipeline.build_backend(Calibration.of(cost)).min_rows == cost.min_rows


@pytest.mark.parametrize("tree", [TokenTree.empty(), TokenTree(np.array([1, 2]), np.array([-1, -1]))])
def test_padded_forwards_give_the_same_rows_and_state(target, prompt, tree):
    padded, unpadded = LlamaCppBackend(target, min_rows=4), LlamaCppBackend(target, min_rows=1)
    for backend in (padded, unpadded):
        backend.prefill(prompt)
        backend.commit(backend.score(tree), [1] if len(tree) else [], 7)
    assert torch.equal(padded.score(tree).logits, unpadded.score(tree).logits)


def test_generate_compare_times_it_against_plain_decoding_through_llama_cpp_not_transformers(target, prompt):
    """`generate --compare` on `llamacpp`: the baseline runs the same GGUF weights (plain decoding through
    the backend), is named in the report, and greedy outputs are identical; transformers' generate, on the
    float model, is not run."""
    from specframe.bench.compare import choose_baseline, compare_with_baseline, plain_decoder
    from specframe.terms.sampling import SamplingParams

    sampling = SamplingParams()
    backend = specframe.get_registry().get("backend", "llamacpp")
    baseline = choose_baseline(target, backend, lambda: plain_decoder(target, "llamacpp", sampling), (),
                               sampling)
    label, runner, note = baseline
    assert label == "plain llamacpp (drafter none)" and "transformers' generate would run another" in note
    assert runner.decoder is None  # made at its first run, after the pipeline's warm-up has calibrated
    assert runner.make_plain().pipeline.drafter.name == "none"

    def make_decoder():
        return SpeculativeDecoder.from_names(target, "pld", "trie", "greedy", "llamacpp", budget=4)

    report = compare_with_baseline(target, make_decoder, baseline, prompt, prompt[:20], 24, (), sampling,
                                   repeats=1, drafter="pld")
    assert report["baseline"] == label and report["identical"] is True
    assert report["result"].metrics.accepted_draft_tokens > 0
