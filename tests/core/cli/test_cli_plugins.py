"""The command line with plugins: options and commands they add, and plugins that fail without breaking it.

The failing plugins are installed for real (a `.dist-info` with entry points on PYTHONPATH) and the CLI
runs in a fresh process, as a user would meet them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PLUGINS = {
    "sf_badimport": 'raise ImportError("No module named \'missing_dep\'")\n',
    "sf_badcommands": """
        import specframe

        @specframe.hookimpl
        def register_commands(cli):
            raise RuntimeError("boom in register_commands")
    """,
    "sf_badoptions": """
        import specframe

        @specframe.hookimpl
        def register_cli_options(register):
            register(specframe.CliOption("--Not-A-Flag", help="x", envvar="X"))
    """,
    "sf_clash": """
        import specframe

        @specframe.hookimpl
        def register_cli_options(register):
            register(specframe.CliOption("--model", help="x", envvar="X"))
    """,
    "sf_dupe": """
        import specframe

        class Pld(specframe.Drafter):
            name = "pld"

            def propose(self, context):
                return specframe.DraftProposal.empty()

        @specframe.hookimpl
        def register_drafters(register):
            register(Pld)
    """,
    "sf_good": """
        import specframe

        @specframe.hookimpl
        def register_presets(register):
            register(specframe.Preset("good-pld", "pld(max_ngram=3)+chain+greedy@4"))

        @specframe.hookimpl
        def register_cli_options(register):
            register(specframe.CliOption("--good-width", help="Width of the good drafter.", type=int,
                                         component="pld", option="max_ngram"))
    """,
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A directory holding the plugins above as one installed distribution, `sf-plugins`."""
    site = tmp_path_factory.mktemp("site")
    for module, code in PLUGINS.items():
        (site / f"{module}.py").write_text(textwrap.dedent(code))
    info = site / "sf_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sf-plugins\nVersion: 0.1\n")
    entries = "".join(f"{module[3:]} = {module}\n" for module in PLUGINS)
    (info / "entry_points.txt").write_text("[specframe]\n" + entries)
    return site


def specframe_cli(site, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("SPECFRAME_LOAD_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "specframe.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_failing_plugins_leave_the_command_line_working(site):
    for args in (["--help"], ["generate", "--help"], ["bench", "--help"], ["datastore", "--help"]):
        out = specframe_cli(site, *args)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
    described = json.loads(specframe_cli(site, "plugins").stdout)
    failed = described["failed"]
    assert set(failed) == {"badimport", "badcommands", "badoptions", "clash", "dupe"}
    assert "missing_dep" in failed["badimport"]
    assert failed["badcommands"].startswith("register_commands: RuntimeError: boom")
    assert "--Not-A-Flag" in failed["badoptions"]
    assert "option --model left out" in failed["clash"]
    assert "registered twice" in failed["dupe"] and "specframe_pld.PromptLookupDrafter" in failed["dupe"]
    good = next(p for p in described["plugins"] if p["name"] == "good")
    assert good["presets"] == ["good-pld"] and good["options"] == ["--good-width"]


def test_plugin_options_are_listed_by_generate_and_bench(site):
    for command in ("generate", "bench"):
        help_text = specframe_cli(site, command, "--help").stdout
        assert "--datastore" in help_text and "--good-width" in help_text, help_text
        assert help_text.count("--model") == 1  # the clashing plugin's option is left out
    listing = specframe_cli(site, "bench", "--list-methods").stdout
    owner = {line.split()[0]: line.split()[-1] for line in listing.splitlines()[1:]}  # the plugin column
    assert owner["good-pld"] == "good" and owner["rest"] == "rest"
