"""Bad input and damaged state get an `error: ...` line and exit code 2, never a traceback.

Bench resume state (records, settings, suite files, --out), model directories (damaged weights, bad
config, empty, masked LMs, an unusable SPECFRAME_HOME) and `generate` options (non-UTF-8 text, seeds
beyond 64 bits, empty stop strings). Exit codes are checked through the real CLI in a subprocess, the
rest in-process. Models are tiny random Llamas saved with SmolLM2's tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import specframe
from specframe.bench import BenchPrompt, run_benchmark
from specframe.bench.runner import RecordStore, check_settings
from specframe.support.prompt_suites import load_suite
from specframe.terms.errors import ConfigurationError, ModelLoadError, PromptError
from specframe.runtime.load import load_target
from specframe.support.paths import check_writable_dir
from specframe.terms.sampling import SamplingParams
from specframe.testing import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

QUESTION = {"question_id": 1, "category": "qa", "turns": ["Name three colors."]}
PROMPTS = [BenchPrompt("1", "qa", ("Name three colors.",))]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))


@pytest.fixture(scope="module")
def target(tokenizer):
    """A random 2-layer Llama over SmolLM2's vocabulary, with SmolLM2's tokenizer."""
    tiny = tiny_target(seed=3, vocab_size=49152, hidden_size=32)
    return specframe.Target(model=tiny.model, tokenizer=tokenizer, name="tiny-smollm2-vocab")


@pytest.fixture(scope="module")
def model_dir(target, tmp_path_factory) -> Path:
    """The tiny target saved as a Hugging Face model directory (config, weights, tokenizer)."""
    directory = tmp_path_factory.mktemp("model")
    target.model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def suite(tmp_path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps(QUESTION) + "\n")
    return path


def cli(*args: str | bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `specframe` CLI; arguments may be bytes (non-UTF-8 argv)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "specframe.cli", *args], capture_output=True, check=False,
                          timeout=300, env=env)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, one `error:` line naming every needle, no traceback; returns stderr."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    line = next((x for x in err.splitlines() if x.startswith("error: ")), None)
    assert line is not None, err
    for needle in needles:
        assert needle in line, line
    return line


def bench_args(model_dir: Path, suite: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "--model", str(model_dir), "--suite", str(suite), "--methods", "pld", "--peers", "none",
            "--repeats", "1", "--max-new-tokens", "3", "--no-plots", "--out", str(out), *extra]


def bench(target, out: Path, **options):
    kwargs = {"peers": "none", "repeats": 1, "max_new_tokens": 3, "plots": False, "progress": False,
              "warmup": False, **options}
    return run_benchmark(target, PROMPTS, ["pld"], out, **kwargs)


# --- A. bench resume state -------------------------------------------------------------------------------


def test_a_record_line_without_fields_is_an_error_and_fresh_starts_over(model_dir, suite, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("{}\n")
    proc = cli(*bench_args(model_dir, suite, out))
    assert_clean_error(proc, "records.jsonl, line 1", "'method' is missing", "--fresh")
    from typer.testing import CliRunner

    from specframe.cli import app

    result = CliRunner().invoke(app, bench_args(model_dir, suite, out, "--fresh"))
    assert result.exit_code == 0, result.output
    assert "{}" not in (out / "records.jsonl").read_text().splitlines()


@pytest.mark.parametrize("line, problem", [
    ("null", "expected a JSON object, got null"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"method": "pld", "qid": "1", "category": "qa", "turn": 0, "repeat": 0, "tokens": [1]}),
     "'metrics' is missing"),
    (json.dumps({"method": "pld", "qid": "1", "category": "qa", "turn": "0", "repeat": 0, "tokens": [1],
                 "metrics": {}}), "'turn' should be a JSON integer"),
    (json.dumps({"method": "pld", "qid": "1", "category": "qa", "turn": 0, "repeat": 0, "tokens": [1],
                 "metrics": {"steps": 1}}), "metrics lack new_tokens"),
])
def test_records_that_are_not_runs_are_refused_with_their_line(tmp_path, line, problem):
    path = tmp_path / "records.jsonl"
    path.write_text('{"cut short\n' + line + "\n")
    with pytest.raises(ConfigurationError, match="line 2 is not a benchmark record") as info:
        RecordStore(path)
    assert problem in str(info.value)


def test_a_damaged_settings_file_is_refused_when_records_depend_on_it(target, tmp_path):
    bench(target, tmp_path)
    for damage in ("{bad", "[1]", "\xff"):
        (tmp_path / "settings.json").write_text(damage, encoding="latin-1")
        with pytest.raises(ConfigurationError, match="settings.json is damaged.*--fresh"):
            check_settings(tmp_path, {"max_new_tokens": 3})


def test_settings_without_records_bind_nothing(tmp_path):
    (tmp_path / "settings.json").write_text("{bad")
    check_settings(tmp_path, {"max_new_tokens": 3})
    assert json.loads((tmp_path / "settings.json").read_text()) == {"max_new_tokens": 3}
    check_settings(tmp_path, {"max_new_tokens": 4})  # what a run that failed before its first record left
    assert json.loads((tmp_path / "settings.json").read_text()) == {"max_new_tokens": 4}


def test_a_failed_run_does_not_block_the_corrected_rerun(target, tmp_path):
    for bad in ({"max_new_tokens": 0}, {"repeats": 0}):
        with pytest.raises(ConfigurationError, match="must be >= 1"):
            bench(target, tmp_path, **bad)
        assert not (tmp_path / "settings.json").exists()
    run, _ = bench(target, tmp_path)
    assert len(run.records) == 2  # the baseline and pld
    assert json.loads((tmp_path / "settings.json").read_text())["max_new_tokens"] == 3


def test_an_empty_suite_file_is_refused(tmp_path):
    for text in ("", "\n  \n"):
        (tmp_path / "empty.jsonl").write_text(text)
        with pytest.raises(PromptError, match="holds no questions"):
            load_suite(str(tmp_path / "empty.jsonl"))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question_id": 1, "turns": ["caf\xe9"]}\n')
    with pytest.raises(PromptError, match="not UTF-8"):
        load_suite(str(tmp_path / "latin1.jsonl"))


def test_an_unwritable_out_is_refused_before_loading_the_model(suite, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    missing_model = tmp_path / "no-such-model"  # loading it would fail: the --out check must come first
    for out in (blocker, blocker / "out"):
        assert_clean_error(cli(*bench_args(missing_model, suite, out)), "--out", "a-file")


def test_a_read_only_directory_is_refused(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(ConfigurationError, match="not writable \\(Permission denied\\): use another"):
        check_writable_dir(tmp_path, "--out", "use another")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_chmod_read_only_directory_is_refused(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(ConfigurationError, match="not writable"):
            check_writable_dir(tmp_path / "out", "--out", "use another")
    finally:
        tmp_path.chmod(0o755)


# --- B. model loading -----------------------------------------------------------------------------------


def copy_model(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def test_a_truncated_weights_file_is_named(model_dir, tmp_path):
    directory = copy_model(model_dir, tmp_path)
    weights = directory / "model.safetensors"
    for size in (weights.stat().st_size // 2, 100, 3):
        with weights.open("r+b") as f:
            f.truncate(size)
        with pytest.raises(ModelLoadError, match="model.safetensors is damaged.*save the model again"):
            load_target(str(directory))


def test_a_truncated_weights_file_exits_2(model_dir, tmp_path):
    directory = copy_model(model_dir, tmp_path)
    with (directory / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    assert_clean_error(cli("generate", "hi", "--model", str(directory), "--max-new-tokens", "2"),
                       "model.safetensors is damaged")


def test_a_config_field_of_the_wrong_type_is_named(model_dir, tmp_path):
    directory = copy_model(model_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "hidden_size": "abc"}))
    with pytest.raises(ModelLoadError, match="config.json is not a valid model config.*hidden_size"):
        load_target(str(directory))
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json is not a valid model config"):
        load_target(str(directory))


def test_an_empty_or_partial_model_directory_says_what_is_missing(model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="has no config.json") as info:
        load_target(str(empty))
    assert "sentencepiece" not in str(info.value)
    directory = copy_model(model_dir, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        load_target(str(directory))
    (directory / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="has no model weights"):
        load_target(str(directory))


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", None])
def test_a_masked_lm_is_refused(model_dir, tmp_path, architecture):
    from transformers import BertConfig, BertForMaskedLM

    directory = tmp_path / "bert"
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    BertForMaskedLM(config).save_pretrained(directory)
    if architecture is None:  # no architectures recorded: judged by model type and is_decoder
        saved = json.loads((directory / "config.json").read_text())
        saved.pop("architectures")
        (directory / "config.json").write_text(json.dumps(saved))
    shutil.copy(model_dir / "tokenizer.json", directory)
    with pytest.raises(ModelLoadError, match="not a causal .* language model"):
        load_target(str(directory))


def test_causal_models_are_still_accepted(model_dir):
    assert load_target(str(model_dir)).vocab_size == 49152


def test_an_unusable_specframe_home_is_refused_before_converting(tmp_path, monkeypatch):
    from specframe.runtime import load

    monkeypatch.setattr(load, "convert_gguf", lambda *a: pytest.fail("converted into an unusable home"))
    home = tmp_path / "home-file"
    home.write_text("")
    monkeypatch.setenv("SPECFRAME_HOME", str(home))
    with pytest.raises(ConfigurationError, match="home-file is a file.*SPECFRAME_HOME"):
        load.resolve_model_dir("smollm2-135m")
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda *a, **k: (_ for _ in ()).throw(PermissionError(
        13, "Permission denied")))
    with pytest.raises(ConfigurationError, match="not writable.*SPECFRAME_HOME"):
        load.resolve_model_dir("smollm2-135m")


def test_a_file_as_specframe_home_exits_2(tmp_path):
    home = tmp_path / "home-file"
    home.write_text("")
    proc = cli("generate", "hi", "--max-new-tokens", "2", env={"SPECFRAME_HOME": str(home)})
    assert_clean_error(proc, "SPECFRAME_HOME", "home-file is a file")


# --- C. generate options --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    ([b"x\xff\xfe"], "the prompt is not valid UTF-8 text"),
    (["hi", "--stop", b"\xff"], "a --stop string is not valid UTF-8"),
    (["hi", "--seed", "99999999999999999999999"], "seed must fit in 64 bits"),
    (["hi", "--stop", ""], '--stop ""'),
    (["hi", "--drafter", "pld(depth=2)"], "drafter 'pld' has no option 'depth'"),
])
def test_bad_generate_options_exit_2_before_loading_the_model(tmp_path, args, needle):
    # The model directory does not exist: these options must be refused before it is looked at.
    proc = cli("generate", *args, "--model", str(tmp_path / "no-such-model"), "--max-new-tokens", "2")
    assert_clean_error(proc, needle)


def test_seed_range_is_what_torch_accepts():
    for seed in (-(2**63), -3, 0, 2**63, 2**64 - 1):
        SamplingParams(temperature=0.5, seed=seed)
    for seed in (-(2**63) - 1, 2**64, 99999999999999999999999):
        with pytest.raises(ConfigurationError, match="seed must fit in 64 bits"):
            SamplingParams(seed=seed)


@pytest.mark.parametrize("template, error", [
    ("{{ messages[0]['content'] ", "TemplateSyntaxError"),
    ("{{ raise_exception('this template takes no user turns') }}", "TemplateError"),
    ("{% set seen = [] %}{{ seen.append(1) }}", "SecurityError"),  # the sandbox blocks a change
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),  # and attribute escapes
])
def test_a_chat_template_that_fails_is_a_prompt_error_naming_it(template, error):
    """`--chat` (and a bench chat suite) with a tokenizer whose chat template fails: a `PromptError`
    naming the template's source and what to do, not a Jinja traceback."""
    from specframe.cli import encode_prompt
    from specframe.support.prompt_suites import encode_turn

    target = tiny_target(seed=0)
    target.tokenizer.chat_template = template
    target.tokenizer.name_or_path = "models/broken-chat"
    with pytest.raises(PromptError, match=f"the chat template of models/broken-chat failed \\({error}.*fix "
                       "the tokenizer's chat_template .* or pass a plain prompt without --chat"):
        encode_prompt(target, "Name three colors.", chat=True)
    with pytest.raises(PromptError, match="chat template of models/broken-chat failed.*'humaneval' suite"):
        encode_turn(target.tokenizer, PROMPTS[0], 0, [])
    target.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert encode_prompt(target, "hi", chat=True) == encode_prompt(target, "hi", chat=False)


