"""Cut a `specframe bench` run down to some problems and methods, and write its reports again.

Two uses:

- a run stopped part way (a timeout, a lease that ended): keep the questions every method finished, so the
  tables compare like with like;
- a run resumed on another machine, where methods added on resuming timed problems whose baseline was
  timed on the first machine: keep only the problems one machine ran for every method (`--problems 19-39`),
  or only the methods that ran on both machines.

    python benchmarks/subset_run.py results/gpu/fixed results/gpu/fixed-19-39 --problems 19-39
    python benchmarks/subset_run.py results/gpu/fixed results/gpu/fixed-0-39 \
        --methods baseline,suffix@auto,suffix@8,hf-pld

Writes `records.jsonl`, `settings.json`, `results.json` and `results.md` into the second directory, as
`specframe bench` would have for those records (`--keep fastest` as its option of that name). Greedy
outputs are compared with the baseline's again; a mismatch is listed by token position (no tokenizer is
loaded here).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

from specframe.bench.report import complete_questions, write_reports
from specframe.bench.runner import BenchRun, compare, read_records


class TokenIds:
    """Stands in for a tokenizer in mismatch reports: shows token ids instead of text."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return " ".join(map(str, ids))


def problem_number(qid: str) -> int | None:
    """The number at the end of a question id (`HumanEval/23` -> 23), or None."""
    match = re.search(r"(\d+)$", qid)
    return int(match.group(1)) if match else None


def select(records: list[dict], problems: range | None, methods: list[str] | None) -> list[dict]:
    """The records of the chosen problems and methods, on questions every chosen method finished (every
    repeat of every turn, so a question the run was cut inside is left out)."""
    if problems is not None:
        records = [r for r in records if problem_number(r["qid"]) in problems]
    if methods is not None:
        records = [r for r in records if r["method"] in methods]
    return complete_questions(records, methods)


def mismatches(records: list[dict], baseline: str = "baseline") -> list:
    """Greedy outputs that differ from the baseline's on the same turn and repeat."""
    base = {(r["qid"], r["turn"], r["repeat"]): r for r in records if r["method"] == baseline}
    found = (compare(r, base[(r["qid"], r["turn"], r["repeat"])], baseline, TokenIds)
             for r in records if r["method"] != baseline and (r["qid"], r["turn"], r["repeat"]) in base)
    return [m for m in found if m is not None]


def write_subset(source: Path, dest: Path, problems: range | None, methods: list[str] | None,
                 keep: str = "all") -> list[dict]:
    """Write the chosen records and their reports into `dest`; return the records."""
    settings = json.loads((source / "settings.json").read_text("utf-8"))
    if methods is not None and "baseline" not in methods:
        raise SystemExit("--methods must include baseline: every speedup is measured against it")
    records = select(read_records(source / "records.jsonl"), problems, methods)
    if not records:
        raise SystemExit(f"{source}: no question that every chosen method finished")
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "records.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    shutil.copyfile(source / "settings.json", dest / "settings.json")
    runners = runners_of(source, list(dict.fromkeys(r["method"] for r in records)))
    greedy = settings.get("temperature", 0) == 0
    run = BenchRun(records=records, runners=runners, prompts=[SimpleNamespace(category=r["category"])
                                                              for r in records],
                   mismatches=mismatches(records) if greedy else [], identity_checked=greedy)
    questions = list(dict.fromkeys(r["qid"] for r in records))
    header = (f"## {settings['suite']}: {settings['model']}, {settings['max_new_tokens']} new tokens, "
              f"{settings['device']}, {settings['dtype']}, {settings['clock']} clock, keep {keep}\n\n"
              f"The {len(questions)} questions {questions[0]} .. {questions[-1]} of `{source}` that every "
              f"method here finished (`benchmarks/subset_run.py`).\n")
    write_reports(run, dest, {**settings, "limit": len(questions), "keep": keep}, header, keep)
    return records


def runners_of(source: Path, labels: list[str]) -> list[SimpleNamespace]:
    """What the reports need of each method: its baseline and whether it claims to be lossless, from the
    source's `results.json` where the run got that far, else every method lossless against `baseline`."""
    known = {}
    if (source / "results.json").is_file():
        known = {m["label"]: m for m in json.loads((source / "results.json").read_text("utf-8"))["methods"]}
    runners = []
    for label in labels:
        default = {"baseline": None if label == "baseline" else "baseline", "lossless": True}
        method = {**default, **known.get(label, {})}
        runners.append(SimpleNamespace(label=label, baseline=method["baseline"], lossless=method["lossless"]))
    return runners


def parse_range(text: str) -> range:
    """`19-39` -> range(19, 40); `7` -> range(7, 8)."""
    low, _, high = text.partition("-")
    return range(int(low), int(high or low) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the --out directory of a `specframe bench` run")
    parser.add_argument("dest", type=Path, help="where to write the cut-down run")
    parser.add_argument("--problems", type=parse_range, help="problem numbers to keep, e.g. 19-39")
    parser.add_argument("--methods", help="comma-separated method labels to keep (include baseline)")
    parser.add_argument("--keep", choices=["all", "fastest"], default="all")
    args = parser.parse_args()
    methods = args.methods.split(",") if args.methods else None
    records = write_subset(args.source, args.dest, args.problems, methods, args.keep)
    print(f"{len(records)} records written to {args.dest}")


if __name__ == "__main__":
    main()
