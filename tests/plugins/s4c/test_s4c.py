"""S4C heads, their training and checkpoints, and the `s4c` drafter."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import specframe
from specframe.testing import DrafterConformance, reference_greedy, repetitive_prompt, tiny_target
from specframe.runtime.packed_linear import pack_linear_layers
from specframe_s4c.drafter import S4CDrafter, packaged_heads
from specframe_s4c.features import FeatureCache
from specframe_s4c.heads import S4CHeads, S4CHeadsMismatch, read_heads_file
from specframe_s4c.train import Trainer, TrainConfig, frequent_tokens, head_losses

_TMP_DIR = tempfile.TemporaryDirectory(prefix="specframe-s4c-test-")  # removed when the session ends
_TMP = Path(_TMP_DIR.name)


def tiny_heads_file(seed: int = 0, vocab_ids: torch.Tensor | None = None) -> Path:
    """Untrained heads for `tiny_target(seed)`, written once per test session."""
    path = _TMP / f"heads-{seed}-{0 if vocab_ids is None else len(vocab_ids)}.safetensors"
    if not path.is_file():
        torch.manual_seed(seed)
        S4CHeads(tiny_target(seed=seed), 3, vocab_ids=vocab_ids).save(path)
    return path


class TestS4CConformance(DrafterConformance):
    component = "s4c"
    max_new_tokens = 16

    @property
    def options(self):
        return {"heads": str(tiny_heads_file(0)), "widths": 2}


def test_head_shapes_and_parameter_sharing():
    target = tiny_target(seed=0)
    heads = S4CHeads(target, num_heads=3)
    hidden = target.config.hidden_size
    out = heads(1, torch.randn(5, hidden), torch.randn(5, hidden))
    assert out.shape == (5, hidden)
    head = heads.heads[0]
    assert head.fc.weight.shape == (hidden, 2 * hidden)
    assert type(head.layer) is type(target.model.model.layers[0])  # a decoder layer of the target's class
    # the heads own no embedding / LM head: nothing of vocabulary size
    assert all(target.vocab_size not in p.shape for p in heads.parameters())
    # each head has its own weights, none shared with the target
    target_ptrs = {p.data_ptr() for p in target.model.parameters()}
    head_ptrs = [{p.data_ptr() for p in h.parameters()} for h in heads.heads]
    assert not (head_ptrs[0] & head_ptrs[1]) and not (head_ptrs[0] & target_ptrs)
    drafter = S4CDrafter(target, heads=str(tiny_heads_file(0)))
    assert drafter.embed is target.model.get_input_embeddings()  # shared, not copied


def _tiny_trainer(tmp_path, steps=1, target=None, log=lambda line: None, **config):
    target = target or tiny_target(seed=0)
    blocks = np.asarray([repetitive_prompt(target.vocab_size, 24, seed=s) for s in range(8)])  # (8, 24)
    cache = FeatureCache(tmp_path / "features", blocks, hidden=target.config.hidden_size)
    cache.fill(target, batch=4, log=lambda line: None)
    defaults = {"block": 24, "batch": 4, "steps": steps, "lr": 3e-3, "warmup": 1, "draft_vocab": 48}
    return Trainer(target, cache, tmp_path / "run", TrainConfig(**(defaults | config)), log=log)


def test_cached_features_are_the_targets_last_hidden_states(tmp_path):
    trainer = _tiny_trainer(tmp_path)
    ids, feats = trainer.cache.batch(np.array([0, 3]))
    with torch.no_grad():
        out = trainer.target.model(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(feats, out.hidden_states[-1], atol=2e-2, rtol=1e-2)  # stored as float16


def test_a_training_step_lowers_the_loss(tmp_path):
    trainer = _tiny_trainer(tmp_path, steps=30)
    ids, feats = trainer.cache.batch(np.arange(4))
    with torch.no_grad():
        before, parts = head_losses(trainer.heads, trainer.target, ids, feats)
    assert len(parts) == 3 and set(parts[0]) == {"token", "distribution", "feature", "top1"}
    for _ in range(5):
        trainer.train_step()
    with torch.no_grad():
        after, _ = head_losses(trainer.heads, trainer.target, ids, feats)
    assert after.item() < before.item()


def test_checkpoint_round_trip_and_resume(tmp_path):
    trainer = _tiny_trainer(tmp_path, steps=4)
    trainer.run()
    path = tmp_path / "heads.safetensors"
    trainer.export(path, "specframe train s4c ...", ["test"])
    loaded = S4CHeads.load(trainer.target, path)
    assert torch.equal(loaded.vocab_ids, trainer.heads.vocab_ids) and len(loaded.vocab_ids) == 48
    for (name, a), b in zip(trainer.heads.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-3, rtol=2e-3, msg=name)  # fp16 storage
    assert loaded.meta["model"] == "tiny-llama-0" and loaded.meta["steps"] == "4"
    resumed = _tiny_trainer(tmp_path, steps=4)
    assert resumed.resume() and resumed.step == 4
    for a, b in zip(trainer.heads.parameters(), resumed.heads.parameters()):
        assert torch.equal(a, b)
    other = _tiny_trainer(tmp_path, steps=9)  # another schedule: refuse to mix states
    with pytest.raises(specframe.ConfigurationError, match="other settings"):
        other.resume()


def test_training_starts_from_earlier_heads_with_a_new_vocabulary(tmp_path):
    """`--init`: the head weights carry over; the draft vocabulary is chosen from the new data."""
    first = _tiny_trainer(tmp_path / "a", steps=3)
    first.run()
    path = tmp_path / "a" / "heads.safetensors"
    first.export(path, "specframe train s4c ...", ["test"])
    warm = _tiny_trainer(tmp_path / "b", steps=3, init=str(path), draft_vocab=32)
    assert len(warm.heads.vocab_ids) == 32
    for name, a in first.heads.state_dict().items():
        if name != "vocab_ids":
            torch.testing.assert_close(a, warm.heads.state_dict()[name], atol=2e-3, rtol=2e-3, msg=name)
    cold = _tiny_trainer(tmp_path / "c", steps=3)
    assert not torch.equal(cold.heads.heads[0].fc.weight, warm.heads.heads[0].fc.weight)
    with pytest.raises(specframe.ConfigurationError, match="holds 3 heads, not 2; pass --heads 3"):
        _tiny_trainer(tmp_path / "d", steps=3, init=str(path), num_heads=2)


def tiny_hybrid_target(mamba_layers=(0,), **llama) -> specframe.Target:
    """`tiny_target(seed=0)` converted by specframe_hybrid into a GraniteMoeHybrid: the same embeddings, its
    MLPs under the hybrid's names (`shared_mlp.input_linear` = [gate; up], `shared_mlp.output_linear`)."""
    from specframe_hybrid.convert import convert

    hybrid = convert(tiny_target(seed=0, **llama).model, list(mamba_layers), seed=0)
    return specframe.Target(model=hybrid, tokenizer=None, name="tiny-hybrid")


