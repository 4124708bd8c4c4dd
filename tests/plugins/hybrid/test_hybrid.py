"""specframe_hybrid: the Llama -> Mamba2 + attention conversion, layer-wise distillation, and model aliases
built on first use (the `register_models` hook). The real alias on the real model is in the slow tests at
the end; `tests/plugins/ssm/test_ssm_backends.py` and `tests/plugins/ssm/test_ssm_e2e.py` run the tree scan
on converted tinies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ssm_models import tiny_llama

import specframe
from specframe import ConfigurationError, ModelLoadError, ModelRecipe
from specframe_hybrid.convert import convert, hybrid_config, replaced_layers
from specframe_hybrid.distill import LayerTraining, TeacherActivations, distil_layers, mixer_path, train_mixer
from specframe_hybrid.end_to_end import EndToEndTraining

IDS = torch.tensor([[5, 9, 2, 33, 7, 7, 40, 11, 3, 5, 9, 2, 60, 1]])


def test_converting_no_layer_computes_the_llama():
    llama = tiny_llama(seed=3)
    hybrid = convert(llama, [])
    with torch.no_grad():  # to float rounding: the MLP's two input projections run as one matmul
        torch.testing.assert_close(hybrid(IDS).logits, llama(IDS).logits, atol=1e-5, rtol=1e-5)


def test_replaced_layers_change_only_from_their_layer_on():
    llama = tiny_llama(seed=3)
    hybrid = convert(llama, [2])
    seen = {}
    for name, model in (("llama", llama), ("hybrid", hybrid)):
        model.model.layers[1].register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(name, out))
        with torch.no_grad():
            model(IDS)
    hidden = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
    torch.testing.assert_close(hidden(seen["hybrid"]), hidden(seen["llama"]), atol=1e-5, rtol=1e-5)
    assert hybrid.config.layer_types == ["full_attention", "full_attention", "linear_attention",
                                         "full_attention"]


def test_mixer_starts_from_the_attention_it_replaces():
    llama = tiny_llama(seed=1)
    mixer = convert(llama, [1]).model.layers[1].mamba
    attention = llama.model.layers[1].self_attn
    inner, d = mixer.intermediate_size, mixer.head_dim
    rows = mixer.in_proj.weight.detach()
    k = attention.k_proj.weight.view(2, d, -1)  # 2 key/value heads serve 4 query heads
    v = attention.v_proj.weight.view(2, d, -1)
    for head in range(4):
        kv = head // 2
        torch.testing.assert_close(rows[inner + head * d:inner + (head + 1) * d], v[kv])  # x <- V
        torch.testing.assert_close(rows[2 * inner + head * d:2 * inner + (head + 1) * d], k[kv])  # B <- K
    torch.testing.assert_close(rows[3 * inner:4 * inner], attention.q_proj.weight)  # C <- Q
    torch.testing.assert_close(mixer.out_proj.weight, attention.o_proj.weight)
    conv = mixer.conv1d.weight.detach()
    assert (conv[:, 0, -1] == 1).all() and (conv[:, 0, :-1] == 0).all()  # identity convolution
    assert mixer.n_groups == 4 and mixer.ssm_state_size == d


@pytest.mark.parametrize(("spec", "layers"), [("1/2", [1, 3, 5, 7]), ("1/4", [2, 6]), ("none", []),
                                              ("3, 0,3", [0, 3])])
def test_replaced_layer_specs(spec, layers):
    assert replaced_layers(spec, 8) == layers


@pytest.mark.parametrize("spec", ["2/3", "1/1", "1/0", "a,b", "8", "-1", ""])
def test_bad_layer_specs_are_refused(spec):
    with pytest.raises(ConfigurationError, match="1/K|indices"):
        replaced_layers(spec, 8)


def test_only_llama_models_convert():
    from ssm_models import tiny_ssm_target

    with pytest.raises(ConfigurationError, match="Llama-architecture"):
        hybrid_config(tiny_ssm_target("bamba").model.config, [1])


def test_distillation_fits_the_attention_and_resumes(tmp_path):
    llama = tiny_llama(seed=2)
    blocks = torch.randint(0, 64, (12, 32), generator=torch.Generator().manual_seed(0))
    activations = TeacherActivations(tmp_path / "activations", blocks, [1, 2])
    assert activations.missing() == [0, 1]
    activations.fill(llama)
    assert activations.missing() == []
    inputs, outputs = activations.pairs(1)
    assert inputs.shape == outputs.shape == (12, 32, 32)
    settings = LayerTraining(steps=40, batch=4, lr=1e-2, warmup=5)
    reports = distil_layers(llama, activations, tmp_path, settings, order=[2, 1], log=lambda line: None)
    for layer in (1, 2):
        assert reports[layer]["held_out_after"] < 0.7 * reports[layer]["held_out_before"]
        assert mixer_path(tmp_path, layer).is_file()
    again = distil_layers(llama, activations, tmp_path, LayerTraining(steps=10 ** 6), log=lambda line: None)
    assert again == reports  # loaded from the saved mixers, not trained again


def test_activations_for_other_layers_are_recomputed(tmp_path):
    llama = tiny_llama(seed=2)
    blocks = torch.randint(0, 64, (9, 16), generator=torch.Generator().manual_seed(0))
    TeacherActivations(tmp_path, blocks, [1]).fill(llama)
    assert TeacherActivations(tmp_path, blocks, [1, 3]).missing() == [0, 1]
    TeacherActivations(tmp_path, blocks, [1, 3]).fill(llama)
    assert TeacherActivations(tmp_path, blocks, [3]).missing() == []  # a subset is served as it is


def test_training_lowers_the_error_of_a_converted_mixer():
    llama = tiny_llama(seed=4)
    mixer = convert(llama, [1]).model.layers[1].mamba
    x = torch.randn(8, 24, 32)
    with torch.no_grad():
        rotary = llama.model.rotary_emb(x, torch.arange(24)[None])
        attention = llama.model.layers[1].self_attn
        y = attention(hidden_states=x, attention_mask=None, position_embeddings=rotary)[0]
    report = train_mixer(mixer, x, y, LayerTraining(steps=40, batch=4, lr=1e-2, warmup=5))
    assert report["train_last"] < report["train_first"]


# --- model aliases built on first use ------------------------------------------------------------


class Recipes:
    """A plugin registering one model alias whose build saves a tiny converted hybrid and counts calls."""

    def __init__(self, fail: bool = False):
        self.builds, self.fail = 0, fail

    def build(self, directory: Path, log) -> None:
        self.builds += 1
        if self.fail:
            raise RuntimeError("the recipe broke")
        convert(tiny_llama(seed=5), [1]).save_pretrained(directory)

    @specframe.hookimpl
    def register_models(self, register):
        register(ModelRecipe("tiny-hybrid-alias", self.build, help="a test alias", minutes=0.1))


@pytest.fixture
def fresh_registry(monkeypatch, tmp_path):
    from specframe.plugging import registry as registry_module

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(registry_module, "_registry", None)
    yield registry_module.get_registry()
    monkeypatch.setattr(registry_module, "_registry", None)


def test_an_alias_is_built_once_then_loaded(fresh_registry):
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import model_cache_dir, resolve_model_dir

    recipes = Recipes()
    fresh_registry.register_plugin(recipes, name="test-recipes")
    assert "tiny-hybrid-alias" in fresh_registry.describe()["plugins"][-1].get("models", []) or any(
        "tiny-hybrid-alias" in p.get("models", []) for p in fresh_registry.describe()["plugins"])
    first = resolve_model_dir("tiny-hybrid-alias", model_recipes)
    second = resolve_model_dir("tiny-hybrid-alias", model_recipes)
    assert first == second == model_cache_dir("tiny-hybrid-alias")
    assert recipes.builds == 1
    assert (first / "config.json").is_file()


def test_a_failed_build_leaves_nothing_and_says_which_alias(fresh_registry):
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import model_cache_dir, resolve_model_dir

    fresh_registry.register_plugin(Recipes(fail=True), name="test-recipes")
    with pytest.raises(ModelLoadError, match="cannot build model 'tiny-hybrid-alias': the recipe broke"):
        resolve_model_dir("tiny-hybrid-alias", model_recipes)
    cache = model_cache_dir("tiny-hybrid-alias")
    assert not cache.exists()
    assert [p.name for p in cache.parent.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("name", ["org/model", "two words", ""])
def test_alias_names_that_would_read_as_something_else_are_refused(name):
    with pytest.raises(ConfigurationError, match="model alias"):
        ModelRecipe(name, lambda directory, log: None)


def test_unknown_model_names_list_the_recipe_aliases():
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import resolve_model_dir

    with pytest.raises(ModelLoadError, match="smollm2-135m-hybrid"):
        resolve_model_dir("no-such-model-alias", model_recipes)


def test_packaged_mixers_refuse_another_teacher(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from specframe_hybrid import packaged

    weights = tmp_path / "mixers.safetensors"
    save_file({"layers.1.D": torch.ones(4)}, str(weights), metadata={
        "hidden_size": "32", "vocab_size": "64", "num_layers": "4", "embed_checksum": "1.0000",
        "layers": "1"})
    teacher = specframe.Target(model=tiny_llama(seed=0), tokenizer=None, name="tiny")
    monkeypatch.setattr(specframe, "load_target", lambda *a, **k: teacher)
    with pytest.raises(ModelLoadError, match="distilled from another model"):
        packaged.build_from_file(weights, tmp_path / "out", log=lambda line: None)


def test_end_to_end_lowers_the_divergence_and_resumes(tmp_path):
    from specframe_hybrid.end_to_end import load_end_to_end, train_end_to_end

    llama = tiny_llama(seed=6)
    blocks = torch.randint(0, 64, (6, 24), generator=torch.Generator().manual_seed(1))
    hybrid = convert(llama, [1, 3])
    frozen = {k: v.clone() for k, v in hybrid.state_dict().items() if ".mamba." not in k}
    first = train_end_to_end(llama, hybrid, [1, 3], blocks, tmp_path, EndToEndTraining(steps=10, lr=1e-2),
                             log=lambda line: None)
    assert all(torch.equal(hybrid.state_dict()[k], v) for k, v in frozen.items())  # only mixers trained
    resumed = convert(llama, [1, 3])
    report = train_end_to_end(llama, resumed, [1, 3], blocks, tmp_path, EndToEndTraining(steps=30, lr=1e-2),
                              log=lambda line: None)
    assert report["steps"] == 30 and report["kl_first"] == first["kl_first"]  # continued, not restarted
    assert report["kl_last"] < report["kl_first"]
    loaded = convert(llama, [1, 3])
    load_end_to_end(loaded, tmp_path)
    torch.testing.assert_close(loaded(IDS).logits, resumed(IDS).logits)


def test_quality_rows_compare_argmax_and_score_the_text():
    from specframe_hybrid.quality import _next_token_stats, _row, table

    llama = tiny_llama(seed=7)
    sequences = [IDS[0].tolist(), IDS[0, :9].tolist()]
    reference = [_next_token_stats(llama, ids) for ids in sequences]
    same = _row("copy", "suite", [_next_token_stats(convert(llama, []), ids) for ids in sequences], reference)
    assert same["agreement"] == 1.0 and same["positions"] == 13 + 8
    stranger = tiny_llama(seed=8)
    other = _row("other", "suite", [_next_token_stats(stranger, ids) for ids in sequences], reference)
    assert other["agreement"] < 0.5
    teacher_row = _row("t", "suite", reference, reference)
    assert same["perplexity"] == pytest.approx(teacher_row["perplexity"], rel=1e-4)
    assert "| copy | suite | 1.000 |" in table([same])


@pytest.mark.slow
def test_the_whole_recipe_on_a_tiny_teacher_builds_a_served_hybrid_and_resumes(smollm2, tmp_path):
    """`specframe_hybrid.recipe.run` end to end (teacher answers, activations, both stages, save) on a tiny
    random Llama with SmolLM2's tokenizer; the saved hybrid loads by itself and decodes losslessly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specframe_hybrid.recipe import Recipe, run

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=smollm2.vocab_size, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, eos_token_id=2, bos_token_id=1, pad_token_id=2)
    teacher_dir = tmp_path / "teacher"
    LlamaForCausalLM(config).save_pretrained(teacher_dir)
    smollm2.tokenizer.save_pretrained(teacher_dir)
    recipe = Recipe(model=str(teacher_dir), ratios=["1/2"], block=64, code_tokens=1024, chat_prompts=2,
                    chat_new_tokens=8, training=LayerTraining(steps=3, batch=2, warmup=1),
                    end_to_end=EndToEndTraining(steps=2))
    out = tmp_path / "hybrid"
    summary = run(recipe, tmp_path / "run", {"1/2": out}, log=lambda line: None)
    assert summary["tokens"] % 64 == 0 and summary["end_to_end"]["1/2"]["steps"] == 2
    assert sorted(summary["layers"]) == ["1", "3"]
    hybrid = specframe.load_target(str(out), device="cpu", dtype="float32")
    assert type(hybrid.model).__name__ == "GraniteMoeHybridForCausalLM"
    prompt = hybrid.tokenizer("def add(a, b):\n    return a + b\n\ndef add(a, b):")["input_ids"]
    plain = specframe.SpeculativeDecoder.from_names(hybrid, "none", "chain", "greedy", "ssm-tree", budget=1)
    spec = specframe.SpeculativeDecoder.from_names(hybrid, "pld", "chain", "greedy", "ssm-tree", budget=4)
    assert spec.generate(prompt, 12).tokens == plain.generate(prompt, 12).tokens
    again = run(recipe, tmp_path / "run", None, log=lambda line: None)  # every stage found done
    assert again["layers"] == summary["layers"] and again["end_to_end"]["1/2"]["steps"] == 2


def test_assembling_undistilled_layers_names_them(tmp_path):
    from specframe_hybrid.distill import assemble

    with pytest.raises(ConfigurationError, match=r"no distilled mixer for layers \[1, 3\].*hybrid build"):
        assemble(tiny_llama(seed=0), [1, 3], tmp_path)
