"""The benchmark harness behind `specframe bench`: suites, method specs, the interleaved resumable
runner, transformers peers, reports and plots. See `specframe.bench.harness.run_benchmark`."""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specframe.bench.harness import run_benchmark
    from specframe.bench.methods import MethodSpec, parse_method, resolve_methods, usable_presets
    from specframe.support.prompt_suites import SUITES, BenchPrompt, load_suite

# Imported on first use (PEP 562): `specframe bench --help` needs none of the harness's torch.
_EXPORTS = {
    "specframe.bench.harness": ("run_benchmark",),
    "specframe.bench.methods": ("MethodSpec", "parse_method", "resolve_methods", "usable_presets"),
    "specframe.support.prompt_suites": ("SUITES", "BenchPrompt", "load_suite"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["SUITES", "BenchPrompt", "MethodSpec", "load_suite", "parse_method", "resolve_methods",
           "run_benchmark", "usable_presets"]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'specframe.bench' has no attribute '{name}'")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])
