"""`specframe train eagle`: the loss falls, the unrolled steps see what drafting sees, the state resumes,
the head is written in its published layout and drafts losslessly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import specframe
from specframe.testing import reference_greedy, repetitive_prompt, tiny_target
from specframe_eagle.checkpoint import load_head
from specframe_eagle.drafter import EagleDrafter
from specframe_eagle.head import StepKeys
from specframe_eagle.train import TrainConfig, Trainer, unrolled_mask

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in tests/conftest.py


def _trainer(tmp_path, target=None, **config):
    target = target or tiny_target(seed=0, layers=4)
    blocks = np.asarray([repetitive_prompt(target.vocab_size, 24, seed=s) for s in range(8)])  # (8, 24)
    settings = {"block": 24, "batch": 4, "steps": 4, "lr": 3e-3, "warmup": 1, "draft_vocab": 48,
                "save_every": 2} | config
    return Trainer(target, blocks, tmp_path, TrainConfig(**settings), log=lambda line: None)


@pytest.mark.parametrize("form", ["eagle", "eagle3"])
def test_training_lowers_the_loss(tmp_path, form):
    trainer = _trainer(tmp_path, form=form, steps=30)
    ids = torch.from_numpy(trainer.blocks[:4])
    with torch.no_grad():
        before, parts = trainer.losses(ids)
    assert len(parts) == 3 and set(parts[0]) >= {"token", "top1"}
    assert ("feature" in parts[0]) == (form == "eagle")
    for _ in range(15):
        trainer.train_step()
    with torch.no_grad():
        after, _ = trainer.losses(ids)
    assert after.item() < before.item()


def test_unrolled_steps_see_what_drafting_sees(tmp_path):
    """Training's step s at position i equals the drafter's head at depth s + 1 drafting the real tokens
    after a context of i - s + 1 committed pairs: same inputs, positions and visible keys."""
    trainer = _trainer(tmp_path, steps=3, unroll=3, draft_vocab=0)  # draft ids are token ids
    trainer.run()
    target = trainer.target
    head_dir = trainer.export(tmp_path / "head", "test", ["test"])
    ids = torch.from_numpy(trainer.blocks[:1])  # (1, T)
    with torch.no_grad():
        feats, _, _ = trainer.targets(ids)
        embeds = target.model.get_input_embeddings()(ids[:, 1:])
        keys, inputs, outs = StepKeys(trainer.head), feats[:, :-1], []
        for s in range(3):
            out = trainer.head(embeds, inputs, torch.arange(embeds.shape[1])[None], keys, None,
                               unrolled_mask(embeds.shape[1], s)[None, None])
            outs.append(out[0])
            inputs = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)
    drafter = EagleDrafter(target, heads=str(head_dir))
    tokens = ids[0].numpy()
    for s, i in ((1, 9), (2, 14), (2, 5)):
        n = i - s + 1  # committed pairs 0..n-1 (real features); the root output predicts f_n
        drafter.reset()
        drafter.queue = [feats[0, :n]]
        context = specframe.DraftContext(tokens[: n + 1], 1, 8, hidden=feats[0, n - 1])
        with torch.inference_mode():
            assert drafter._read_context(context)
            chain = [int(t) for t in tokens[n + 1: n + 1 + s]]  # the real tokens, drafted at depths 1..s
            outputs, slots = drafter.root, {}
            for depth in range(1, s + 1):
                outputs = drafter._expand([depth - 1], [0], outputs, chain, list(range(-1, s - 1)), slots,
                                          depth)
        torch.testing.assert_close(outputs[0], outs[s][i].to(outputs.dtype), atol=2e-3, rtol=2e-3)


def test_state_resumes_and_the_head_is_written_in_the_published_layout(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.run()
    head_dir = trainer.export(tmp_path / "head", "specframe train eagle ...", ["test"])
    config = json.loads((head_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 48
    assert config["specframe"]["training"]["steps"] == 4
    loaded, _ = load_head(trainer.target, str(head_dir))
    for name, value in trainer.head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(), value.float(), atol=2e-3, rtol=2e-3)
    resumed = _trainer(tmp_path)
    assert resumed.resume() and resumed.step == 4
    for a, b in zip(trainer.head.parameters(), resumed.head.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(specframe.ConfigurationError, match="other settings"):
        _trainer(tmp_path, steps=9).resume()


def test_the_command_trains_a_head_that_decodes_losslessly(tmp_path):
    from typer.testing import CliRunner

    from specframe.cli import build_app

    target = tiny_target(seed=0, layers=4)
    model_dir = tmp_path / "tiny"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    text = tmp_path / "data.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "run"
    args = ["train", "eagle", "--model", str(model_dir), "--data", str(text), "--out", str(out),
            "--steps", "3", "--block", "32", "--batch", "2", "--draft-vocab", "32", "--features", "last",
            "--threads", "1"]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "step 3/3" in result.output and (out / "head" / "model.safetensors").is_file()
    loaded = specframe.load_target(str(model_dir))
    prompt = repetitive_prompt(loaded.vocab_size, 30)
    decoder = specframe.SpeculativeDecoder.from_names(
        loaded, specframe.ComponentSpec("eagle", {"heads": str(out / "head")}), "dynamic", budget=6)
    assert decoder.generate(prompt, max_new_tokens=16).tokens == reference_greedy(loaded, prompt, 16)
    again = CliRunner().invoke(build_app(), args)  # done: resumes at step 3, trains nothing more
    assert again.exit_code == 0 and "resumed" in again.output


def test_answers_data_are_the_targets_own_text(tmp_path, monkeypatch):
    """`--data answers:NAME` reads an earlier `model:self` build's prompts and answers as token ids (the
    reader `specframe train s4c` shares); a build that does not exist is named with how to make it."""
    from specframe_corpus.answers import prompt_key
    from specframe_eagle.data import token_blocks

    target = tiny_target(seed=0, layers=2)
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    with pytest.raises(specframe.ConfigurationError, match="--data answers:chat: .*--source model:self"):
        token_blocks(target, ["answers:chat"], 4, tmp_path / "run")
    home = tmp_path / "datastores"
    home.mkdir()
    (home / "chat.prompts.jsonl").write_text(json.dumps({"prompt": "ab"}) + "\n")
    answers = [{"settings": {"template": False}}, {"prompt": prompt_key("ab"), "ids": [30, 31, 32]}]
    (home / "chat.answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in answers))
    prompt = target.tokenizer("ab", add_special_tokens=False)["input_ids"]
    eos = [min(target.eos_token_ids)] if target.eos_token_ids else []
    expected = list(prompt) + [30, 31, 32] + eos
    blocks = token_blocks(target, ["answers:chat"], len(expected), tmp_path / "run")
    assert blocks.reshape(-1).tolist() == expected
    (home / "chat.prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("ab", "c")))
    answers.append({"prompt": prompt_key("c"), "ids": [40]})
    (home / "chat.answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in answers))
    blocks = token_blocks(target, ["answers:chat:1"], 1, tmp_path / "run")  # the first chat only
    assert blocks.reshape(-1).tolist() == expected


def test_bfloat16_autocast_trains_and_leaves_the_target_in_its_dtype(tmp_path):
    trainer = _trainer(tmp_path, steps=20, amp=True)
    ids = torch.from_numpy(trainer.blocks[:4])
    feats, _, logp = trainer.targets(ids)
    assert feats.dtype == logp.dtype == torch.float32
    with torch.no_grad():
        before, _ = trainer.losses(ids)
    for _ in range(10):
        trainer.train_step()
    with torch.no_grad():
        after, _ = trainer.losses(ids)
    assert after.item() < before.item()
    assert all(p.dtype == torch.float32 for p in trainer.head.parameters())


def test_init_starts_from_an_earlier_head_of_the_same_form(tmp_path):
    first = _trainer(tmp_path / "a")
    first.run()
    head = first.export(tmp_path / "a" / "head", "test", ["test"])
    second = _trainer(tmp_path / "b", init=str(head))
    for name, value in first.head.state_dict().items():  # float16 on disk
        torch.testing.assert_close(second.head.state_dict()[name].float(), value.float(), atol=2e-3,
                                   rtol=2e-3)
    assert torch.equal(second.vocab_ids, first.vocab_ids)
    with pytest.raises(specframe.ConfigurationError, match="same --form, --features and --draft-vocab"):
        _trainer(tmp_path / "c", init=str(head), draft_vocab=32)
