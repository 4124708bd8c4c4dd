"""`specframe generate --stream`: the text printed step by step is the text `generate` prints whole, with
`--json` one object per step then the report; `--stream --compare` exits 2 before the model loads."""

from __future__ import annotations

import json

from generate_cli import run_generate


run = run_generate


ARGS = ("abcabcab abcabcab abc", "--drafter", "pld", "--budget", "4", "--max-new-tokens", "30")


def test_streamed_json_lines_add_up_to_the_whole_text(monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, *ARGS, "--json")
    assert code == 0, err
    whole = json.loads(out)
    code, out, err = run(monkeypatch, capsys, *ARGS, "--json", "--stream")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    steps, report = lines[:-1], lines[-1]
    assert "".join(s["text"] for s in steps) == whole["text"]
    assert sum(len(s["token_ids"]) for s in steps) == report["new_tokens"] == whole["new_tokens"] == 30
    assert len(steps) == report["steps"] < 30  # one line a step (each adds characters), several tokens each
    assert "text" not in report and report["tau"] == whole["tau"]


def test_streamed_text_is_the_whole_text(monkeypatch, capsys):
    code, whole, err = run(monkeypatch, capsys, *ARGS, "--json")
    code, out, err = run(monkeypatch, capsys, *ARGS, "--stream")
    assert code == 0, err
    assert out.startswith(json.loads(whole)["text"] + "\n") and "tau" in out


def test_stream_and_compare_exit_2_before_the_model_loads(monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, *ARGS, "--stream", "--compare")
    assert code == 2 and "pick one" in err and err.endswith("[model not loaded]")