def test_text_checks():
    from specframe.terms.request import check_request_input, check_text

    check_text("héllo ✓", "the prompt")
    assert check_request_input("hi", 1, ["\n\n", "END"]) == ("\n\n", "END")
    with pytest.raises(PromptError, match="0xff 0xfe"):
        check_text("x\udcff\udcfe", "the prompt")
    with pytest.raises(ConfigurationError, match="non-empty stop string"):
        check_request_input("hi", 1, ["END", ""])


@pytest.mark.parametrize("kind, spec, needle", [
    ("drafter", "no-such-drafter", "unknown drafter 'no-such-drafter'"),
    ("tree", "trie(width=2)", "tree builder 'trie' has no option 'width'"),
    ("verifier", "no-such-verifier", "unknown verifier"),
    ("backend", "kv(window='x')", "backend 'kv' has no option 'window'"),
    ("drafter", "pld(max_ngram='four')", "option max_ngram='four' must be int"),
])
def test_component_specs_are_checked_without_a_model(kind, spec, needle):
    from specframe.terms.errors import SpecframeError
    from specframe.plugging.pipeline import check_specs

    check_specs("pld(max_ngram=4)", "trie", "greedy", "kv")
    with pytest.raises(SpecframeError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_specs(**{kind: spec})


def test_calibrate_refuses_an_unknown_backend_before_loading_the_model(monkeypatch):
    from typer.testing import CliRunner

    import specframe.runtime.load
    from specframe.cli import app
    from specframe.terms.errors import UnknownComponentError

    monkeypatch.setattr(specframe.runtime.load, "load_target",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    result = CliRunner().invoke(app, ["calibrate", "--backend", "no-such-backend"])
    assert isinstance(result.exception, UnknownComponentError)
    usage = CliRunner().invoke(app, ["calibrate", "--threads", "0"])
    assert usage.exit_code == 2 and "--threads" in usage.output  # a usage error, not torch's RuntimeError


def test_training_settings_out_of_range_are_refused():
    from specframe_hybrid.distill import LayerTraining
    from specframe_hybrid.end_to_end import EndToEndTraining
    from specframe_hybrid.recipe import Recipe
    from specframe_s4c.train import TrainConfig

    TrainConfig(), LayerTraining(), EndToEndTraining(steps=0), Recipe(chat_prompts=0)  # edges that are fine
    for make, needle in [(lambda: TrainConfig(steps=0), "s4c training: steps must be >= 1, got 0"),
                         (lambda: TrainConfig(lr=0.0), "s4c training: lr must be > 0"),
                         (lambda: TrainConfig(lr=float("nan")), "lr must be > 0"),
                         (lambda: TrainConfig(num_heads=0), "num_heads must be >= 1"),
                         (lambda: LayerTraining(batch=0), "hybrid layer training: batch must be >= 1"),
                         (lambda: EndToEndTraining(steps=-1), "steps must be >= 0"),
                         (lambda: Recipe(code_tokens=0, chat_prompts=0), "no training data")]:
        with pytest.raises(ConfigurationError, match=needle):
            make()


# --- D. the Python API's request checks ----------------------------------------------------------------


@pytest.mark.parametrize("ids, needle", [
    ([1, "a"], "must be integers, got 'a'"),
    ([1, 2.7], "must be integers, got 2.7"),  # never truncated to 2
    ([1, True], "must be integers, got True"),
    (np.array([[1, 2]]), r"one flat sequence, got shape \(1, 2\)"),
    (torch.tensor([[1, 2]]), r"one flat sequence, got shape \(1, 2\)"),
])
def test_prompt_ids_that_are_not_flat_integers_are_refused(target, ids, needle):
    decoder = specframe.SpeculativeDecoder.from_names(target, "pld", budget=4)
    with pytest.raises(PromptError, match=needle):
        decoder.generate(ids, max_new_tokens=2)


def test_prompt_ids_as_arrays_and_a_single_stop_string(target):
    """1-D arrays and tensors are prompts as lists are; `stop="abc"` is one stop string, not three."""
    decoder = specframe.SpeculativeDecoder.from_names(target, "pld", budget=4)
    plain = decoder.generate([5, 6, 7], max_new_tokens=12)
    assert decoder.generate(np.array([5, 6, 7]), max_new_tokens=12).tokens == plain.tokens
    assert decoder.generate(torch.tensor([5, 6, 7]), max_new_tokens=12).tokens == plain.tokens
    text = target.tokenizer.decode(plain.tokens[:8])
    stop = text[-4:]  # ends inside the 8th token at the latest; its characters may occur earlier alone
    one = decoder.generate([5, 6, 7], max_new_tokens=12, stop=stop)
    assert one.finish_reason == "stop" and stop in target.tokenizer.decode(one.tokens)
    assert one.tokens == decoder.generate([5, 6, 7], max_new_tokens=12, stop=[stop]).tokens
    with pytest.raises(ConfigurationError, match="stop strings must be non-empty"):
        decoder.generate([5, 6, 7], max_new_tokens=2, stop=["END", ""])
