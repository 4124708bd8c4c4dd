"""The architecture holds: the import contracts in `pyproject.toml` are kept, no module takes part in an
import circle (lazy and `if TYPE_CHECKING:` imports count), and plugins import only core modules
documented in the API reference. The circle finder is checked on a graph with a planted circle,
so it can fail."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES = CONFIG["root_packages"]
PUBLIC_CORE = ("specframe", "specframe.kit", "specframe.testing")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles among modules: strongly connected components of more than one module (Tarjan)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while (member := stack.pop()) != module:
                component.append(member)
            if component:
                found.append(sorted([module, *component]))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_no_module_takes_part_in_an_import_circle(graph):
    found = circles(graph)
    assert not found, ("import circles (move the shared definition down a layer, or pass the value in): "
                       + "; ".join(" <-> ".join(c) for c in found))


def test_the_circle_finder_finds_a_planted_circle(graph):
    graph = copy.deepcopy(graph)  # the module's graph stays as built
    graph.add_import(importer="specframe.terms.errors", imported="specframe.decode.loop")
    assert any("specframe.terms.errors" in c and "specframe.decode.loop" in c for c in circles(graph))


def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plugins_import_only_core_modules_in_the_reference(graph):
    documented = {m for page in (ROOT / "docs" / "reference").glob("*.md")
                  for m in re.findall(r"^::: (\S+)", page.read_text(), re.M)}
    plugins = [p for p in PACKAGES if p not in ("specframe", "specframe_kernels")]
    modules = {m for plugin in plugins for m in graph.find_descendants(plugin) | {plugin}}
    used = {imported for module in modules for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith("specframe.")}
    # `specframe` itself is public but its submodules are not, except those of the kit and the test helpers
    outside = sorted(m for m in used if not any(m.startswith(p + ".") for p in PUBLIC_CORE[1:]))
    undocumented = sorted(m for m in used - set(outside) if m not in documented)
    assert not outside, f"plugins import core internals; use specframe.kit instead: {outside}"
    assert not undocumented, f"document these kit modules in docs/reference (`::: name`): {undocumented}"


def test_plugins_import_exactly_the_packages_they_declare(graph):
    """`[tool.specframe.plugin-requires]` in pyproject.toml is the declaration: a plugin imports another of
    this repository's packages (the corpus, the kernels) if and only if it declares it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["tool"]["specframe"]["plugin-requires"]
    for name, package in project["project"]["entry-points"]["specframe"].items():
        modules = graph.find_descendants(package) | {package}
        imported = {b.split(".")[0] for m in modules for b in graph.find_modules_directly_imported_by(m)}
        uses = sorted(imported - {package, "specframe"})
        assert uses == sorted(declared.get(name, [])), \
            f"plugin '{name}' imports {uses}; declare exactly these under [tool.specframe.plugin-requires]"
