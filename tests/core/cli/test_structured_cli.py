"""`specframe generate --json-schema FILE | --regex R | --grammar FILE`: bad input exits 2 with one error
line before the model loads; a good constraint shapes the output."""

from __future__ import annotations

import json
import pytest

from generate_cli import run_generate


run = run_generate


@pytest.mark.parametrize("args,needle", [
    (["--regex", "(a"], "invalid regular expression '(a'"),
    (["--json-schema", "{missing}"], "cannot read it"),
    (["--json-schema", "{bad}"], "not valid JSON"),
    (["--json-schema", "{unsatisfiable}"], "Unsatisfiable schema"),
    (["--grammar", "{undefined}"], "unknown name"),
    (["--grammar", "{prose}"], "neither llguidance's Lark dialect"),
    (["--regex", "a", "--grammar", "{undefined}"], "give one of --json-schema, --regex and --grammar"),
    (["--regex", "a", "--compare"], "--compare times transformers' unconstrained generate"),
])
def test_bad_constraints_exit_2_before_the_model_loads(monkeypatch, capsys, tmp_path, args, needle):
    names = {"missing": "nope.json", "bad": "bad.json", "unsatisfiable": "u.json", "undefined": "g.lark",
             "prose": "p.txt"}
    files = {key: tmp_path / name for key, name in names.items()}
    files["bad"].write_text('{"type": ')
    files["unsatisfiable"].write_text(json.dumps({"type": "string", "minLength": 5, "maxLength": 2}))
    files["undefined"].write_text("start: foo\n")
    files["prose"].write_text("hello world\n")
    args = [a.format(**files) for a in args]
    code, _, err = run(monkeypatch, capsys, "hi", *args, "--max-new-tokens", "4")
    assert code == 2 and err.startswith("error: ") and needle in err, err
    assert err.endswith("[model not loaded]")


@pytest.mark.parametrize("option,text", [
    ("--regex", "(yes|no)-[0-9]"),
    ("--grammar", 'root ::= ("yes" | "no") "-" [0-9]\n'),  # GBNF
    ("--grammar", 'start: ("yes" | "no") "-" /[0-9]/\n'),  # Lark
])
def test_a_constraint_shapes_the_output(monkeypatch, capsys, tmp_path, option, text):
    if option == "--grammar":
        (tmp_path / "g").write_text(text)
        text = str(tmp_path / "g")
    code, out, err = run(monkeypatch, capsys, "hi", option, text, "--drafter", "forced(then=pld)",
                         "--max-new-tokens", "10", "--json")
    report = json.loads(out)
    assert code == 0, err
    assert report["finish_reason"] == "constraint" and report["text"][:-1] in ("yes-", "no-")


def test_a_json_schema_gives_json(monkeypatch, capsys, tmp_path):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    code, out, err = run(monkeypatch, capsys, "hi", "--json-schema", str(tmp_path / "s.json"), "--json")
    assert code == 0, err
    assert json.loads(json.loads(out)["text"]) in ({"ok": True}, {"ok": False})