def test_training_warm_starts_a_hybrid_from_the_heads_of_the_llama_it_was_converted_from(tmp_path):
    """`--init` with heads of another target of the same hidden size and vocabulary: a warm start mapped by
    name (Llama MLP -> hybrid shared_mlp), said in one line; drafting with those heads still refuses."""
    path = tiny_heads_file(0)  # trained for the Llama tiny_target(seed=0)
    hybrid = tiny_hybrid_target()
    lines = []
    warm = _tiny_trainer(tmp_path / "a", steps=3, target=hybrid, init=str(path), log=lines.append)
    assert len(lines) == 1 and "warm start" in lines[0] and "LlamaForCausalLM" in lines[0]
    source = {k: v.float() for k, v in S4CHeads.load(tiny_target(seed=0), path).state_dict().items()}
    for k, head in enumerate(warm.heads.heads):
        pre = f"heads.{k}.layer."
        attention = head.layer.self_attn
        mlp = head.layer.shared_mlp
        torch.testing.assert_close(mlp.input_linear.weight, torch.cat(
            [source[pre + "mlp.gate_proj.weight"], source[pre + "mlp.up_proj.weight"]]))
        torch.testing.assert_close(mlp.output_linear.weight, source[pre + "mlp.down_proj.weight"])
        torch.testing.assert_close(attention.v_proj.weight, source[pre + "self_attn.v_proj.weight"])
        torch.testing.assert_close(head.fc.weight, source[f"heads.{k}.fc.weight"])
    warm.train_step()  # the mapped heads train
    with pytest.raises(S4CHeadsMismatch, match="architecture"):
        S4CHeads.load(hybrid, path)
    # a hybrid whose last layer is a Mamba2 mixer: the heads take its last attention layer
    mamba_last = _tiny_trainer(tmp_path / "b", steps=3, target=tiny_hybrid_target(mamba_layers=(1,)),
                               init=str(path))
    assert mamba_last.heads.heads[0].layer.self_attn is not None
    tensors = load_file(str(path))
    del tensors["heads.1.layer.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "broken.safetensors"), metadata=read_heads_file(path)[0])
    with pytest.raises(S4CHeadsMismatch, match="do not map.*missing.*heads.1.layer.shared_mlp.input_linear"):
        _tiny_trainer(tmp_path / "d", steps=3, target=hybrid, init=str(tmp_path / "broken.safetensors"))
    with pytest.raises(S4CHeadsMismatch, match="hidden_size"):
        _tiny_trainer(tmp_path / "c", steps=3, target=tiny_hybrid_target(hidden_size=48), init=str(path))


def test_a_bfloat16_autocast_step_lowers_the_loss(tmp_path):
    trainer = _tiny_trainer(tmp_path, steps=30, amp=True)
    ids, feats = trainer.cache.batch(np.arange(4))
    with torch.no_grad():
        before, _ = head_losses(trainer.heads, trainer.target, ids, feats)
    for _ in range(5):
        trainer.train_step()
    with torch.no_grad():
        after, _ = head_losses(trainer.heads, trainer.target, ids, feats)
    assert after.item() < before.item() and trainer.heads.heads[0].fc.weight.dtype == torch.float32


def test_heads_for_another_model_are_a_clear_error():
    with pytest.raises(S4CHeadsMismatch, match="trained for model 'tiny-llama-0'.*embed_checksum"):
        S4CHeads.load(tiny_target(seed=1), tiny_heads_file(0))
    with pytest.raises(S4CHeadsMismatch, match="hidden_size"):
        S4CHeads.load(tiny_target(seed=0, hidden_size=48), tiny_heads_file(0))
    with pytest.raises(specframe.ModelLoadError, match="no trained heads ship"):
        S4CDrafter(tiny_target(seed=0))


def test_frequent_tokens_keep_the_most_common_and_the_forced():
    blocks = np.array([[5, 5, 5, 2, 2, 9]])
    assert frequent_tokens(blocks, 16, 2).tolist() == [2, 5]
    assert frequent_tokens(blocks, 16, 2, always={11}).tolist() == [5, 11]
    assert frequent_tokens(blocks, 16, 0).tolist() == list(range(16))


def test_proposals_form_a_scored_forest():
    target = tiny_target(seed=0)
    vocab = torch.arange(0, 96, 2)  # an even-token draft vocabulary
    drafter = S4CDrafter(target, heads=str(tiny_heads_file(0, vocab)), topk=3, widths=(1, 2, 2))
    context = specframe.DraftContext(np.arange(10), 5, 20, torch.randn(target.config.hidden_size))
    proposal = drafter.propose(context)
    assert list(np.bincount(proposal.depth)[1:]) == [3, 6, 6]  # topk x (1, 2, 2) expanded nodes
    assert np.all(proposal.tokens % 2 == 0)
    probs = proposal.draft_probs
    assert probs.shape == (15, target.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(15))
    assert torch.all(probs[:, 1::2] == 0)  # q is zero outside the draft vocabulary
    for i, p in enumerate(proposal.parents):  # scores are cumulative log q
        base = proposal.scores[p] if p >= 0 else 0.0
        assert proposal.scores[i] == pytest.approx(base + float(probs[i, proposal.tokens[i]].log()), abs=1e-5)
    assert len(proposal.children[1]) == 3  # the top-1 chain is always expanded: node 0 has children
    assert drafter.propose(specframe.DraftContext(np.arange(10), 5, 20, None)).tokens.size == 0


def test_depth_drafts_with_the_first_heads_only():
    target = tiny_target(seed=0)
    context = specframe.DraftContext(np.arange(10), 5, 20, torch.randn(target.config.hidden_size))
    full = S4CDrafter(target, heads=str(tiny_heads_file(0)), topk=2, widths=(1, 2, 2)).propose(context)
    for depth in (1, 2):
        drafter = S4CDrafter(target, heads=str(tiny_heads_file(0)), topk=2, widths=(1, 2, 2), depth=depth)
        proposal = drafter.propose(context)
        assert proposal.depth.max() == depth
        assert proposal.tokens.tolist() == full.tokens[full.depth <= depth].tolist()  # the same top levels
    with pytest.raises(specframe.ConfigurationError, match="depth"):
        S4CDrafter(target, heads=str(tiny_heads_file(0)), depth=0)


def test_drafting_dtype_follows_the_option_and_the_cpu(monkeypatch):
    from specframe.kit.models import drafting_dtype

    target = tiny_target(seed=0)  # float32 on the CPU
    monkeypatch.setattr("specframe.kit.models.native_bfloat16", lambda: True)  # read per call
    assert drafting_dtype("auto", target, "s4c") == torch.float32  # torch's kernel, as the target's
    if not pack_linear_layers(target.model):
        pytest.skip("this torch build has no oneDNN")
    assert drafting_dtype("auto", target, "s4c") == torch.bfloat16
    assert drafting_dtype("target", target, "s4c") == torch.float32
    # no bfloat16 products:
    monkeypatch.setattr("specframe.kit.models.native_bfloat16", lambda: False)
    assert drafting_dtype("auto", target, "s4c") == torch.float32
    assert drafting_dtype("bfloat16", target, "s4c") == torch.bfloat16
    with pytest.raises(specframe.ConfigurationError, match="s4c: dtype must be one of"):
        drafting_dtype("float8", target, "s4c")


@pytest.mark.parametrize("dtype", ["bfloat16", "target"])
def test_heads_draft_in_the_chosen_dtype_and_stay_lossless(dtype):
    target = tiny_target(seed=0)
    drafter = S4CDrafter(target, heads=str(tiny_heads_file(0)), topk=3, widths=3, dtype=dtype)
    want = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    assert {p.dtype for p in drafter.heads.parameters()} == {want} and drafter.lm_weight.dtype == want
    assert next(target.model.parameters()).dtype == torch.float32  # the target is untouched
    context = specframe.DraftContext(np.arange(10), 5, 20, torch.randn(target.config.hidden_size))
    probs = drafter.propose(context).draft_probs
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))
    decoder = specframe.SpeculativeDecoder.from_names(
        target, f"s4c(heads='{tiny_heads_file(0)}', widths=3, topk=3, dtype='{dtype}')", "static", budget=10)
    prompt = repetitive_prompt(target.vocab_size, 30, seed=1)
    assert decoder.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target, prompt, 20)


