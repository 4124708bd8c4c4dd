"""Issue 16's tables from `specframe bench` records: every method against plain decoding and against a
reference method (`pld` by default), split by turn or by repeat, with tau, drafted tokens per accepted
token and the drafters' memory.

    python benchmarks/suffix_summary.py results/i16/bon0 results/i16/bon1 --by repeat --reference pld
    python benchmarks/suffix_summary.py results/i16/mtbench --by turn

Several directories (e.g. `--shard` halves) are read as one run. Speedups are means over turns of the
per-turn tokens/s ratio, as `specframe bench` reports them; "vs reference" divides by the reference
method's tokens/s on the same turn and repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specframe.bench.runner import read_records


def load(directories: list[Path]) -> list[dict]:
    return [record for directory in directories for record in read_records(directory / "records.jsonl")]


def split_key(record: dict, by: str) -> str:
    if by == "turn":
        return f"turn {record['turn'] + 1}"
    if by == "repeat":
        return "first sample" if record["repeat"] == 0 else "later samples"
    return "all"


def mean_ratio(mine: list[dict], other: str, key: dict) -> float | None:
    """Mean over `mine`'s turns of their tokens/s over method `other`'s on the same turn and repeat."""
    pairs = [(r, key.get((other, r["qid"], r["turn"], r["repeat"]))) for r in mine]
    values = [r["metrics"]["tokens_per_s"] / b["metrics"]["tokens_per_s"] for r, b in pairs
              if b is not None and b["metrics"]["tokens_per_s"]]
    return statistics.fmean(values) if values else None


def summarize(records: list[dict], by: str, reference: str) -> dict:
    """{split: {method: stats}}."""
    key = {(r["method"], r["qid"], r["turn"], r["repeat"]): r for r in records}
    out: dict[str, dict] = {}
    for r in records:
        out.setdefault(split_key(r, by), {}).setdefault(r["method"], []).append(r)
    table = {}
    for split, methods in out.items():
        table[split] = {}
        ref_label = next((m for m in methods if m == reference or m.startswith(reference + "+")), None)
        for method, mine in methods.items():
            m = [r["metrics"] for r in mine]
            steps = sum(x["steps"] for x in m)
            drafted = [x["draft_tokens"] for x in m]
            accepted = sum(x["accepted_draft_tokens"] or 0 for x in m)
            stats = next((r["metrics"]["drafter_stats"] for r in reversed(mine)
                          if r["metrics"].get("drafter_stats")), None)
            table[split][method] = {
                "turns": len(mine), "speedup": mean_ratio(mine, "baseline", key),
                "vs_reference": mean_ratio(mine, ref_label, key) if ref_label else None,
                "tau": sum(x["new_tokens"] for x in m) / steps if steps else None,
                "drafted_per_accepted": (sum(drafted) / accepted
                                         if None not in drafted and accepted else None),
                "drafter_stats": stats}
    return table


def markdown(table: dict, reference: str) -> str:
    def num(value, fmt=".2f"):
        return "-" if value is None else format(value, fmt)

    lines = []
    for split, methods in table.items():
        lines += [f"### {split}", "", f"| method | turns | speedup vs plain | vs {reference} | tau "
                  "| drafted per accepted | drafter memory |", "|---|---|---|---|---|---|---|"]
        for method, s in methods.items():
            st = s["drafter_stats"]
            memory = (f"{st['memory_bytes'] / 2**20:.2f} MiB ({st['responses']} responses, "
                      f"{st['tokens']} tokens)"
                      if st and "responses" in st else "-")
            lines.append(f"| {method} | {s['turns']} | {num(s['speedup'])} | {num(s['vs_reference'])} "
                         f"| {num(s['tau'])} | {num(s['drafted_per_accepted'], '.1f')} | {memory} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--by", choices=["all", "turn", "repeat"], default="all")
    parser.add_argument("--reference", default="pld", help="method (or its drafter prefix) to compare with")
    parser.add_argument("--json", type=Path, help="also write the table as JSON")
    args = parser.parse_args()
    table = summarize(load(args.directories), args.by, args.reference)
    if args.by != "all":
        table = {"all": summarize(load(args.directories), "all", args.reference)["all"], **table}
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    print(markdown(table, args.reference))


if __name__ == "__main__":
    main()
