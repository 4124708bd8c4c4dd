"""The documentation stays true to the code: every hook with its exact signature, every public name in
the reference, the tutorial's drafter lossless, and `mkdocs build --strict` clean."""

from __future__ import annotations

import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest

import specframe
from specframe.contract import hookspecs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HOOKS_PAGE = DOCS / "reference" / "hooks.md"


def hook_functions() -> dict[str, object]:
    return {name: fn for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
            if hasattr(fn, f"{hookspecs.PROJECT}_spec")}


def signature_line(name: str, fn) -> str:
    """`def name(arg: Annotation, ...) -> Return` with annotations exactly as written in hookspecs.py."""
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"def {name}({params}) -> {sig.return_annotation}"


def reference_text() -> str:
    return "\n".join(p.read_text() for p in sorted((DOCS / "reference").glob("*.md")))


def test_hookspecs_are_found():
    assert {"register_drafters", "register_tree_builders", "register_verifiers", "register_state_backends",
            "register_presets", "register_cli_options", "register_commands"} <= set(hook_functions())


@pytest.mark.parametrize("name", sorted(hook_functions()))
def test_every_hook_is_documented_with_its_exact_signature(name):
    text = HOOKS_PAGE.read_text()
    line = signature_line(name, hook_functions()[name])
    assert line in text, f"docs/reference/hooks.md must show `{line}` (the signature in hookspecs.py)"
    members = re.search(r"::: specframe\.contract\.hookspecs\n(?:\s+.*\n)*", text).group(0)
    assert f"- {name}\n" in members, \
        f"add {name} to the members of `::: specframe.contract.hookspecs` in hooks.md"