@pytest.mark.parametrize("tree", ["chain", "static", "static(preset=cartesian, widths=(2, 2, 2))",
                                  "static(preset=A)", "beam(config=D)", "dynamic(topk=3)"])
def test_greedy_lossless_with_every_tree_builder(tree):
    target = tiny_target(seed=0)
    decoder = specframe.SpeculativeDecoder.from_names(
        target, f"s4c(heads='{tiny_heads_file(0)}', widths=3, topk=3)", tree, budget=10)
    prompt = repetitive_prompt(target.vocab_size, 30, seed=1)
    assert decoder.generate(prompt, max_new_tokens=20).tokens == reference_greedy(target, prompt, 20)


@pytest.mark.slow
def test_packaged_heads_on_the_real_model_are_lossless_and_accepted(smollm2):
    assert packaged_heads("smollm2-135m").is_file()
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    decoder = specframe.SpeculativeDecoder.from_names(smollm2, "s4c", "static(preset=continuous)", budget=9)
    result = decoder.generate(prompt, max_new_tokens=32)
    ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert result.tokens == reference_greedy(smollm2, ids, 32)
    assert result.metrics.accepted_draft_tokens > 0  # trained heads do get drafts accepted


def test_train_command_is_registered():
    from typer.testing import CliRunner

    from specframe.cli import build_app

    result = CliRunner().invoke(build_app(), ["train", "s4c", "--help"])
    assert result.exit_code == 0 and "--draft-vocab" in result.output and "--max-minutes" in result.output


