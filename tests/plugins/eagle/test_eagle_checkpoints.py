"""EAGLE checkpoints in the layouts the engines load: EAGLE-1/2 and EAGLE-3 heads written by hand with the
published key names (tests/helpers/eagle_checkpoints.py) load, compute the published equations, and are
refused with a message that says what to do when they are pickled, for another target, or damaged."""

from __future__ import annotations

import json

import pytest
import torch
from eagle_checkpoints import (
    eagle1_head, eagle1_tensors, eagle3_head, eagle3_tensors, llama_config, reference_eagle1,
    reference_eagle3, write_head,
)

import specframe
from specframe.testing import tiny_target
from specframe_eagle.checkpoint import EagleHeadMismatch, config_for, load_head, save_head
from specframe_eagle.head import EagleHead

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py

DRAFT_IDS = [5, 3, 17, 40, 41, 90, 0, 64]  # an EAGLE-3 draft vocabulary, in no particular order


def _inputs(target, length=7, width=None, seed=1):
    gen = torch.Generator().manual_seed(seed)
    hidden = target.config.hidden_size
    return torch.randn(length, hidden, generator=gen), torch.randn(length, width or hidden, generator=gen)


@pytest.mark.parametrize("layers", [1, 2])
def test_an_eagle1_checkpoint_loads_and_computes_the_published_head(tmp_path, layers):
    target = tiny_target(seed=0)
    tensors = eagle1_tensors(target, layers=layers)
    head, _ = load_head(target, str(eagle1_head(tmp_path, target, layers=layers)))
    assert head.config.form == "eagle" and head.config.layers == layers and head.config.fc_bias
    assert not hasattr(head.layers[0], "input_layernorm")  # as published: the first layer reads fc's output
    torch.testing.assert_close(head.fc.weight, tensors["fc.weight"])
    embeds, feats = _inputs(target)
    got = head(embeds[None], feats[None], torch.arange(len(embeds))[None])[0]
    torch.testing.assert_close(got, reference_eagle1(tensors, target, embeds, feats, layers), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("prefix", ["midlayer.", "layers.0."])  # SafeAILab's name, and SpecForge's
def test_an_eagle3_checkpoint_loads_and_computes_the_published_head(tmp_path, prefix):
    target = tiny_target(seed=0, layers=4)
    tensors = eagle3_tensors(target, DRAFT_IDS, prefix=prefix)
    config = llama_config(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(DRAFT_IDS),
                          eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    head, _ = load_head(target, str(write_head(tmp_path, config, tensors)))
    assert head.config.form == "eagle3" and head.config.feature_layers == (1, 2, 3)
    assert (torch.arange(len(DRAFT_IDS)) + head.d2t).tolist() == DRAFT_IDS
    embeds, feats = _inputs(target, width=3 * target.config.hidden_size)
    got = head(embeds[None], feats[None], torch.arange(len(embeds))[None])[0]
    named = {k.replace(prefix, "midlayer."): v for k, v in tensors.items()}
    torch.testing.assert_close(got, reference_eagle3(named, target, embeds, feats), atol=1e-5, rtol=1e-5)


def test_eagle3_reads_the_published_default_layers(tmp_path):
    target = tiny_target(seed=0, layers=8)
    config = llama_config(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(DRAFT_IDS))
    head, _ = load_head(target, str(write_head(tmp_path, config, eagle3_tensors(target, DRAFT_IDS))))
    assert head.config.feature_layers == (2, 4, 5)  # 2, L // 2, L - 3


def test_keys_under_a_model_prefix_and_sharded_files_load(tmp_path):
    target = tiny_target(seed=0)
    tensors = {f"model.{k}": v for k, v in eagle1_tensors(target, embed=False).items()}
    names = sorted(tensors)
    from safetensors.torch import save_file

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(llama_config(target)))
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    head, _ = load_head(target, str(tmp_path))
    torch.testing.assert_close(head.fc.bias, tensors["model.fc.bias"])


def test_our_checkpoints_round_trip_in_the_published_layouts(tmp_path):
    target = tiny_target(seed=0, layers=4)
    for form, vocab in (("eagle", None), ("eagle3", 24)):
        head = EagleHead(config_for(target, form, draft_vocab_size=vocab))
        save_head(head, tmp_path / form, target, dtype=torch.float32)
        loaded, _ = load_head(target, str(tmp_path / form))
        assert loaded.config == head.config
        for name, value in head.state_dict().items():
            torch.testing.assert_close(loaded.state_dict()[name], value, msg=name)
        if form == "eagle3":
            keys = set(loaded.state_dict())
            assert {"midlayer.hidden_norm.weight", "d2t", "t2d", "lm_head.weight", "norm.weight"} <= keys


def test_pickled_weights_are_refused_with_how_to_convert(tmp_path):
    target = tiny_target(seed=0)
    (tmp_path / "config.json").write_text(json.dumps(llama_config(target)))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not unpickled")
    with pytest.raises(specframe.ModelLoadError, match=r"pickled weights \(pytorch_model.bin\).*never loads.*"
                                                       r"save_file.*weights_only=True"):
        load_head(target, str(tmp_path))


def test_a_head_for_another_target_is_refused_naming_what_differs(tmp_path):
    head = eagle1_head(tmp_path, tiny_target(seed=0))
    other = tiny_target(seed=0, hidden_size=48)
    with pytest.raises(EagleHeadMismatch, match="hidden size 32 vs the target's 48"):
        load_head(other, str(head))
    with pytest.raises(EagleHeadMismatch, match="vocabulary 96 vs the target's 64"):
        load_head(tiny_target(seed=0, vocab_size=64, tokenizer=False), str(head))
    deep = eagle3_head(tmp_path / "e3", tiny_target(seed=0, layers=4), DRAFT_IDS, [1, 2, 9])
    with pytest.raises(EagleHeadMismatch, match=r"hidden states \[1, 2, 9\], but the target has 4 layers"):
        load_head(tiny_target(seed=0, layers=4), str(deep))


def test_damaged_heads_are_refused(tmp_path):
    target = tiny_target(seed=0)
    tensors = eagle1_tensors(target)
    del tensors["layers.0.mlp.up_proj.weight"]
    with pytest.raises(specframe.ModelLoadError, match=r"missing: \['layers.0.mlp.up_proj.weight'\]"):
        load_head(target, str(write_head(tmp_path / "a", llama_config(target), tensors)))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(llama_config(target)))
    (tmp_path / "b" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(specframe.ModelLoadError, match="not a readable safetensors file"):
        load_head(target, str(tmp_path / "b"))
    bad = eagle3_tensors(tiny_target(seed=0, layers=4), DRAFT_IDS)
    bad["d2t"][0] = 200  # draft id 0 -> target id 200, past the vocabulary
    config = llama_config(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(DRAFT_IDS),
                          eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    with pytest.raises(specframe.ModelLoadError, match="d2t"):
        load_head(tiny_target(seed=0, layers=4), str(write_head(tmp_path / "c", config, bad)))


def test_a_hub_id_is_looked_up_in_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    expected = r"not in the local Hugging Face cache.*nothing at run time.*hf download someone/EAGLE3-head"
    with pytest.raises(specframe.ModelLoadError, match=expected):
        load_head(tiny_target(seed=0), "someone/EAGLE3-head")


def test_a_hub_id_in_the_cache_loads(tmp_path, monkeypatch):
    """A snapshot laid out as huggingface_hub caches it (refs/main -> snapshots/<commit>)."""
    cache = tmp_path / "hub"
    repo = cache / "models--someone--EAGLE-head"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    target = tiny_target(seed=0)
    eagle1_head(repo / "snapshots" / commit, target)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    head, where = load_head(target, "someone/EAGLE-head")
    assert where == repo / "snapshots" / commit and head.config.form == "eagle"
