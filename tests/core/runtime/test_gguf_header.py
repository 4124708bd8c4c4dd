"""A GGUF's header is read within the file's bounds and checked before transformers or llama.cpp read it
(`specframe.runtime.gguf_header`, `specframe.runtime.gguf_checks`). The malformed files that made the
conversion fail with `struct.error` (a huge array count, a huge dimension count, a file holding only
`GGUF`) or `ZeroDivisionError` (a head count of 0), and the edited block count that made llama.cpp
abort, are each a `ModelLoadError` naming the key and its value, and one `error:` line of `specframe
generate`; every small edit of a tiny GGUF's header (`gguf_edits`) ends in that error or in a file that
converts. (`tests/plugins/llamacpp/test_llamacpp_gguf_headers.py` hands the edits to llama.cpp.)
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_edits import header_edits, put
from tiny_gguf import write_gguf

from specframe.runtime import load
from specframe.runtime.gguf_checks import check_gguf
from specframe.runtime.gguf_header import read_header
from specframe.terms.errors import ModelLoadError
from specframe.testing import tiny_target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_gguf(tiny_target(0), tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def edited(tiny: Path, out: Path, key: str, value: int) -> Path:
    """`tiny` with the integer `key` (or, for "n_dims", the first tensor's dimension count, or for an array
    key, its item count) set to `value`, written to `out`."""
    raw, header = tiny.read_bytes(), read_header(tiny)
    if key == "n_dims":
        tensor = next(iter(header.tensors.values()))
        raw = put(raw, tensor.at + 8 + len(tensor.name), "<I", value)
    else:
        field = header.fields[key]
        raw = put(raw, field.offset + 8, "<Q", value) if field.item_type is not None else put(
            raw, field.offset + 4, "<I", value)
    out.write_bytes(raw)
    return out


def test_the_tiny_gguf_is_read_and_passes(tiny):
    header = read_header(tiny)
    config = tiny_target(0).config
    assert header.fields["llama.block_count"].value == config.num_hidden_layers
    assert header.fields["tokenizer.ggml.tokens"].count == config.vocab_size
    assert header.tensors["token_embd.weight"].shape == (config.hidden_size, config.vocab_size)
    check_gguf(tiny)


MALFORMED = {  # what made the conversion fail with another exception, and the words of its error
    "only the magic": (None, None, "malformed: the version needs 4 bytes at byte 4, and the file has 4"),
    "a huge array count": ("tokenizer.ggml.tokens", 2 ** 62,
                           "tokenizer.ggml.tokens claims 4611686018427387904 items, more than"),
    "a huge dimension count": ("n_dims", 2 ** 31, "has 2147483648 dimensions, and ggml tensors have 1 to 4"),
    "no heads": ("llama.attention.head_count", 0,
                 "llama.attention.head_count is 0, and it must be an integer of at least 1"),
    "no blocks": ("llama.block_count", 0, "llama.block_count is 0, and it must be from 1 to 512"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_gguf_is_a_model_load_error_before_converting(tiny, tmp_path, home, monkeypatch, case):
    key, value, needle = MALFORMED[case]
    bad = tmp_path / "bad.gguf"
    if key is None:
        bad.write_bytes(b"GGUF")
    else:
        edited(tiny, bad, key, value)
    with pytest.raises(ModelLoadError) as caught:
        load.resolve_model_dir(str(bad))
    assert needle in str(caught.value) and str(bad) in str(caught.value)
    assert "convert the model to GGUF again" in str(caught.value)


def test_gguf_file_refuses_what_llama_cpp_would_abort_on(tiny, tmp_path):
    """Every path to llama.cpp (the backend, the bench's peers) takes its file from `gguf_file`."""
    bad = edited(tiny, tmp_path / "bad.gguf", "llama.block_count", 0)
    assert load.gguf_file(str(tiny)) == tiny.resolve()
    with pytest.raises(ModelLoadError, match="llama.block_count is 0"):
        load.gguf_file(str(bad))


def test_generate_on_a_malformed_gguf_is_one_error_line(tiny, tmp_path):
    bad = edited(tiny, tmp_path / "bad.gguf", "n_dims", 2 ** 31)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECFRAME_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "specframe.cli", "generate", "hi", "--model", str(bad),
                           "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "2147483648 dimensions" in lines[0], proc.stderr


def test_counts_are_bounded_by_the_file_before_reading(tmp_path):
    """A header claiming more than the file holds is refused at the claim, not after reading it."""
    key = struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 8, 2 ** 62)  # an array of 2**62 strings
    (tmp_path / "a.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key)
    with pytest.raises(ModelLoadError, match="k claims 4611686018427387904 items, more than the 0 bytes"):
        read_header(tmp_path / "a.gguf")
    (tmp_path / "b.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2 ** 60, 2 ** 60))
    with pytest.raises(ModelLoadError, match="claims 1152921504606846976 tensors"):
        read_header(tmp_path / "b.gguf")
    (tmp_path / "c.gguf").write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ModelLoadError, match="does not start with b'GGUF'"):
        read_header(tmp_path / "c.gguf")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf dequantizing an edited type's bytes
def test_every_edit_of_the_header_is_refused_or_converts(tiny, tmp_path, home):
    """Each edit (`gguf_edits`): the check refuses it with a `ModelLoadError`, or transformers converts it."""
    refused, passed = 0, []
    for i, (label, raw) in enumerate(header_edits(tiny.read_bytes(), tiny)):
        path = tmp_path / f"edit-{i}.gguf"
        path.write_bytes(raw)
        try:
            check_gguf(path)
        except ModelLoadError:
            refused += 1
            continue
        passed.append((label, path))
    assert refused > 200 and len(passed) < 60, [label for label, _ in passed]
    for label, path in passed:
        try:
            load.resolve_model_dir(str(path))
        except ModelLoadError:
            pass
        except Exception as err:  # any other exception is the failure looked for
            pytest.fail(f"{label}: {type(err).__name__}: {err}")
