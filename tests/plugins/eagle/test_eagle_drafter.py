"""The `eagle` drafter: conformance (both forms), greedy output identical to plain decoding with every tree
builder, alone and in a batch, on `kv` and on a hybrid through `ssm-tree`; the head's context fed the
target's features exactly (the prompt's from the backend, or from its own forward), across accepted and
rejected steps; sampled drafts verified by `rejection` with the target's law."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eagle_checkpoints import eagle1_head, eagle3_head, oracle_eagle1
from ssm_models import tiny_converted_hybrid

import specframe
from specframe.testing import (
    DrafterConformance, LogitTable, TableBackend, exact_law, law_test, reference_greedy, reference_hidden,
    repetitive_prompt, tiny_target,
)
from specframe.testing.exact import P_CATCH, P_PASS, decoder_counts
from specframe_eagle.checkpoint import config_for, save_head
from specframe_eagle.drafter import EagleDrafter
from specframe_eagle.head import EagleHead, start_from_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py

LAYERS3 = (1, 2, 3)  # the hidden states the tiny EAGLE-3 heads read (the targets have 4 layers)
EAGLE3_BACKEND = f"kv(hidden_layers={LAYERS3})"
DRAFT_IDS = list(range(0, 96, 2))  # EAGLE-3's draft vocabulary: every other token
TREES = ["chain", "trie", "dynamic", "dynamic(topk=2, depth=4)", "static", "beam"]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Directories of heads for the tiny targets: untrained EAGLE-1 and EAGLE-3, and the oracle-like one."""
    root = tmp_path_factory.mktemp("eagle-heads")
    return {"eagle": eagle1_head(root / "eagle", tiny_target(seed=0)),
            "eagle3": eagle3_head(root / "eagle3", tiny_target(seed=0, layers=4), DRAFT_IDS, list(LAYERS3)),
            "oracle": oracle_eagle1(root / "oracle", tiny_target(seed=0, layers=1))}


class TestEagleConformance(DrafterConformance):
    component = "eagle"
    max_new_tokens = 24

    @pytest.fixture(autouse=True)
    def _heads(self, heads):
        self.options = {"heads": str(heads["eagle"]), "topk": 3, "width": 2, "depth": 4}


class TestEagle3Conformance(DrafterConformance):
    component = "eagle"
    max_new_tokens = 24

    @pytest.fixture
    def target(self):
        return tiny_target(seed=0, layers=4)

    @pytest.fixture(autouse=True)
    def _heads(self, heads):
        self.options = {"heads": str(heads["eagle3"]), "topk": 3, "width": 2, "depth": 4}

    def decoder(self, target, **components):
        return super().decoder(target, **{"backend": EAGLE3_BACKEND, **components})


def _decoder(target, heads, tree="chain", backend="kv", budget=8, **options):
    drafter = specframe.ComponentSpec("eagle", {"heads": str(heads), **options})
    return specframe.SpeculativeDecoder.from_names(target, drafter, tree, "greedy", backend, budget=budget)


@pytest.mark.parametrize("tree", TREES)
def test_greedy_output_is_plain_greedy_with_drafts_accepted(heads, tree):
    """The oracle-like head gets most drafts accepted, so accepted paths, rejected branches and the head's
    rollback all run; every output equals plain greedy decoding."""
    target = tiny_target(seed=0, layers=1)
    prompts = [repetitive_prompt(target.vocab_size, 40, seed=s) for s in (0, 1)]
    for budget in (1, 6, 16):
        decoder = _decoder(target, heads["oracle"], tree, budget=budget)
        accepted = 0
        for prompt in prompts:
            result = decoder.generate(prompt, max_new_tokens=32)
            assert result.tokens == reference_greedy(target, prompt, 32), (tree, budget)
            accepted += result.metrics.accepted_draft_tokens
        assert accepted > 20, f"{tree} at budget {budget}: {accepted} drafts accepted"


@pytest.mark.parametrize("tree", ["chain", "trie", "dynamic"])
def test_eagle3_greedy_output_is_plain_greedy(heads, tree):
    target = tiny_target(seed=0, layers=4)
    prompt = repetitive_prompt(target.vocab_size, 40)
    decoder = _decoder(target, heads["eagle3"], tree, backend=EAGLE3_BACKEND)
    seen = _record_proposals(decoder)
    assert decoder.generate(prompt, max_new_tokens=32).tokens == reference_greedy(target, prompt, 32)
    drafted = {int(t) for proposal in seen for t in proposal.tokens}
    assert drafted and drafted <= set(DRAFT_IDS)  # draft rows map to target ids through d2t