def test_answers_data_are_the_targets_own_chats(tmp_path, monkeypatch):
    """`--data answers:NAME`: each answered prompt of a `model:self` build, as prompt ids + answer ids."""
    import json

    from specframe_corpus.answers import prompt_key
    from specframe_s4c.data import token_blocks

    class Letters:  # a tokenizer without a chat template: prompts are tokenized as they are
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) - 96 for c in text]}

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    with pytest.raises(specframe.ConfigurationError, match="--source model:self --out chat"):
        token_blocks(Letters(), ["answers:chat"], block=2)
    home = tmp_path / "datastores"
    home.mkdir()
    lines = [{"settings": {}}, {"prompt": "ab", "batch": 0}, {"prompt": "cd", "batch": 0},
             {"prompt": "e", "batch": 0}, {"batch_done": 1}]
    (home / "chat.prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    answers = [{"settings": {}}, {"prompt": prompt_key("ab"), "ids": [30, 31, 32]},
               {"prompt": prompt_key("e"), "ids": [40]}]  # "cd" was never answered: left out
    (home / "chat.answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in answers))
    blocks = token_blocks(Letters(), ["answers:chat"], block=4, eos=0)
    assert blocks.reshape(-1).tolist() == [1, 2, 30, 31, 32, 0, 5, 40]  # one EOS after each chat


def test_answers_data_of_a_raw_build_read_their_prompts_raw(tmp_path, monkeypatch):
    """A `model-continue:` build continued its prompts as raw text: its training ids are that text, not the
    prompt in the chat template."""
    import json

    from specframe_corpus.answers import prompt_key
    from specframe_s4c.data import token_blocks

    class Chat:
        chat_template = "yes"

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) - 96 for c in text]}

        def apply_chat_template(self, messages, **kwargs):
            return {"input_ids": [9] + self(messages[0]["content"])["input_ids"] + [9]}

    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path))
    home = tmp_path / "datastores"
    home.mkdir()
    (home / "code.prompts.jsonl").write_text(json.dumps({"prompt": "ab"}) + "\n")
    for settings, first in (({"template": False}, [1, 2]), ({}, [9, 1, 2, 9])):
        answers = [{"settings": settings}, {"prompt": prompt_key("ab"), "ids": [30]}]
        (home / "code.answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in answers))
        blocks = token_blocks(Chat(), ["answers:code"], block=len(first) + 2, eos=0)
        assert blocks.reshape(-1).tolist() == first + [30, 0]


@pytest.mark.slow
def test_suffix_s4c_preset_is_lossless_and_drafts_with_the_heads_where_nothing_is_copied(smollm2):
    """`suffix-s4c`: the shipped heads join SuffixDecoding's sources; on a chat turn the copy sources find
    little and the heads draft, and the output is still plain greedy decoding's."""
    from specframe_s4c import HEADS_BELOW

    drafter = f"suffix-heads(heads_below={HEADS_BELOW})"
    assert specframe.get_registry().preset("suffix-s4c").spec == f"{drafter}+trie+greedy"
    decoder = specframe.SpeculativeDecoder.from_names(smollm2, drafter, "trie", budget=8)
    prompt = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}],
                                                   add_generation_prompt=True, tokenize=False)
    ids = smollm2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    result = decoder.generate(ids, max_new_tokens=32)
    assert result.tokens == reference_greedy(smollm2, ids, 32)
    assert decoder.pipeline.drafter.head_steps > 0