def test_every_public_name_is_in_the_reference():
    import importlib

    directives = set(re.findall(r"^::: ([\w.]+)", reference_text(), flags=re.M))
    for name in specframe.__all__:
        obj = getattr(specframe, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            homes = {obj.__module__}
        else:  # a constant: any rendered module that defines it
            homes = {m for m in directives if getattr(importlib.import_module(m), name, None) is obj}
        assert homes & directives or {f"{m}.{name}" for m in homes} & directives, \
            f"specframe.{name} is not rendered by any `::: ...` directive in docs/reference"


def test_every_first_party_plugin_is_in_the_component_reference():
    text = (DOCS / "reference" / "components.md").read_text()
    committed = subprocess.run(["git", "ls-files", "plugins"], cwd=ROOT, capture_output=True,
                               text=True).stdout
    packages = sorted({line.split("/")[1] for line in committed.splitlines() if line.count("/") >= 2})
    if not packages:
        pytest.skip("not a git checkout")
    missing = [p for p in packages if f"::: {p}" not in text]
    assert not missing, f"docs/reference/components.md does not render {missing}"


def test_nav_lists_every_page_and_every_page_exists():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", config, flags=re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav <= pages, f"in the nav but missing: {sorted(nav - pages)}"
    assert pages <= nav, f"pages missing from the nav: {sorted(pages - nav)}"


def mkdocs_config() -> dict:
    """mkdocs.yml as plain YAML, its tags (`!ENV ...`) read as None."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_strict_build_refuses_dead_links():
    """`validation` raises every link check to a warning, which `strict: true` turns into a failure:
    mkdocs' defaults leave a dead link at INFO, which even a strict build lets through."""
    config = mkdocs_config()
    assert config["strict"] is True
    checks = config["validation"]
    for key in ("omitted_files", "absolute_links", "unrecognized_links", "anchors"):
        assert checks[key] == "warn", key
    for key in ("omitted_files", "not_found", "absolute_links"):
        assert checks["nav"][key] == "warn", f"nav.{key}"
    for key in ("not_found", "absolute_links", "unrecognized_links", "anchors"):
        assert checks["links"][key] == "warn", f"links.{key}"


def test_docs_stay_small():
    """Measured data lives in git history and in the gitignored results/records, not in docs/."""
    committed = subprocess.run(["git", "ls-files", "-s", "docs"], cwd=ROOT, capture_output=True, text=True)
    if committed.returncode:
        pytest.skip("not a git checkout")
    size = sum((ROOT / line.split("\t", 1)[1]).stat().st_size for line in committed.stdout.splitlines()
               if (ROOT / line.split("\t", 1)[1]).exists())
    assert size < 2 * 2**20, f"docs/ holds {size / 2**20:.1f} MiB of tracked files; keep it under 2 MiB"


# A lab notebook's references ("run 38's outputs", "runs 33-37", "issue 16", "stop 12", "since commit
# `e8e98cf`"), which a reader cannot follow: a page states the finding as it stands (git keeps the
# history). "runs 5 times" and "runs 20,000 decodes" are not such references.
NOTEBOOK_REFERENCE = re.compile(r"\b(?:[Rr]uns?|[Ii]ssues?|[Ss]tops?) #?\d{1,3}(?:-\d{1,3})?\b"
                                r"(?![,.]?\d| times)|\bcommit `?[0-9a-f]{7}")


# One run's own folder of outputs (`results/s61/self-code`), which a reader does not have: a usage line
# names a neutral folder (`results/records/...`, `/tmp/...`).
RUN_FOLDER = re.compile(r"\bresults/s\d{2,3}\b")


def test_notebook_reference_pattern():
    for text in ("over run 38's outputs", "runs 33-37", "issue 16's workload", "stop 12", "commit `e8e98cf`"):
        assert NOTEBOOK_REFERENCE.search(text), text
    for text in ("each side runs 5 times", "runs 20,000 seeded decodes", "a run of 128 tokens"):
        assert not NOTEBOOK_REFERENCE.search(text), text
    for text in ("--out results/s61/self-code.jsonl", "replay.py results/s55/sb-t1"):
        assert RUN_FOLDER.search(text), text
    for text in ("--out results/records/self-code", "results/gpu/fixed", "results/s4c-heads"):
        assert not RUN_FOLDER.search(text), text


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md"))])
def test_user_docs_name_no_runs_issues_or_commits(page):
    lines = (ROOT / page).read_text().splitlines()
    found = [f"{page}:{n}: {line.strip()}" for n, line in enumerate(lines, 1)
             if NOTEBOOK_REFERENCE.search(line)]
    assert not found, "say what is true now, not when it was found:\n" + "\n".join(found)


# Where code comments and docstrings are held to the same rule as the pages. This file is left out: it
# holds the planted references the patterns are tested on.
CODE_FOLDERS = ("specframe", "plugins", "kernels", "benchmarks", "tests", "examples", "notebooks")
PATTERN_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()
PROSE_TOKENS = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def prose_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every line of the comments and strings of Python `source`: what a reader
    reads beside the code. The code itself is left out: a name such as `run_21` is no reference."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in PROSE_TOKENS:
            found += [(token.start[0] + n, line) for n, line in enumerate(token.string.splitlines())]
    return found


def lab_references(name: str, source: str) -> list[str]:
    """`name:line: text` for every comment or string line of `source` that names a run, issue, stop,
    commit or a run's results folder."""
    return [f"{name}:{n}: {line.strip()}" for n, line in prose_lines(source)
            if NOTEBOOK_REFERENCE.search(line) or RUN_FOLDER.search(line)]


def test_lab_references_are_found_in_comments_and_docstrings():
    planted = ('"""Replay (issue 15).\n\n    python replay.py results/s55/sb-t1\n"""\n\n'
               'steps = 1  # as in run 21\nlabel = "stop 12"\n')
    found = [line.split(": ", 1)[0] for line in lab_references("planted.py", planted)]
    assert found == ["planted.py:1", "planted.py:3", "planted.py:6", "planted.py:7"], found
    clean = '"""Each side runs 5 times."""\nrun_21 = "results/records/sb-t1"  # runs 20,000 seeded decodes\n'
    assert lab_references("clean.py", clean) == []


def tracked_python_files(folder: str) -> list[str]:
    """The committed .py files under `folder` (what a reader of the repository gets), this one left out."""
    listed = subprocess.run(["git", "ls-files", "--", f"{folder}/*.py"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    return [name for name in listed.stdout.splitlines() if name != PATTERN_FILE and (ROOT / name).is_file()]


@pytest.mark.parametrize("folder", CODE_FOLDERS)
def test_code_comments_name_no_runs_issues_or_commits(folder):
    """Comments and docstrings say why the code is as it is, never when that was found: git keeps the
    history, and the finding as it stands is what a reader needs."""
    found = [line for name in tracked_python_files(folder)
             for line in lab_references(name, (ROOT / name).read_text())]
    assert not found, "say why, not when (state the finding as it stands):\n" + "\n".join(found)


# A measured figure in a comment or docstring of the product ("12.7 ms", "2.1x", "on the development CPU")
# is true of one machine on one day: it belongs in docs/explanation, and the comment keeps the reason.
# Shapes ("4x4", "80 x 64"), hex ("0x1F"), seconds of a timeout, versions and options do not match, nor does
# a figure quoted as a label between quotes or backticks ("turns < 0.9x").
MEASURED_FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|us|µs)\b"
                             r"|(?<![\w.])\d+(?:\.\d+)?x\b|\bdevelopment CPU\b")
QUOTED = re.compile(r"\"[^\"]*\"|`[^`]*`")
DOCSTRING = re.compile(r"[rRuU]?(?:\"\"\"|\'\'\')")
PRODUCT_FOLDERS = ("specframe", "plugins", "kernels")


def measured_figures(name: str, source: str) -> list[str]:
    """`name:line: text` for every comment or docstring line of `source` that states a measured figure."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string
        elif token.type == tokenize.STRING and DOCSTRING.match(token.string):
            text = DOCSTRING.sub("", token.string, count=1)[:-3]  # without its own quotes
        else:
            continue
        found += [f"{name}:{token.start[0] + n}: {line.strip()}" for n, line in enumerate(text.splitlines())
                  if MEASURED_FIGURE.search(QUOTED.sub("", line))]
    return found


def test_measured_figures_are_found_in_comments_and_docstrings():
    planted = ('"""A step takes 12.7 ms on the development CPU."""\n\n'
               'size = 4  # 2.1x faster packed\nwait = 5  # 0.1-0.3 ms a step, 10 us alone\n')
    found = [line.split(": ", 1)[0] for line in measured_figures("planted.py", planted)]
    assert found == ["planted.py:1", "planted.py:3", "planted.py:4"], found
    clean = ('"""A (4x4) grid of 80 x 64 heads, mask 0x1F, torch 2.13, a 5 s timeout, `budget=4`."""\n'
             'label = "turns < 0.9x"  # the report\'s "below 0.9x" column, `kv(min_rows=4)`\n'
             'header = f"0x{code:02x} at 3.5x"\n')
    assert measured_figures("clean.py", clean) == []


@pytest.mark.parametrize("folder", PRODUCT_FOLDERS)
def test_code_comments_state_no_measured_figures(folder):
    """A comment says why the code is as it is; how fast it was on one machine is a page's business
    (docs/explanation/metrics-and-costs.md and its neighbours), in words."""
    found = [line for name in tracked_python_files(folder)
             for line in measured_figures(name, (ROOT / name).read_text())]
    assert not found, "move the figure to docs/explanation and keep the reason here:\n" + "\n".join(found)


def test_the_tutorial_drafter_is_lossless(tiny_target):
    """The code of 'Write your first drafter plugin' runs as printed and decodes losslessly."""
    text = (DOCS / "tutorials" / "first-drafter-plugin.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "class BigramDrafter" in b)
    namespace: dict = {}
    exec(compile(block, "first-drafter-plugin.md", "exec"), namespace)
    from specframe.testing import check_lossless, make_decoder, repetitive_prompt

    decoder = make_decoder(tiny_target, namespace["BigramDrafter"], "chain", "greedy", "kv")
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=s) for s in (0, 1)]
    check_lossless(decoder, prompts, 40, "tutorial BigramDrafter")
    assert decoder.generate(prompts[0], max_new_tokens=40).metrics.steps < 40  # it does draft


def test_the_tutorial_verifier_passes_the_conformance_checks(tiny_target):
    """The code of 'Write a verifier' runs as printed: lossless greedy paths, the sampled law, lossless
    decoding, and (capped) not maximal."""
    text = (DOCS / "tutorials" / "write-a-verifier.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "class CappedMatch" in b)
    namespace: dict = {}
    exec(compile(block, "write-a-verifier.md", "exec"), namespace)
    from specframe.testing import (
        check_lossless, check_verifier_greedy, check_verifier_law, make_decoder, repetitive_prompt,
    )

    verifier = namespace["CappedMatchVerifier"]
    check_verifier_greedy(verifier(max_accept=2), np.random.default_rng(0))
    with pytest.raises(AssertionError, match="accepted 2 of the"):
        check_verifier_greedy(verifier(max_accept=2), np.random.default_rng(0), maximal=True)
    check_verifier_law(verifier(max_accept=1), runs=2000)
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=0)]
    check_lossless(make_decoder(tiny_target, "pld(matches=3)", "trie", verifier, "kv"), prompts, 40,
                   "tutorial CappedMatchVerifier")


def tutorial_names(page: str) -> set[str]:
    """The plugin and component names a tutorial tells its reader to register."""
    text = (DOCS / "tutorials" / page).read_text()
    names = set(re.findall(r"^\s+name = \"([^\"]+)\"", text, flags=re.M))
    names |= set(re.findall(r'change its `name` line to `name = "([^"]+)"`', text))
    entry_points = re.search(r"\[project\.entry-points\.specframe\]\n(.*?)```", text, flags=re.S)
    if entry_points:
        names |= set(re.findall(r"^([\w-]+) =", entry_points.group(1), flags=re.M))
    return names


@pytest.mark.parametrize("page", ["first-drafter-plugin.md", "write-a-verifier.md"])
def test_tutorial_names_cannot_clash_with_anything_shipped(page):
    """A reader who follows a tutorial word for word installs a plugin beside specframe's own plugins and
    the example plugin; a shared name would get one of them refused."""
    from importlib.metadata import entry_points

    from specframe.plugging.registry import PluginRegistry

    example = ROOT / "examples" / "specframe-example-plugin" / "src" / "specframe_example"
    shipped = set(re.findall(r'^\s+name = "([^"]+)"', "".join(p.read_text() for p in example.glob("*.py")),
                             flags=re.M))
    registry = PluginRegistry()
    shipped |= {name for kind in registry.registers for name in registry.names(kind)}
    shipped |= {ep.name for ep in entry_points(group="specframe")} | {"example"}
    names = tutorial_names(page)
    assert names, f"found no names in {page}"
    assert not names & shipped, f"{page} registers names that specframe or its example plugin use"


def test_the_tutorial_backend_passes_the_conformance_checks(tiny_target):
    """The code of 'Write a state backend' runs as printed, is the example plugin's, and conforms."""
    text = (DOCS / "tutorials" / "write-a-state-backend.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    block = next(b for b in blocks if "class RecomputeBackend" in b)
    example = ROOT / "examples" / "specframe-example-plugin" / "src" / "specframe_example" / "backend.py"
    source = example.read_text()
    assert block[block.index("class RecomputeBackend"):] == source[source.index("class RecomputeBackend"):], \
        "the tutorial's RecomputeBackend differs from examples/.../specframe_example/backend.py"
    namespace: dict = {}
    exec(compile(block, "write-a-state-backend.md", "exec"), namespace)
    from specframe.testing import check_backend_scores, check_lossless, make_decoder, repetitive_prompt

    backend = namespace["RecomputeBackend"]
    prompts = [repetitive_prompt(tiny_target.vocab_size, 40, seed=s) for s in (0, 1)]
    check_backend_scores(backend, tiny_target, prompts[0], np.random.default_rng(0))
    check_lossless(make_decoder(tiny_target, "pld(matches=3)", "trie", "greedy", backend), prompts, 40,
                   "tutorial RecomputeBackend")


def quoted_blocks(page: Path) -> list[tuple[str, str]]:
    """(path, code) of every python block of `page` whose first line is `# <path>` naming a file of this
    repository: such a block quotes that file."""
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", page.read_text(), flags=re.S)
    return [(path, code) for path, code in blocks if (ROOT / path).is_file()]


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")))
def test_quoted_code_stands_verbatim_in_the_file_it_names(page):
    for path, code in quoted_blocks(DOCS / page):
        assert code in (ROOT / path).read_text(), \
            f"docs/{page} quotes {path}, but the block is no longer in that file: copy it again"


def test_the_tree_builder_tutorial_quotes_the_example_builder_and_it_conforms():
    """'Write a tree builder' shows the example plugin's `breadth-first` as it is, and that code conforms."""
    blocks = dict(quoted_blocks(DOCS / "tutorials" / "write-a-tree-builder.md"))
    code = blocks["examples/specframe-example-plugin/src/specframe_example/tree.py"]
    namespace: dict = {}
    exec(compile(code, "write-a-tree-builder.md", "exec"), namespace)
    from specframe.testing import check_tree_builder

    check_tree_builder(namespace["BreadthFirstTreeBuilder"](), np.random.default_rng(0))


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            raise RuntimeError(
                "mkdocs is not installed; CI must install the docs extra: pip install -e '.[docs]'")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # MathJax and fonts are served with the site: offline, the math still renders
    assert (site / "javascripts" / "mathjax" / "tex-mml-chtml.js").is_file()
    assert list((site / "javascripts" / "mathjax" / "output" / "chtml" / "fonts").rglob("*.woff"))
    external = [f"{page.relative_to(site)}: {host}" for page in site.rglob("*.html")
                for host in ("cdn.jsdelivr", "fonts.googleapis", "fonts.gstatic", "unpkg.com", "cdnjs")
                if host in page.read_text()]
    assert not external, f"the site loads from elsewhere: {external[:5]}"
    hooks_html = (site / "reference" / "hooks" / "index.html").read_text()
    for name in hook_functions():
        assert f'id="specframe.contract.hookspecs.{name}"' in hooks_html, f"hook {name} not rendered"
    cli_html = (site / "reference" / "cli" / "index.html").read_text()
    assert "specframe generate" in cli_html and "--max-new-tokens" in cli_html


def test_the_drafter_tutorial_installs_the_package_before_its_tests_import_it():
    text = (DOCS / "tutorials" / "first-drafter-plugin.md").read_text()
    assert text.index("pip install -e .") < text.index("# tests/test_drafter.py"), \
        "the tutorial's tests import my_plugin, so `pip install -e .` must come first"


def test_the_verifier_tutorial_keeps_the_drafter_hook_and_shows_the_law_check():
    text = (DOCS / "tutorials" / "write-a-verifier.md").read_text()
    init = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                if b.startswith("# src/my_plugin/__init__.py"))
    assert "def register_drafters" in init and "def register_verifiers" in init, \
        "copied whole, the verifier tutorial's __init__.py must keep the drafter tutorial's hook"
    assert re.search(r"check_verifier_law\(.*, runs=\d", text) and "AssertionError" in text


# an absolute path of the machine that measured (or a run's own folder) in a page's command
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home|Users|tmp)/|\bresults/s\d{2,3}\b")


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in (DOCS / "results").glob("*.md")))
def test_result_pages_show_repository_relative_commands(page):
    text = (DOCS / page).read_text()
    found = [line for line in text.splitlines() if MACHINE_PATH.search(line)]
    assert not found, f"docs/{page} names the measuring machine's folders:\n" + "\n".join(found)
    outs = re.findall(r"--out[ =](\S+?)[`\s]", text)
    assert all(out.startswith("results/records/") for out in outs), outs