def _record_proposals(decoder):
    drafter = decoder.pipeline.drafter
    propose, seen = drafter.propose, []

    def recording(context):
        proposal = propose(context)
        seen.append(proposal)
        return proposal

    drafter.propose = recording
    return seen


@pytest.mark.parametrize("prompt_features", ["from the backend", "from its own forward"])
def test_the_head_reads_the_targets_features_of_every_committed_token(heads, monkeypatch, prompt_features):
    """At every step the head's prediction for the root equals the head run afresh, without a cache, over the
    target's teacher-forced features of the whole context: the prompt's (handed out by `kv` with the first
    scores, or computed by the drafter when a backend keeps none) and every accepted token's."""
    if prompt_features == "from its own forward":
        from specframe_kv.rows import KVRows

        read = KVRows._read
        monkeypatch.setattr(KVRows, "_read", lambda self, ids: (read(self, ids)[0], None))
    target = tiny_target(seed=0, layers=1)
    decoder = _decoder(target, heads["oracle"], "dynamic", budget=10)
    drafter = decoder.pipeline.drafter
    propose, roots = drafter.propose, []

    def recording(context):
        proposal = propose(context)
        if drafter.root is not None:
            roots.append((context.tokens.copy(), drafter.root.clone()))
        return proposal

    drafter.propose = recording
    result = decoder.generate(repetitive_prompt(target.vocab_size, 30), max_new_tokens=40)
    # every step drafted but the first (no feature yet) and the last (no room left)
    assert result.metrics.accepted_draft_tokens > 10 and len(roots) == result.metrics.steps - 2
    head = drafter.head
    for tokens, root in roots:
        n = len(tokens) - 1
        features = reference_hidden(target, tokens[:n].tolist())  # (n, H): f_j predicted t_{j+1}
        with torch.inference_mode():
            embeds = target.model.get_input_embeddings()(torch.from_numpy(tokens[1:]))  # (n, H)
            expected = head(embeds[None], features[None], torch.arange(n)[None])[0, -1]
        torch.testing.assert_close(root[0], expected, atol=1e-4, rtol=1e-4)


def test_rows_of_a_batch_are_plain_greedy(heads):
    target = tiny_target(seed=0, layers=1)
    prompts = [repetitive_prompt(target.vocab_size, n, seed=s) for s, n in ((0, 40), (1, 25), (2, 33))]
    for size in (3, 2):
        rows = _decoder(target, heads["oracle"], "dynamic", budget=8).generate_batch(prompts, 24,
                                                                                      batch_size=size)
        for prompt, row in zip(prompts, rows):
            assert row.tokens == reference_greedy(target, prompt, 24)
        assert sum(row.metrics.accepted_draft_tokens for row in rows) > 10
    target3 = tiny_target(seed=0, layers=4)
    rows = _decoder(target3, heads["eagle3"], "trie", backend=EAGLE3_BACKEND).generate_batch(prompts, 16)
    assert [row.tokens for row in rows] == [reference_greedy(target3, p, 16) for p in prompts]


def test_on_a_hybrid_through_ssm_tree(tmp_path):
    model = tiny_converted_hybrid()
    target = specframe.Target(model=model, tokenizer=None, name="tiny-hybrid")
    options = EagleDrafter.example_options(target, str(tmp_path))
    prompt = repetitive_prompt(target.vocab_size, 30)
    for tree in ("chain", "dynamic"):
        decoder = _decoder(target, options["heads"], tree, backend="ssm-tree")
        assert decoder.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target, prompt, 20)


def test_an_eagle3_head_on_a_backend_without_its_layers_says_how_to_fix(heads):
    decoder = _decoder(tiny_target(seed=0, layers=4), heads["eagle3"], "chain", backend="kv")
    with pytest.raises(specframe.ConfigurationError, match=r"kv\(hidden_layers=\(1, 2, 3\)\)"):
        decoder.generate([1, 2, 3, 4], max_new_tokens=8)


def test_no_heads_named_says_how_to_get_some():
    with pytest.raises(specframe.ModelLoadError, match=r"specframe train eagle.*eagle\(heads="):
        EagleDrafter(tiny_target(seed=0))


