"""The shipped structured-output suite: 30+ prompts whose schemas compile, in three categories, and a run
of it on a tiny model where every method's output is valid and identical to constrained plain decoding;
`specframe bench` running it (`--suite structured`, a suite whose rows carry schemas, `--json-schema`),
and refusing bad input before the model loads."""

from __future__ import annotations

import json

import pytest
from bench_runs import bench_before_loading

import specframe
from specframe.bench.methods import parse_method
from specframe.bench.structured import GuidanceProcessor, run_structured
from specframe.contract.peers import PeerSpec
from specframe.plugging.registry import get_registry
from specframe.bench.structured_suite import is_valid, load_structured_suite
from specframe.testing.targets import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=0)


def test_the_suite_holds_30_prompts_in_three_categories_whose_schemas_compile(tiny):
    prompts = load_structured_suite()
    assert len(prompts) >= 30 and len({p.qid for p in prompts}) == len(prompts)
    assert {p.category for p in prompts} == {"extraction", "function-call", "schema-answer"}
    for prompt in prompts:
        specframe.constraint_for(tiny, json_schema=prompt.schema)  # raises on a bad schema
    assert len(load_structured_suite(limit=2)) == 6


def test_validity_is_json_that_the_schema_accepts():
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    assert is_valid('{"a": 3}', schema)
    assert not is_valid('{"a": "3"}', schema) and not is_valid('{"a": 3', schema)


def test_every_method_matches_constrained_plain_decoding_on_a_tiny_model(tiny):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
              "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}}}
    prompts = [p for p in load_structured_suite(limit=1)]
    prompts = [type(p)(p.qid, p.category, "ok n ok n {", schema) for p in prompts]
    forced = parse_method("forced(then=pld)+chain@4", get_registry(), 8)
    runs = run_structured(tiny, prompts, [forced], [PeerSpec("hf-generate", "hf-generate")],
                          max_new_tokens=24, progress=False)
    assert [run.name for run in runs] == ["plain", "forced(then=pld)+chain@4", "hf-generate"]
    for run in runs:
        row = run.row(runs[0])
        assert row["valid"] == 1.0 and row["identical"] == 1.0, row
    assert all(json.loads(tiny.tokenizer.decode(t)) for t in runs[1].tokens.values())


def test_the_transformers_processor_masks_what_the_constraint_forbids(tiny):
    import torch

    processor = GuidanceProcessor(specframe.constraint_for(tiny, regex="ab"), prompt_length=1)
    scores = processor(torch.tensor([[5]]), torch.zeros(1, tiny.vocab_size))  # (1, V)
    assert torch.isfinite(scores).sum() == 1


def test_a_peer_that_cannot_start_is_skipped_with_why_under_all(tiny, monkeypatch):
    """Where llama-cpp-python is missing, `all` runs the structured suite without llama.cpp's grammar peer
    and says why (installed here: its import is made to fail)."""
    import sys

    from specframe import SpecframeWarning
    from specframe.bench.structured import decoders, structured_peers
    from specframe.plugging.registry import get_registry

    peers = structured_peers("all")
    if "llamacpp-grammar" not in [p.name for p in peers]:
        pytest.skip("the llamacpp plugin is not installed")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    with pytest.warns(SpecframeWarning, match="skipping peer 'llamacpp-grammar'.*needs llama-cpp-python"):
        built = decoders(tiny, [], peers, get_registry())
    assert [label for label, _, _ in built] == ["plain", "hf-generate"]


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}}


def suite_file(path, schemas):
    """A JSONL suite of one question per schema (a row without one where the schema is None)."""
    rows = [{"question_id": i, "category": "qa", "turns": [f"Answer {i} as JSON."]}
            | ({} if schema is None else {"schema": schema}) for i, schema in enumerate(schemas)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture(scope="module")
def chat_target():
    """A random 2-layer Llama over SmolLM2's vocabulary, with SmolLM2's tokenizer and chat template (a
    JSONL suite's turns are chat prompts)."""
    from transformers import AutoTokenizer

    from specframe.runtime.load import resolve_model_dir

    tiny = tiny_target(seed=3, vocab_size=49152, hidden_size=32)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2-135m"))
    return specframe.Target(model=tiny.model, tokenizer=tokenizer, name="tiny-smollm2-vocab")


@pytest.mark.parametrize("schemas", [[SCHEMA, SCHEMA], [None, None]])
def test_the_bench_command_runs_a_suite_under_schemas(chat_target, tmp_path, monkeypatch, schemas):
    """Rows with their own schemas, or plain rows under --json-schema: one structured run, its page
    printed and written."""
    from typer.testing import CliRunner

    import specframe.runtime.load
    from specframe.cli import app

    monkeypatch.setattr(specframe.runtime.load, "load_target", lambda *_, **__: chat_target)
    args = ["bench", "--suite", suite_file(tmp_path / "suite.jsonl", schemas), "--methods",
            "forced(then=pld)+chain@4", "--peers", "hf-generate", "--repeats", "1", "--max-new-tokens", "32",
            "--out", str(tmp_path / "out")]
    if schemas[0] is None:
        (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
        args += ["--json-schema", str(tmp_path / "schema.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| `forced(then=pld)+chain@4` | 100% | 100% |" in result.output
    assert "| `hf-generate` | 100% | 100% |" in result.output
    written = json.loads((tmp_path / "out" / "structured_results.json").read_text())
    assert [row["method"] for row in written["rows"]] == ["plain", "forced(then=pld)+chain@4", "hf-generate"]


@pytest.mark.parametrize("case, message", [
    ("not json", "not valid JSON"),
    ("bad schema", "invalid JSON schema"),
    ("schema and suite", "gives each prompt its own schema: leave --json-schema out"),
    ("mixed suite", "carry no \"schema\""),
    ("bad row", "question 1: invalid JSON schema"),
    ("batch", "--batch is not available in a structured run"),
    ("sampling", "decodes greedily"),
    ("peer", "cannot decode under a schema"),
])
def test_bad_structured_input_is_refused_before_the_model_loads(monkeypatch, tmp_path, case, message):
    schema = tmp_path / "schema.json"
    schema.write_text({"not json": "{", "bad schema": '{"type": "nonsense"}'}.get(case, json.dumps(SCHEMA)))
    args = {
        "not json": ["--json-schema", str(schema)],
        "bad schema": ["--json-schema", str(schema)],
        "schema and suite": ["--suite", "structured", "--json-schema", str(schema)],
        "mixed suite": ["--suite", suite_file(tmp_path / "mixed.jsonl", [SCHEMA, None])],
        "bad row": ["--suite", suite_file(tmp_path / "bad.jsonl", [SCHEMA, {"type": "nonsense"}])],
        "batch": ["--suite", "structured", "--batch", "4"],
        "sampling": ["--suite", "structured", "--temperature", "0.7"],
        "peer": ["--suite", "structured", "--peers", "hf-pld"],
    }[case]
    result = bench_before_loading(monkeypatch, tmp_path / "out", *args)
    assert isinstance(result.exception, specframe.ConfigurationError), result.output  # exit status 2
    assert message in str(result.exception)
