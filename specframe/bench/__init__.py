"""The benchmark harness behind `specframe bench`: suites, method specs, the interleaved resumable
runner, transformers peers, reports and plots. See `specframe.bench.harness.run_benchmark`."""

from specframe.bench.harness import run_benchmark
from specframe.bench.methods import MethodSpec, parse_method, resolve_methods, usable_presets
from specframe.bench.suites import SUITES, BenchPrompt, load_suite

__all__ = ["SUITES", "BenchPrompt", "MethodSpec", "load_suite", "parse_method", "resolve_methods",
           "run_benchmark", "usable_presets"]