class MisstatedQ(EagleDrafter):
    """Mutant: drafts from the head's q but hands the verifier q squared and renormalised."""

    def _full_rows(self, q):
        sharp = q.float() ** 2
        return super()._full_rows(sharp / sharp.sum(-1, keepdim=True))


def test_sampled_drafts_follow_the_target_law_with_rejection(tmp_path):
    """`rejection` on the head's sampled chain and tree keeps the exactly enumerated law of a tiny target
    (the harness of tests/core/decode/test_lossless_e2e.py, which runs every drafter through it), and a
    drafter that misstates its q is caught by the same test."""
    target = tiny_target(seed=0, vocab_size=8)
    prompt, depth = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], 2
    table = LogitTable.from_target(target, prompt, depth)
    params = specframe.SamplingParams(temperature=0.8, top_p=0.95)
    options = EagleDrafter.example_options(target, str(tmp_path))
    registry = specframe.get_registry()
    results = {}
    for cls, tree in ((EagleDrafter, "chain"), (EagleDrafter, "trie"), (MisstatedQ, "chain")):
        pipeline = specframe.Pipeline(cls(target, **options, topk=2), registry.get("tree builder", tree)(),
                                      registry.get("verifier", "rejection")(),
                                      TableBackend(target, table=table, want_hidden=True))
        decoder = specframe.SpeculativeDecoder(target, pipeline, budget=3)
        counts, accepted = decoder_counts(decoder, prompt, depth, 2000, params, 4)
        results[cls.__name__, tree] = law_test(counts, exact_law(table, params))
        assert accepted > 100, f"{cls.__name__}+{tree}: drafts were hardly accepted ({accepted})"
    for (name, tree), result in results.items():
        if name == "EagleDrafter":
            assert result.pvalue >= P_PASS, f"eagle+{tree}+rejection: {result}"
        else:
            assert result.pvalue < P_CATCH, f"the mutant that misstates q passed: {result}"


def test_spawned_drafters_keep_their_own_context(heads):
    target = tiny_target(seed=0, layers=1)
    drafter = EagleDrafter(target, heads=str(heads["oracle"]))
    other = drafter.spawn()
    other.reset()
    assert other.head is drafter.head and other.queue is not drafter.queue
    assert np.array_equal(other.tokens, drafter.tokens)


@pytest.mark.slow
def test_untrained_heads_on_the_real_model_are_lossless(smollm2, tmp_path):
    """SmolLM2 with untrained EAGLE-1 and EAGLE-3 heads: drafts are hardly ever accepted, the output is the
    target's, alone and in a batch."""
    options = EagleDrafter.example_options(smollm2, str(tmp_path))
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = reference_greedy(smollm2, ids, 24)
    for tree in ("chain", "dynamic"):
        decoder = _decoder(smollm2, options["heads"], tree, budget=8)
        assert decoder.generate(prompt, max_new_tokens=24).tokens == expected
    rows = _decoder(smollm2, options["heads"], "trie", budget=6).generate_batch([prompt, prompt[:20]], 16)
    assert rows[0].tokens == expected[:16]
    head = start_from_target(EagleHead(config_for(smollm2, "eagle3", draft_vocab_size=4096)), smollm2)
    layers = head.config.feature_layers
    assert layers == (2, 15, 27)  # SmolLM2 has 30 layers: the published low, middle and high ones
    save_head(head, tmp_path / "eagle3", smollm2)
    decoder = _decoder(smollm2, tmp_path / "eagle3", "dynamic", backend=f"kv(hidden_layers={layers})")
    assert decoder.generate(prompt, max_new_tokens=24).tokens == expected


def test_the_default_head_is_a_shipped_one_or_one_trained_here(heads, tmp_path, monkeypatch):
    """Without `heads=`, `eagle` uses the head shipped for the model, else the one `specframe train eagle`
    writes to its default place; the presets ask `kv` for PRESET_LAYERS and refuse a default head that
    reads other layers, or none, saying how to train one."""
    import shutil

    from specframe_eagle import PRESET_LAYERS, no_default_head
    from specframe_eagle.drafter import default_head, trained_head_dir

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    target = tiny_target(seed=0, layers=4)
    assert default_head(target.name) is None
    assert "specframe train eagle --model" in no_default_head(target)
    with pytest.raises(specframe.ModelLoadError, match="specframe train eagle --model"):
        EagleDrafter(target)
    registry = specframe.get_registry()
    for name in ("eagle", "suffix-eagle"):
        assert f"kv(hidden_layers={PRESET_LAYERS})" in registry.preset(name).spec
    trained = trained_head_dir(target.name) / "head"
    shutil.copytree(heads["eagle3"], trained)
    assert default_head(target.name) == trained and EagleDrafter(target).path == trained
    assert "does not read the target layers" in no_default_head(target)  # it reads LAYERS3