def first_screen(path: Path) -> str:
    """What a reader sees before scrolling: the page's text up to its first table or second heading."""
    text = path.read_text()
    text = text.split("\n---\n", 1)[-1] if text.startswith("---\n") else text  # after any front matter
    ends = [i for i in (text.find("\n| "), text.find("\n## ")) if i > 0]
    return text[:min(ends)] if ends else text


def test_pages_give_a_negative_answer_on_their_first_screen():
    assert "does not pay" in first_screen(DOCS / "results" / "speed-llamacpp.md")
    assert "loses at B = 16" in first_screen(DOCS / "results" / "speed-batch.md")
    assert "does not make llama.cpp faster" in first_screen(DOCS / "how-to" / "llama-cpp.md")
    index = (DOCS / "results" / "index.md").read_text()
    screen = index[:index.index("Regenerate:")]
    assert "(speed-llamacpp.md)" in screen and "(speed-batch.md)" in screen
    assert "(results/index.md)" in first_screen(DOCS / "index.md")


def test_the_readme_layout_names_the_core_as_it_is():
    lines = (ROOT / "README.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `specframe/`"))
    packages = sorted(p.name for p in (ROOT / "specframe").iterdir() if (p / "__init__.py").is_file())
    missing = [p for p in packages if f"`{p}/`" not in row]
    assert not missing, f"README's layout does not name specframe/{missing}"
    stale = [name for name in re.findall(r"`([\w/]+\.py)`", row)
             if not list((ROOT / "specframe").rglob(name))]
    assert not stale, f"README's layout names files that are gone: {stale}"


