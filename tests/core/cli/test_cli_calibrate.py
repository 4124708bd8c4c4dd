"""`specframe calibrate` says whether it stored what it measured: "stored in PATH" only once stored; a
calibration that cannot be stored after measuring is still printed, then named in an `error:` line, exit 2.
Run through the real `specframe.cli.main` on a tiny saved model, with the measurement itself faked."""

from __future__ import annotations

import errno
import json
import sys

import pytest

from specframe import cli
from specframe.plugging import calibration
from specframe.terms.cost import MeasuredCost
from specframe.testing import tiny_target

SLOPE = (0.0, 1e-4, 2e-4)
COST = MeasuredCost((0, 4, 8), (1e-3, 1.2e-3, 1.5e-3), (1e-3, 1.1e-3, 1.4e-3), 257, SLOPE, SLOPE)


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A tiny saved model, SPECFRAME_HOME in `tmp_path`, and a calibration that measures nothing."""
    tiny = tiny_target(seed=4)
    tiny.model.save_pretrained(tmp_path / "model")
    tiny.tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(calibration, "calibrate", lambda backend, *args, padding_s=(): COST)
    monkeypatch.setattr(calibration, "probe_padding", lambda alone, padded, **kwargs: (1e-3, 2e-3))
    return str(tmp_path / "model")


def calibrate(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `specframe calibrate ARGS`."""
    monkeypatch.setattr(sys, "argv", ["specframe", "calibrate", "--device", "cpu", *args])
    with pytest.raises(SystemExit) as exit:
        cli.main()
    out, err = capsys.readouterr()
    return exit.value.code, out, err


def test_a_stored_calibration_says_where(model, tmp_path, monkeypatch, capsys):
    code, out, err = calibrate(monkeypatch, capsys, "--model", model)
    [stored] = (tmp_path / "home" / "costs").glob("*.json")
    assert code == 0 and "flat tree ms" in out and f"stored in {stored}" in out
    code, out, _ = calibrate(monkeypatch, capsys, "--model", model, "--json")
    assert code == 0 and json.loads(out)["stored"] is True


def test_a_calibration_that_cannot_be_stored_is_printed_then_refused(model, tmp_path, monkeypatch, capsys):
    def full_disk(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(calibration, "write_atomically", full_disk)
    code, out, err = calibrate(monkeypatch, capsys, "--model", model)
    assert code == 2 and "flat tree ms" in out and "stored in" not in out  # the measurement, then the error
    error = err.splitlines()[-1]
    assert error.startswith("error: the calibration above was measured but could not be stored in ")
    assert "No space left on device" in error and "free some space" in error and "Traceback" not in err
    assert not list((tmp_path / "home" / "costs").glob("*.json"))
    code, out, err = calibrate(monkeypatch, capsys, "--model", model, "--json")
    assert code == 2 and json.loads(out)["stored"] is False and "\nerror: " in err


def test_out_writes_the_curve_with_its_settings_and_command(model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECFRAME_CPU_LINEAR", "onednn")
    code, _, _ = calibrate(monkeypatch, capsys, "--model", model, "--out", str(tmp_path / "run"))
    written = json.loads((tmp_path / "run" / "step_costs.json").read_text())
    assert code == 0 and [c["nodes"] for c in written["costs"]] == [0, 4, 8]
    assert written["settings"]["linear"] == "onednn" and written["settings"]["context"] == 257
    assert written["command"].startswith("SPECFRAME_CPU_LINEAR=onednn specframe calibrate --device cpu")