# --- faults: a full or unwritable disk, damaged heads files and data, through `specframe train s4c` ------


TRAIN = ["train", "s4c", "--model", "tiny", "--steps", "2", "--heads", "1", "--block", "8", "--batch", "2",
         "--draft-vocab", "0"]


def train_here(monkeypatch, capsys, tmp_path: Path, *args: str) -> SimpleNamespace:
    """`specframe train s4c` on `tiny_target(0)` and a small text file, in this process: exit code, stderr."""
    import sys

    from specframe.cli import main

    data = tmp_path / "corpus.txt"
    if not data.exists():
        data.write_text("def add(a, b):\n    return a + b\n" * 8)
    monkeypatch.setattr(specframe, "load_target", lambda *a, **k: tiny_target(seed=0))
    monkeypatch.setattr(sys, "argv", ["specframe", *TRAIN, "--data", str(data), *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return SimpleNamespace(returncode=exit_.value.code, stderr=capsys.readouterr().err)


def error_line(run: SimpleNamespace, *needles: str) -> str:
    """The one `error:` line of a run that exited 2 without a traceback, holding every needle."""
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("full", ["disk_usage", "posix_fallocate"])
def test_a_full_disk_for_the_feature_cache_is_an_error_before_any_block(monkeypatch, capsys, tmp_path, full):
    """The feature cache's space is checked and reserved before the first forward: a full disk is one
    `error:` line (never the SIGBUS of a store through a memory map), and the rerun on a disk with room
    trains."""
    import shutil

    import specframe_s4c.features as features

    out = tmp_path / "run"
    if full == "disk_usage":
        monkeypatch.setattr(features.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 10))
    else:
        monkeypatch.setattr(features.os, "posix_fallocate", no_space)
    line = error_line(train_here(monkeypatch, capsys, tmp_path, "--out", str(out)),
                      "feature cache", "No space left on device", "free some space", "rerun")
    assert str(out / "features") in line and not (out / "features" / "features.f16").exists()
    monkeypatch.undo()
    assert train_here(monkeypatch, capsys, tmp_path, "--out", str(out)).returncode == 0
    assert (out / "heads.safetensors").is_file()


def test_a_disk_that_fills_while_features_are_computed_keeps_the_blocks_done(monkeypatch, tmp_path):
    import specframe_s4c.features as features

    target = tiny_target(seed=0)
    blocks = np.arange(6 * 8).reshape(6, 8) % target.vocab_size  # (6, 8)
    writes = []

    def fills_up(path, data, offset):
        writes.append(offset)
        if len(writes) > 1:
            no_space()
        original(path, data, offset)

    original = features.write_at
    monkeypatch.setattr(features, "write_at", fills_up)
    cache = FeatureCache(tmp_path / "features", blocks, hidden=target.config.hidden_size)
    with pytest.raises(specframe.ConfigurationError, match="No space left on device.*blocks done so far "
                       "are kept"):
        cache.fill(target, batch=2, log=lambda line: None)
    monkeypatch.undo()
    cache = FeatureCache(tmp_path / "features", blocks, hidden=target.config.hidden_size)
    assert cache.done == 2  # the first batch's blocks
    cache.fill(target, batch=2, log=lambda line: None)
    whole = FeatureCache(tmp_path / "whole", blocks, hidden=target.config.hidden_size)
    whole.fill(target, batch=2, log=lambda line: None)
    assert np.array_equal(cache.features, whole.features)


SAFETENSORS_FULL = ('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                    '"No space left on device" })')