@pytest.mark.slow
def test_the_presets_are_lossless_on_the_real_model(smollm2, tmp_path, monkeypatch):
    """`eagle` and `suffix-eagle` on SmolLM2 with a head in the default place (untrained here: few drafts
    accepted): the output is plain greedy decoding's, alone and in a batch."""
    from specframe_eagle import no_default_head
    from specframe_eagle.drafter import trained_head_dir

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    head = start_from_target(EagleHead(config_for(smollm2, "eagle3", draft_vocab_size=4096)), smollm2)
    save_head(head, trained_head_dir(smollm2.name) / "head", smollm2)
    assert no_default_head(smollm2) is None
    registry = specframe.get_registry()
    prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}],
                                                     add_generation_prompt=True, tokenize=False)]
    expected = [reference_greedy(smollm2, smollm2.tokenizer(p, add_special_tokens=False)["input_ids"], 24)
                for p in prompts]
    for name in ("eagle", "suffix-eagle"):
        drafter, tree, verifier, backend = registry.preset(name).spec.split("+", 3)
        decoder = specframe.SpeculativeDecoder.from_names(smollm2, drafter, tree, verifier, backend, budget=8)
        for prompt, tokens in zip(prompts, expected):
            ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            assert decoder.generate(ids, max_new_tokens=24).tokens == tokens, name
    rows = decoder.generate_batch(prompts, max_new_tokens=24)
    assert [r.tokens for r in rows] == expected


@pytest.mark.parametrize("form", ["eagle", "eagle3"])
def test_a_bfloat16_head_drafts_and_the_output_stays_the_targets(heads, form):
    """`dtype=bfloat16`: the head's weights (not its rotary frequencies) in bfloat16, the target untouched,
    greedy output plain greedy decoding's; a dtype that does not exist is refused."""
    target = tiny_target(seed=0, layers=4 if form == "eagle3" else 2)
    backend = EAGLE3_BACKEND if form == "eagle3" else "kv"
    decoder = _decoder(target, heads[form], "dynamic", backend, dtype="bfloat16")
    head = decoder.pipeline.drafter.head
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}
    assert head.rotary.inv_freq.dtype == torch.float32
    assert next(target.model.parameters()).dtype == torch.float32
    prompt = repetitive_prompt(target.vocab_size, 30)
    assert decoder.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target, prompt, 20)
    with pytest.raises(specframe.ConfigurationError, match="dtype"):
        EagleDrafter(target, heads=str(heads[form]), dtype="float8")


def test_greedy_drafting_stops_where_no_deeper_node_could_enter_the_tree(heads, monkeypatch):
    """`out_of_reach` skips the levels whose nodes `dynamic` would not keep: the same trees are verified,
    with fewer head calls, than when every level is drafted."""
    import specframe_eagle.drafter as module

    target = tiny_target(seed=0, layers=2)
    prompt = repetitive_prompt(target.vocab_size, 30)

    def run():
        decoder = _decoder(target, heads["eagle"], "dynamic", budget=4, depth=5)
        builder, drafter = decoder.pipeline.tree_builder, decoder.pipeline.drafter
        build, expand, trees, calls = builder.build, drafter._expand, [], []
        builder.build = lambda proposal, context: trees.append(build(proposal, context)) or trees[-1]
        drafter._expand = lambda *args: calls.append(1) or expand(*args)
        tokens = decoder.generate(prompt, max_new_tokens=24).tokens
        return tokens, [(t.tokens.tolist(), t.parents.tolist()) for t in trees], len(calls)

    reach = module.out_of_reach
    assert reach([-1.0, -2.0], 2, -2.0) and not reach([-1.0, -2.0], 2, -1.5)
    assert not reach([-1.0], 2, -9.0)  # fewer nodes than the budget: anything still enters
    pruned = run()
    monkeypatch.setattr(module, "out_of_reach", lambda scores, budget, best: False)
    every_level = run()
    assert pruned[0] == every_level[0] == reference_greedy(target, prompt, 24)
    assert pruned[1] == every_level[1]
    assert pruned[2] < every_level[2]
