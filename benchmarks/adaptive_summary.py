"""Issue 14's checks over `specframe bench` results: for every method its overall speedup, its worst
category, the share of turns below 0.9x, and for each drafter `auto` against its best fixed budget.

    python benchmarks/adaptive_summary.py results/auto/humaneval results/auto/specbench

Reads each directory's `results.json` (written by `specframe bench`) and prints markdown tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(table: dict) -> list[dict]:
    overall = table.get("overall") or next(iter(table.values()))
    categories = {c: t for c, t in table.items() if c != "overall"}
    out = []
    for method, stats in overall.items():
        if method.startswith("baseline"):
            continue
        per_category = {c: t[method]["speedup"]["mean"] for c, t in categories.items() if method in t}
        worst = min(per_category.items(), key=lambda kv: kv[1]) if per_category else (None, None)
        out.append({"method": method, "speedup": stats["speedup"]["mean"], "tau": stats["tau"],
                    "worst_category": worst[0], "worst_speedup": worst[1],
                    "slow_turns": stats["slow_turns"], "mean_tree": stats["mean_tree_size"]})
    return out


def category_matrix(table: dict) -> list[str]:
    """Speedup of every method in every category (methods as rows), when there are several categories."""
    categories = [c for c in table if c != "overall"]
    if len(categories) < 2:
        return []
    methods = [m for m in table["overall"] if not m.startswith("baseline")]
    lines = ["", "| method | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
    for m in methods:
        cells = [f"{table[c][m]['speedup']['mean']:.2f}" if m in table[c] else "-" for c in categories]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def family(method: str) -> tuple[str, str | None]:
    name, _, budget = method.partition("@")
    return name, budget or None


def report(directory: Path) -> str:
    table = json.loads((directory / "results.json").read_text())["categories"]
    found = rows(table)
    lines = [f"### {directory}", "", "| method | speedup | worst category | turns < 0.9x | tau | mean tree |",
             "|---|---|---|---|---|---|"]
    for r in found:
        worst = f"{r['worst_speedup']:.2f} ({r['worst_category']})" if r["worst_category"] else "-"
        slow = f"{100 * r['slow_turns']:.0f} %" if r["slow_turns"] is not None else "-"
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        tree = f"{r['mean_tree']:.1f}" if r["mean_tree"] is not None else "-"
        lines.append(f"| {r['method']} | {r['speedup']:.2f} | {worst} | {slow} | {tau} | {tree} |")
    lines += category_matrix(table)
    by_family: dict[str, dict[str, float]] = {}
    for r in found:
        name, budget = family(r["method"])
        if budget is not None:
            by_family.setdefault(name, {})[budget] = r["speedup"]
    compared = {n: b for n, b in by_family.items() if any(k.startswith("auto") for k in b) and len(b) > 1}
    if compared:
        lines += ["", "| drafter | auto | best fixed | auto / best fixed |", "|---|---|---|---|"]
        for name, budgets in compared.items():
            auto = next(v for k, v in budgets.items() if k.startswith("auto"))
            fixed = {k: v for k, v in budgets.items() if not k.startswith("auto")}
            best = max(fixed, key=fixed.get)
            lines.append(f"| {name} | {auto:.2f} | {fixed[best]:.2f} (@{best}) | {auto / fixed[best]:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print("\n".join(report(Path(d)) for d in sys.argv[1:]))