def test_a_full_disk_at_a_save_is_an_error_that_keeps_the_last_state(monkeypatch, tmp_path):
    """A save of the training state that fails is an error naming the file, and the state saved before
    it still resumes."""
    from safetensors import SafetensorError

    import specframe_s4c.train as train

    run = tmp_path / "run"
    trainer = s4c_trainer(run, steps=2)
    trainer.train_step()
    trainer.save()

    def full(*args, **kwargs):
        raise SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(train, "save_train_state", full)
    trainer.train_step()
    with pytest.raises(specframe.ConfigurationError, match=f"writing {run / 'state.safetensors'} failed: .*"
                       "free some space on that disk, or the state saved at step 1 .* is kept: rerun"):
        trainer.save()
    monkeypatch.undo()
    again = s4c_trainer(run, steps=2)
    assert again.resume() and again.step == 1


def test_a_full_disk_at_the_heads_export_is_an_error_line_that_keeps_the_state(monkeypatch, capsys, tmp_path):
    """safetensors' own error when the disk fills at the export is one `error:` line naming the heads file;
    the finished state is kept, so a rerun with room only exports."""
    from safetensors import SafetensorError

    import specframe_s4c.heads as heads

    out = tmp_path / "run"
    assert train_here(monkeypatch, capsys, tmp_path, "--out", str(out)).returncode == 0
    (out / "heads.safetensors").unlink()

    def full(*args, **kwargs):
        raise SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(heads, "write_atomically", full)
    error_line(train_here(monkeypatch, capsys, tmp_path, "--out", str(out)),
               str(out / "heads.safetensors"), "No space left on device", "free some space",
               "the state saved at step 2", "rerun with the same --out to resume")
    assert not (out / "heads.safetensors").exists()
    monkeypatch.undo()
    assert train_here(monkeypatch, capsys, tmp_path, "--out", str(out)).returncode == 0
    assert (out / "heads.safetensors").is_file()


def test_an_out_that_is_a_file_is_refused_before_the_model_loads(monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "run"):
        error_line(train_here(monkeypatch, capsys, tmp_path, "--out", str(out)), "--out", "a-file")