def test_the_core_tests_mirror_its_layers():
    """tests/core holds one folder per core package (or module: `cli`), named after it, and
    test_architecture.py, which checks the whole; README's layout says so."""
    core = {p.stem for p in (ROOT / "specframe").iterdir()
            if (p / "__init__.py").is_file() or p.suffix == ".py"}
    tests = ROOT / "tests" / "core"
    stray = sorted(p.name for p in tests.iterdir()
                   if p.is_dir() and p.name != "__pycache__" and p.name not in core)
    assert not stray, f"tests/core/{stray} are named after no package of specframe/"
    loose = sorted(p.name for p in tests.glob("test_*.py") if p.name != "test_architecture.py")
    assert not loose, f"tests/core/{loose} belong in the folder of the package they test"
    lines = (ROOT / "README.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `tests/`"))
    assert "`core/<layer>/`" in row and "`plugins/corpus/`" in row, row


def test_the_site_takes_its_repository_link_from_the_environment(monkeypatch):
    from mkdocs.config import load_config

    monkeypatch.delenv("SPECFRAME_REPO_URL", raising=False)
    assert not load_config(str(ROOT / "mkdocs.yml"))["repo_url"]
    monkeypatch.setenv("SPECFRAME_REPO_URL", "https://example.org/specframe")
    assert load_config(str(ROOT / "mkdocs.yml"))["repo_url"] == "https://example.org/specframe"


def test_result_tables_keep_method_names_whole_and_the_site_loads_nothing_from_elsewhere():
    config = mkdocs_config()
    assert "stylesheets/extra.css" in config["extra_css"]
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    assert re.search(r"table:not\(\[class\]\) td code \{[^}]*white-space: nowrap", css)
    assert not any("://" in script for script in config["extra_javascript"]), "served with the site"
    assert config["theme"]["font"] is False
