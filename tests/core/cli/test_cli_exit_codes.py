"""Exit codes of the real `specframe` process: a command's `typer.Exit` code survives `main()` (bench exits
3 on a lossless mismatch) and Ctrl-C exits 130 with a message. Checked in a subprocess, because click's
`CliRunner` hides what `main()` does with the codes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

# A stand-in app with the exits under test, run through the real `specframe.cli.main`.
STUB = """
import signal, sys, time, typer
import specframe.cli as cli
# A job started in the background by a non-interactive shell (as CI runs us) inherits SIGINT ignored;
# restore Python's handler so the process reacts to Ctrl-C as it would in a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)
app = typer.Typer()
@app.command()
def run(what: str):
    if what == "exit3":
        raise typer.Exit(3)
    if what == "sleep":
        print("ready", flush=True)
        time.sleep(60)
cli.build_app = lambda: app
sys.argv = ["specframe", *sys.argv[1:]]
cli.main()
"""


def run_stub(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STUB, *args], capture_output=True, text=True, timeout=120)


def test_a_command_exit_code_reaches_the_shell():
    assert run_stub("exit3").returncode == 3
    assert run_stub("ok").returncode == 0
    assert run_stub().returncode == 2  # missing argument: a usage error


def test_ctrl_c_exits_130_with_a_message():
    proc = subprocess.Popen([sys.executable, "-c", STUB, "sleep"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err
