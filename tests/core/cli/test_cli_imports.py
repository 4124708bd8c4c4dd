"""The CLI starts without torch or transformers: `specframe --help` and `specframe plugins` only read what
plugins register, and registering a component imports nothing heavy (its methods import torch when they
run). Checked in a fresh process through sys.modules, not by timing."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")
# Runs the CLI's entry point, then reports which heavy packages it imported, on stderr's last line.
PROBE = """
import json, sys
sys.argv = ["specframe", *sys.argv[1:]]
from specframe.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {heavy!r})), file=sys.stderr)
"""


def imported_by(*args: str) -> tuple[list[str], str]:
    """The heavy packages `specframe ARGS` imported, and what it printed."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *args], capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout


@pytest.mark.parametrize("args", [("--help",), ("plugins",)])
def test_cli_starts_without_torch_or_transformers(args):
    heavy, stdout = imported_by(*args)
    assert heavy == [], f"`specframe {' '.join(args)}` imported {heavy}"
    if args == ("plugins",):  # every plugin registered: none was skipped for a failed import
        described = json.loads(stdout)
        assert described["failed"] == {}
        assert {"kv", "ssm-tree"} <= set(described["components"]["backends"])