def test_a_read_only_out_is_refused(monkeypatch, capsys, tmp_path):
    import tempfile as tempfile_module

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile_module, "TemporaryFile", read_only)
    error_line(train_here(monkeypatch, capsys, tmp_path, "--out", str(tmp_path / "run")),
               "s4c training: --out", "not writable", "Read-only file system")


def damaged_heads(path: Path, damage: str) -> Path:
    """A copy of `tiny_heads_file(0)` with one thing wrong."""
    source = tiny_heads_file(0)
    meta, tensors = read_heads_file(source)
    if damage == "pickle":
        torch.save(tensors, path)
        return path
    if damage == "truncated":
        path.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
        return path
    if damage == "num_heads":
        meta["num_heads"] = "7"
    elif damage == "num_heads text":
        meta["num_heads"] = "three"
    elif damage == "no vocab_ids":
        del tensors["vocab_ids"]
    elif damage == "vocab_ids out of range":
        tensors["vocab_ids"] = torch.tensor([0, 1, 10**6])
    elif damage == "vocab_ids float":
        tensors["vocab_ids"] = tensors["vocab_ids"].float()
    elif damage == "vocab_ids 2-D":
        tensors["vocab_ids"] = tensors["vocab_ids"][None]
    save_file(tensors, str(path), metadata=meta)
    return path


HEADS_DAMAGE = ["pickle", "truncated", "num_heads", "num_heads text", "no vocab_ids",
                "vocab_ids out of range", "vocab_ids float", "vocab_ids 2-D"]


@pytest.mark.parametrize("damage", HEADS_DAMAGE)
def test_a_damaged_heads_file_is_refused_naming_it(tmp_path, damage):
    path = damaged_heads(tmp_path / "heads.safetensors", damage)
    with pytest.raises(specframe.ModelLoadError, match=f"the heads file {path} .*specframe train s4c"):
        specframe.assemble(tiny_target(seed=0), f"s4c(heads='{path}')", "static")


@pytest.mark.parametrize("damage", ["pickle", "truncated", "num_heads", "no vocab_ids"])
def test_a_damaged_init_heads_file_is_an_error_line(monkeypatch, capsys, tmp_path, damage):
    path = damaged_heads(tmp_path / "init.safetensors", damage)
    error_line(train_here(monkeypatch, capsys, tmp_path, "--init", str(path), "--out", str(tmp_path / "run")),
               f"the heads file {path}")


@pytest.mark.parametrize("line,problem", [("{bad", "not valid JSON"), ("[" * 100000, "nested more than"),
                                          ('{"text": ' + "1" * 5000 + "}", "more than 4300 digits")])
def test_an_invalid_jsonl_line_of_the_data_is_an_error_line_with_its_number(monkeypatch, capsys, tmp_path,
                                                                           line, problem):
    data = tmp_path / "corpus.jsonl"
    data.write_text(json.dumps({"text": "x = 1\n" * 40}) + "\n\n" + line + "\n")
    error_line(train_here(monkeypatch, capsys, tmp_path, "--data", str(data), "--out", str(tmp_path / "run")),
               f"line 3 of the --data file {data}: not valid JSON", problem, "fix or remove that line")


def test_written_heads_and_state_follow_the_umask(tmp_path):
    """Heads and training state are written through a temporary file, then given the mode a plain `open`
    gives under the user's umask (not the temporary file's 0600)."""
    mask = os.umask(0o022)
    try:
        trainer = s4c_trainer(tmp_path / "run")
        trainer.save()
        trainer.export(tmp_path / "run" / "heads.safetensors", "specframe train s4c ...", ["test"])
    finally:
        os.umask(mask)
    for name in ("state.safetensors", "heads.safetensors", "heads.json", "features/progress.json",
                 "features/ids.npy"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o644, name


def s4c_trainer(run: Path, steps: int = 1) -> Trainer:
    target = tiny_target(seed=0)
    blocks = np.arange(4 * 8).reshape(4, 8) % target.vocab_size  # (4, 8)
    cache = FeatureCache(run / "features", blocks, hidden=target.config.hidden_size)
    cache.fill(target, batch=2, log=lambda line: None)
    config = TrainConfig(num_heads=1, block=8, batch=2, steps=steps, warmup=1, draft_vocab=0)
    return Trainer(target, cache, run, config, log=lambda line: None)
