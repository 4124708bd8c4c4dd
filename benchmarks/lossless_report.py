"""Tabulate the exact-law evidence behind the lossless claims: every check of
tests/core/decode/test_lossless_power.py and tests/core/decode/test_lossless_e2e.py, with N, chi-square,
p-value and total variation against its noise level.

    OMP_NUM_THREADS=1 python benchmarks/lossless_report.py --out docs/results/exact-law.md

Same scenarios, seeds and run counts as the tests, so the numbers are the ones CI checks (about 6 minutes
on one core). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_lossless_e2e as e2e
import test_lossless_power as power

from specframe.support.progress import bar as progress_bar
from specframe.testing.exact import LogitTable, decoder_counts, exact_law, law_test
from specframe.testing.law import RUNS, builder_scenarios


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def stats(r) -> tuple:
    return r.runs, f"{r.chi2:.1f} / {r.cells - 1}", f"{r.pvalue:.3g}", f"{r.tv:.4f}", f"{r.tv_noise:.4f}"


def direct_tables() -> list[str]:
    lines = ["## Verifiers and tree builders called directly (20,000 two-token decodes each)", "",
             row("component", "scenario", "N", "chi2 / dof", "p", "TV", "TV noise"), row(*["---"] * 7)]
    cases = [("rejection", s) for s in power.REJECTION] + [("sample-match", s) for s in power.SAMPLE_MATCH]
    cases += [(f"rejection behind `{b}`", s) for b in ("chain", "trie", "static")
              for s in builder_scenarios(power.component("tree builder", b), (3,))]
    for label, case in progress_bar(cases, desc="shipped components"):
        name = "rejection" if label.startswith("rejection") else "sample-match"
        verifier = power.component("verifier", name)
        lines.append(row(label, case.name, *stats(case.run(verifier, RUNS))))
    lines += ["", "## Mutants (each must score p < 1e-6 in the scenario aimed at it)", "",
              row("mutant", "scenario", "N", "chi2 / dof", "p", "TV", "TV noise"), row(*["---"] * 7)]
    for label, verifier, case in progress_bar(power.MUTANTS, desc="mutants"):
        lines.append(row(label, case.name, *stats(case.run(verifier, RUNS))))
    return lines


def e2e_tables(tmp: Path) -> list[str]:
    target = e2e.tiny_target(seed=0, vocab_size=8)
    setup = (target, LogitTable.from_target(target, e2e.PROMPT, e2e.DEPTH), str(tmp))
    table = setup[1]
    lines = ["", "## End to end through `SpeculativeDecoder` (table backend unless noted)", "",
             "Combinations where `rejection` uses the drafter's q, against the exact law of the first two "
             "tokens:",
             "", row("drafter", "tree", "verifier", "sampling", "N", "chi2 / dof", "p", "TV", "TV noise"),
             row(*["---"] * 9)]
    fixed = [case.values for case in e2e.USES_Q if case.values[-1] == e2e.BUDGET]
    for d, t, v, params, runs, budget in progress_bar(fixed, desc="end to end, q"):
        run = e2e.decoder(setup, d, t, v, budget=budget)
        counts, _ = decoder_counts(run, e2e.PROMPT, e2e.DEPTH, runs, params, e2e.MAX_NEW)
        sampling = f"T={params.temperature}, top-p={params.top_p}"
        lines.append(row(d, t, v, sampling, *stats(law_test(counts, exact_law(table, params)))))
    kv = e2e.get_registry().get("backend", "kv")
    for d, t in (("draft-model", "chain"), ("s4c", "static")):
        hidden = e2e.get_registry().get("drafter", d).capabilities.needs_hidden_states
        run = e2e.decoder(setup, d, t, "rejection", kv(target, want_hidden=hidden))
        counts, _ = decoder_counts(run, e2e.PROMPT, e2e.DEPTH, 1000, e2e.FILTERED, e2e.MAX_NEW)
        lines.append(row(d, t, "rejection (kv backend)", "T=0.7, top-p=0.9",
                         *stats(law_test(counts, exact_law(table, e2e.FILTERED)))))
    mutant = e2e.decoder(setup, "draft-model", e2e.ByScoreChain(), "rejection")
    counts, _ = decoder_counts(mutant, e2e.PROMPT, e2e.DEPTH, e2e.RUNS_HOT, e2e.HOT, e2e.MAX_NEW)
    lines.append(row("draft-model", "**mutant**: chain by score", "rejection", "T=1.0, top-p=1.0",
                     *stats(law_test(counts, exact_law(table, e2e.HOT)))))
    plain = e2e.decoder(setup, "none", "chain", "sample-match")
    counts, _ = decoder_counts(plain, e2e.PROMPT, e2e.DEPTH, e2e.RUNS_PLAIN, e2e.HOT)
    lines += ["", "Every other combination emits, request by request, exactly the tokens of plain sampling "
              f"with the same seed ({e2e.RUNS_REPLAY} seeds, T = 1, checked token for token); plain sampling "
              f"itself: {law_test(counts, exact_law(table, e2e.HOT))}.", "",
              row("drafter", "tree", "verifier"), row("---", "---", "---")]
    lines += [row(d, t, v) for d, t, v in dict.fromkeys((d, t, v) for d, t, v, _ in e2e.REPLAYS)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/exact-law.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        lines = ["# Lossless sampling: exact-law evidence", "",
                 "Produced by `OMP_NUM_THREADS=1 python benchmarks/lossless_report.py` (the scenarios, seeds "
                 "and run counts of tests/core/decode/test_lossless_power.py and "
                 "tests/core/decode/test_lossless_e2e.py). "
                 "A check passes at p >= 1e-4; TV noise is the mean total variation of N exact draws.", ""]
        lines += direct_tables() + e2e_tables(Path(tmp))
    lines += ["", f"Total time: {time.perf_counter() - start:.0f} s on one core."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
