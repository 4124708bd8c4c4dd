"""Run the benchmark plan and render the result pages: what `make results` and `make results-render` do.

    python benchmarks/results.py                 # every run of benchmarks/plan.toml, then the pages
    python benchmarks/results.py --render-only   # the pages from the records already in results/records
    python benchmarks/results.py --runs code-cpu # only these runs (then every page)

Each run is `specframe bench ARGS --out results/records/NAME` (resumed if stopped; skipped once complete)
with a `machine.json` beside it; a run with `command = "serve-bench"` is `specframe serve-bench ARGS ...`.
A page keeps its prose; only the text between `<!-- results:begin NAME -->` and
`<!-- results:end NAME -->` is rewritten, from the records alone.
A batch table with a `plot` also draws its speedup against B into that PNG and links it from its block;
a load table with a `plot`, its throughput, TTFT and TPOT against the request rate.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "benchmarks" / "plan.toml"
RECORDS = ROOT / "results" / "records"
BATCH_RESULTS = "batch_results.json"  # what `specframe bench --batch` writes once its sweep is complete
STRUCTURED_RESULTS = "structured_results.json"  # what a structured-output run writes at its end
STEP_COSTS = "step_costs.json"  # what `specframe calibrate --out` writes
# The forward rows (a tree's nodes and its root) a `steps` table shows: the tree sizes calibrate measures
STEP_ROWS = (1, 2, 4, 8, 17, 25, 33)
LOAD_RESULTS = "load_results.json"  # what `specframe serve-bench` writes at its end
PACKAGES = ("specframe", "torch", "transformers")  # always recorded
# recorded where installed: the libraries that some runs' methods and peers decode with
OPTIONAL_PACKAGES = ("arctic-inference", "llama_cpp_python", "triton")


# ---------------------------------------------------------------- running


def machine() -> dict:
    """The machine and package versions a run is taken with."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {"python": platform.python_version()}
    versions.update({p: importlib.metadata.version(p) for p in PACKAGES})
    for package in OPTIONAL_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"machine": f"{cpu}, {os.cpu_count()} cores" + (f", {gpu}" if gpu else ""), "versions": versions}


def run_plan(plan: dict, records: Path, only: list[str] | None) -> None:
    """Run each planned `specframe bench` (or the run's `command`, e.g. `serve-bench`) into
    `records/NAME`; a GPU run is skipped without a GPU."""
    import torch

    runs = {n: r for n, r in plan["runs"].items() if not only or n in only}
    for i, (name, run) in enumerate(runs.items(), 1):
        out = records / name
        print(f"[{i}/{len(runs)}] {name}: {run['about']}", flush=True)
        if any((out / done).exists() for done in ("results.json", BATCH_RESULTS, STRUCTURED_RESULTS,
                                                   LOAD_RESULTS, STEP_COSTS)):
            print(f"    complete in {out}; delete that folder to measure it again", flush=True)
            continue
        if run.get("gpu") and not torch.cuda.is_available():
            print("    skipped: needs a CUDA GPU", flush=True)
            continue
        # from the repository root with a relative --out where it can, so that the command the records
        # keep (and the pages show) runs on any checkout
        where = out.resolve()
        shown = where.relative_to(ROOT).as_posix() if where.is_relative_to(ROOT) else str(where)
        command = ["specframe", run.get("command", "bench"), *run["args"], "--out", shown]
        print("    " + shlex.join(command), flush=True)
        env = {**os.environ, **run.get("env", {})}  # e.g. SPECFRAME_CPU_LINEAR for a step-cost run
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)  # progress: stderr
        (out / "machine.json").write_text(json.dumps(machine(), indent=1), "utf-8")


# ---------------------------------------------------------------- loading


def load_run(folder: Path) -> dict | None:
    """A bench output folder as {settings, methods, categories, records, machine}; None if absent.

    A run stopped before its tables has records.jsonl and settings.json only: its overall table is then
    computed here as `specframe bench` would, each method against the baseline of its own backend."""
    from specframe.bench.report import method_stats
    from specframe.plugging.registry import get_registry

    peers = get_registry().peers

    about = folder / "machine.json"
    extra = json.loads(about.read_text("utf-8")) if about.exists() else {}
    if (folder / "results.json").exists():
        return {**json.loads((folder / "results.json").read_text("utf-8")), "machine": extra,
                "name": folder.name}
    if not (folder / "records.jsonl").exists():
        return None
    lines = (folder / "records.jsonl").read_text("utf-8").splitlines()
    records = [json.loads(line) for line in lines if line]
    labels = list(dict.fromkeys(r["method"] for r in records))
    bases = [label for label in labels if label.startswith("baseline")]

    def llama_peer(label: str) -> bool:
        """llama.cpp's own decoding: measured against plain decoding through `llamacpp`, and not lossless
        (its logits are not the backend's bit for bit), as bench records it."""
        name = label.split("(")[0]
        return name in peers.names() and peers.get(name).baseline_backend == "llamacpp"

    def baseline_of(label: str) -> str | None:
        if label in bases:
            return None
        backend = "llamacpp" if llama_peer(label) else label.split("@")[0].rsplit("+", 1)[-1]
        return f"baseline[{backend}]" if f"baseline[{backend}]" in bases else bases[0]

    by_label = {label: [r for r in records if r["method"] == label] for label in labels}
    table = {}
    for label in labels:
        base = baseline_of(label)
        keyed = None if base is None else {(r["qid"], r["turn"], r["repeat"]): r for r in by_label[base]}
        table[label] = {**method_stats(by_label[label], keyed), "mismatches": None}
    settings = json.loads((folder / "settings.json").read_text("utf-8"))
    methods = [{"label": label, "baseline": baseline_of(label), "lossless": not llama_peer(label)}
               for label in labels]
    return {"settings": settings, "methods": methods, "categories": {"overall": table}, "records": records,
            "mismatches": None, "machine": extra, "name": folder.name}


def load_batch_run(folder: Path) -> dict | None:
    """A `specframe bench --batch` output folder as {settings, methods, batches, mismatches, machine};
    None until its sweep has written `batch_results.json` (`make results` resumes a stopped one)."""
    return load_results(folder, BATCH_RESULTS)


def load_structured_run(folder: Path) -> dict | None:
    """A structured-output run's folder (`specframe bench --suite structured`) as {header, command, rows,
    machine}; None until the run has written `structured_results.json`."""
    return load_results(folder, STRUCTURED_RESULTS)


def load_load_run(folder: Path) -> dict | None:
    """A `specframe serve-bench` output folder as {settings, streams, plain, control, command, machine};
    None until the run has written `load_results.json`."""
    return load_results(folder, LOAD_RESULTS)


def load_steps_run(folder: Path) -> dict | None:
    """A `specframe calibrate --out` folder as {settings, command, costs, machine}; None until written."""
    return load_results(folder, STEP_COSTS)


def load_results(folder: Path, results: str) -> dict | None:
    """The run's `results` file (written once its tables are complete) with the machine it ran on and
    its folder's name; None where the file is not there yet."""
    if not (folder / results).exists():
        return None
    about = folder / "machine.json"
    run = json.loads((folder / results).read_text("utf-8"))
    return {**run, "machine": json.loads(about.read_text("utf-8")) if about.exists() else {},
            "name": folder.name}


def overall(run: dict) -> dict:
    """The run's overall table ({method: stats}): a one-category run has that category's."""
    categories = run["categories"]
    return categories.get("overall") or next(iter(categories.values()))


def identical(run: dict) -> dict[str, tuple[int, int] | None]:
    """(turns compared with the baseline, mismatching turns) per method; None where not checked (sampled
    runs, and methods that do not claim to be lossless, such as llama.cpp's own decoding)."""
    if run["settings"].get("temperature"):
        return {}
    base_tokens = {}
    for r in run.get("records", []):
        if r["method"].startswith("baseline"):
            base_tokens[(r["method"], r["qid"], r["turn"], r["repeat"])] = r["tokens"]
    counts: dict[str, list[int]] = {}
    baseline = {m["label"]: m.get("baseline") for m in run["methods"] if m.get("lossless", True)}
    for r in run.get("records", []):
        base = baseline.get(r["method"])
        key = (base, r["qid"], r["turn"], r["repeat"])
        if base is None or key not in base_tokens:
            continue
        seen = counts.setdefault(r["method"], [0, 0])
        seen[0] += 1
        seen[1] += r["tokens"] != base_tokens[key]
    return {m: tuple(c) for m, c in counts.items()}


# ---------------------------------------------------------------- rendering


def per_turn_ratio(run: dict, method: str, reference: str) -> float | None:
    """Mean over turns of (tokens/s of `method`) / (tokens/s of `reference`) on the same turn."""
    ratios = turn_ratios(run, method, reference)
    return statistics.fmean(ratios) if ratios else None


def turn_ratios(run: dict, method: str, reference: str) -> list[float]:
    """(tokens/s of `method`) / (tokens/s of `reference`) on each turn both decoded."""
    ref = {(r["qid"], r["turn"], r["repeat"]): r["metrics"]["tokens_per_s"]
           for r in run.get("records", []) if r["method"] == reference}
    return [r["metrics"]["tokens_per_s"] / ref[k] for r in run.get("records", []) if r["method"] == method
            for k in [(r["qid"], r["turn"], r["repeat"])] if ref.get(k)]


def num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table: its head, the rule under it and one line per row of cells."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cells) + " |" for cells in rows)]


def no_records(label: str, head: list[str]) -> list[str]:
    """The row of a run that has no records yet: its label, then dashes under the rest of `head`."""
    return [label, "no records", *["-"] * (len(head) - 2)]


def rows_of(run: dict, patterns: list[str] | None) -> dict:
    table = overall(run)
    if not patterns:
        return table
    return {m: s for m, s in table.items() if any(fnmatch.fnmatchcase(m, p) for p in patterns)}


def provenance(run: dict, setting: str | None = None) -> list[str]:
    """The lines under a table: machine and versions, settings (`setting`, else a one-request run's),
    command."""
    s, extra = run["settings"], run.get("machine", {})
    versions = (", ".join(f"{k} {v}" for k, v in extra.get("versions", {}).items())
                or "package versions not recorded with these records")
    timing = ("fastest of the repeats" if s.get("keep") == "fastest"
              else "one timed run per turn" if s.get("repeats") == 1 else "mean over repeats")
    setting = setting or (
        f"{s.get('model')}, {s.get('suite')}, {s.get('limit') or 'all'} per category, "
        f"{s.get('max_new_tokens')} new tokens, {s.get('dtype') or 'float32'}, "
        f"{s.get('device') or 'cpu'}, {s.get('threads')} thread(s), {s.get('clock') or 'wall'} clock, "
        f"{timing}")
    command = s.get("command") or extra.get("command")
    command = portable_command(command, run.get("name")) if command else "not recorded with these records"
    return [f"Machine: {extra.get('machine', 'not recorded with these records')}; {versions}.  ",
            f"Settings: {setting}.  ", f"Command: `{command}`"]


def portable_command(command: str, name: str | None) -> str:
    """`command` as a reader runs it from the repository root: its `--out`, which bench records as given
    (the measuring machine's absolute path, or an older run's own folder), becomes the run's folder under
    `results/records`, where `make results` keeps it."""
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell line: shown as recorded
        return command
    if not name:
        return command
    folder = f"{RECORDS.relative_to(ROOT).as_posix()}/{name}"
    changed = [f"--out={folder}" if w.startswith("--out=") else folder if i and words[i - 1] == "--out" else w
               for i, w in enumerate(words)]
    return command if changed == words else shlex.join(changed)


def noise_line(run: dict, control: str | None) -> str:
    table = overall(run)
    if not control or control not in table:
        return ("Noise floor: these records have no control row (a method that decodes exactly like the "
                "baseline); read differences under about 5 % as noise.")
    spread = [c[control]["speedup"]["mean"] for c in run["categories"].values() if control in c]
    low, high = min(spread), max(spread)
    cats = f", {low:.2f}-{high:.2f}x across categories" if len(spread) > 1 else ""
    return (f"Noise floor: `{control}` decodes exactly like the baseline and measured "
            f"{table[control]['speedup']['mean']:.2f}x overall{cats}.")


def speed_table(runs: list[dict], spec: dict) -> list[str]:
    run = runs[0]
    ref = spec.get("reference")
    checked = identical(run)
    head = ["method", "speedup", *([f"vs {ref} (per turn)"] if ref else []), "tau", "tokens/s", "mean tree",
            "turns < 0.9x", "identical to plain"]
    rows = []
    for label, s in sorted(rows_of(run, spec.get("rows")).items(), key=lambda kv: -kv[1]["speedup"]["mean"]):
        same = checked.get(label)
        rows.append([f"`{label}`", num(s["speedup"]["mean"], 2, "x"),
                     *([num(per_turn_ratio(run, label, ref), 2, "x")] if ref else []), num(s["tau"]),
                     num(s["tokens_per_s"]["mean"], 1), num(s.get("mean_tree_size"), 1),
                     "-" if s.get("slow_turns") is None else f"{100 * s['slow_turns']:.0f} %",
                     "-" if same is None else f"{same[0] - same[1]} of {same[0]} turns"])
    return markdown_table(head, rows) + ["", *provenance(run), "", noise_line(run, spec.get("control"))]


SAFE = 0.97  # a preset is safe to turn on when no turn runs below this share of plain decoding


def presets_table(runs: list[dict], spec: dict) -> list[str]:
    """Whether each preset is safe to turn on: its worst turn against plain decoding, how many turns fall
    below SAFE, what drafting costs per step, and how deep its drafts are accepted (the share of steps
    accepting at least 1, 2 and 3 drafted tokens: for S4C, what each head adds)."""
    run = runs[0]
    ref, base = spec.get("reference"), "baseline"
    checked = identical(run)
    head = ["method", "speedup", *([f"vs {ref} (per turn)"] if ref else []), "worst turn",
            f"turns < {SAFE}x", "tau", "accepted >= 1 / 2 / 3", "draft ms per step", "identical to plain"]
    rows = []
    for label, s in sorted(rows_of(run, spec.get("rows")).items(), key=lambda kv: -kv[1]["speedup"]["mean"]):
        ratios = turn_ratios(run, label, base) if label != base else []
        counts = s.get("acceptance_histogram") or []
        steps = sum(counts)
        deep = (" / ".join(f"{sum(counts[k:]) / steps:.2f}" for k in (1, 2, 3))
                if steps and len(counts) > 1 else "-")
        same = checked.get(label)
        rows.append([f"`{label}`", num(s["speedup"]["mean"], 2, "x"),
                     *([num(per_turn_ratio(run, label, ref), 2, "x")] if ref else []),
                     num(min(ratios), 2, "x") if ratios else "-",
                     f"{sum(r < SAFE for r in ratios)} of {len(ratios)}" if ratios else "-",
                     num(s["tau"]), deep, num((s.get("time_per_step_ms") or {}).get("draft"), 1),
                     "-" if same is None else f"{same[0] - same[1]} of {same[0]} turns"])
    return markdown_table(head, rows) + ["", *provenance(run), "", noise_line(run, spec.get("control"))]


def categories_table(runs: list[dict], spec: dict) -> list[str]:
    run = runs[0]
    cats = [c for c in run["categories"] if c != "overall"]
    rows = [[f"`{label}`", *(num(run["categories"][c].get(label, {}).get("speedup", {}).get("mean"))
                             for c in cats)]
            for label in rows_of(run, spec.get("rows"))]
    return markdown_table(["method", *cats], rows)


def choice_table(runs: list[dict], spec: dict) -> list[str]:
    ref = spec.get("reference")
    head = ["workload", "use", "speedup over plain", f"vs {ref or '-'} (per turn)", "runner-up", "records"]
    rows = []
    for name, run in zip(spec["runs"], runs):
        if run is None:
            rows.append(no_records(spec["workloads"][name], head))
            continue
        lossless = {m["label"] for m in run["methods"]
                    if m.get("baseline") and not m["label"].startswith("hf-")}
        ranked = sorted(((s["speedup"]["mean"], m) for m, s in rows_of(run, spec.get("rows")).items()
                         if m in lossless), reverse=True)
        (best_speed, best), (second_speed, second) = ranked[0], ranked[1]
        vs = per_turn_ratio(run, best, ref) if ref and ref in overall(run) else None
        s = run["settings"]
        where = f"{s.get('suite')}, {s.get('device') or 'cpu'}, {s.get('threads')} thread(s)"
        rows.append([spec["workloads"][name], f"`{best}`", f"{best_speed:.2f}x", num(vs, 2, "x"),
                     f"`{second}` {second_speed:.2f}x", where])
    return markdown_table(head, rows)


def memory_table(runs: list[dict], spec: dict) -> list[str]:
    rows = []
    for name, run in zip(spec["runs"], runs):
        if run is None:
            continue
        table = rows_of(run, spec.get("rows"))
        base = next((s["peak_memory_bytes"] for m, s in table.items() if m.startswith("baseline")), None)
        kind = "GPU, allocated by torch" if str(run["settings"].get("device", "")).startswith("cuda") \
            else "CPU, process peak"
        for label, s in table.items():
            peak = s.get("peak_memory_bytes")
            over = None if peak is None or base is None else round((peak - base) / 2**20) or 0.0
            own = (s.get("drafter_stats") or {}).get("memory_bytes")
            rows.append([f"{name} ({kind})", f"`{label}`", num(peak and peak / 2**20, 0, " MiB"),
                         num(over, 0, " MiB"), num(own and own / 2**20, 1, " MiB")])
    return markdown_table(["records", "method", "peak memory", "over plain", "drafter's own memory"], rows)


def lossless_table(runs: list[dict], spec: dict) -> list[str]:
    head = ["records", "methods compared", "turns compared", "turns identical to plain"]
    rows = []
    for name, run in zip(spec["runs"], runs):
        if run is None:
            rows.append(no_records(name, head))
            continue
        checked = identical(run)
        turns = sum(c[0] for c in checked.values())
        same = sum(c[0] - c[1] for c in checked.values())
        rows.append([f"{name} ({run['settings'].get('suite')}, {run['settings'].get('device') or 'cpu'})",
                     str(len(checked)), str(turns), str(same)])
    return markdown_table(head, rows)


def batch_table(runs: list[dict], spec: dict) -> list[str]:
    """One row per method and batch size B of a `--batch` sweep: throughput, both speedups (plain decoding
    batched through the same backend, transformers' batched generate), tau, drafting and forward ms per
    batched step, and rows equal to plain's. Without records: the table's head and a row saying so."""
    run = runs[0]
    head = ["method", "B", "tokens/s", "x plain batched", "x hf-generate", "tau", "draft ms/step",
            "forward ms/step", "identical rows"]
    if run is None:
        return markdown_table(head, [no_records(spec["runs"][0], head)]) + [
            "", f"No records yet for {spec['runs'][0]}: run `make results`."]
    labels = [m["label"] for m in run["methods"]]
    patterns = spec.get("rows")
    if patterns:
        labels = [label for label in labels if any(fnmatch.fnmatchcase(label, p) for p in patterns)]
    rows = []
    for label in labels:
        for size, table in run["batches"].items():
            s = table.get(label)
            if s is not None:
                split = s.get("time_per_step_ms") or {}
                rows.append([f"`{label}`", size, num(s["tokens_per_s"]["mean"], 1),
                             num((s["speedup_plain"] or {}).get("mean"), 2, "x"),
                             num((s["speedup_hf"] or {}).get("mean"), 2, "x"), num(s["tau"]),
                             num(split.get("draft"), 1), num(split.get("forward"), 1), identical_rows(s)])
    return (markdown_table(head, rows) + batch_plot(run, spec, labels)
            + ["", *provenance(run, batch_setting(run)), "", batch_noise_line(run)])


def batch_plot(run: dict, spec: dict, labels: list[str]) -> list[str]:
    """With the table's `plot` (a PNG's path, written as its `page` is): speedup over plain batched
    decoding against B, one line per method of `labels`, drawn there, and the lines that show it on the
    page; without `plot`, nothing is drawn."""
    if not spec.get("plot"):
        return []
    from specframe.bench.plots import batch_speedup_plot

    path, s = ROOT / spec["plot"], run["settings"]
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {size: {m: stats for m, stats in rows.items() if m in labels}
             for size, rows in run["batches"].items()}
    batch_speedup_plot(table, path, title=f"{s.get('suite')}, {s.get('model')}")
    link = Path(os.path.relpath(path, (ROOT / spec["page"]).parent)).as_posix()
    kept = [stats for rows in table.values() for stats in rows.values()]
    if any(stats.get("speedup_plain_interval") for stats in kept):
        bars = "error bars: a speedup's 95 % bootstrap interval over its chunks, where it had two or more"
    elif any(stats["repeats"] > 1 for stats in kept):
        bars = "error bars: a speedup's standard deviation over its repeats"
    else:
        bars = "one timed call per method and B, so no error bars"
    return ["", f"![Speedup over plain batched decoding against B, per method ({spec['name']})]({link})", "",
            f"*Speedup over plain batched decoding against B (log scale), the dotted line at 1.00x; {bars}.*"]


def identical_rows(stats: dict) -> str:
    """How many of a method's rows equal plain batched decoding's, token for token ("-" for plain)."""
    if stats.get("baseline") is None:
        return "-"
    compared = stats["rows_compared"]
    return f"{compared - stats['rows_differing']} of {compared} rows"


def batch_setting(run: dict) -> str:
    """The settings line of a `--batch` sweep: its rows are every question's first turn."""
    s = run["settings"]
    chunks = s.get("chunk_prompts")  # absent from records made with one call per method over the suite
    once = "one timed call per method, B and chunk" if chunks else "one timed call per method and B"
    timing = ("fastest of the repeats" if s.get("keep") == "fastest"
              else once if s.get("repeats") == 1 else "mean over repeats")
    if chunks:
        timing = ("methods taking turns in chunks of "
                  + ", ".join(f"{n} prompts at B = {b}" for b, n in chunks.items()) + f", {timing}")
    sizes = ", ".join(str(b) for b in s.get("batches") or run["batches"])
    return (f"{s.get('model')}, {s.get('suite')}, first turns of {s.get('questions')} question(s) "
            f"({s.get('limit') or 'all'} per category), {s.get('max_new_tokens')} new tokens, B = {sizes}, "
            f"{s.get('dtype') or 'float32'}, {s.get('device') or 'cpu'}, {s.get('threads')} thread(s), "
            f"{s.get('clock') or 'wall'} clock, {timing}")


def half_width(interval: list[float] | None) -> float | None:
    """An interval's half width over its middle: [0.9, 1.1] is ±10 %."""
    return (interval[1] - interval[0]) / (interval[1] + interval[0]) if interval else None


def batch_noise_line(run: dict) -> str:
    """The widest 95 % bootstrap interval over chunks of a speedup, over plain batched and over
    hf-generate; without one (a sweep of one chunk, or records kept before chunks), the largest spread
    of a throughput over its repeats, else the usual rule of thumb."""
    widths = {key: [w for table in run["batches"].values() for s in table.values()
                    if (w := half_width(s.get(f"{key}_interval"))) is not None]
              for key in ("speedup_plain", "speedup_hf")}
    if widths["speedup_plain"] or widths["speedup_hf"]:
        chunks = max(s.get("chunks") or 0 for table in run["batches"].values() for s in table.values())
        names = {"speedup_plain": "over plain batched", "speedup_hf": "over hf-generate"}
        widest = " and ".join(f"±{100 * max(w):.1f} % {names[k]}" for k, w in widths.items() if w)
        return (f"Noise floor: a speedup's 95 % bootstrap interval over its chunks (up to {chunks} per "
                f"method and B, drawn with replacement, each paired with the other method's seconds on the "
                f"same chunk) is at widest {widest}; read differences inside it as noise.")
    spread = [s["tokens_per_s"]["std"] / s["tokens_per_s"]["mean"] for table in run["batches"].values()
              for s in table.values() if s["repeats"] > 1 and s["tokens_per_s"]["mean"]]
    if not spread:
        return ("Noise floor: one timed call per method and B, so no spread was measured; read differences "
                "under about 5 % as noise.")
    return (f"Noise floor: a throughput's standard deviation over its repeats is at most "
            f"{100 * max(spread):.0f} % of its mean.")


def structured_table(runs: list[dict], spec: dict) -> list[str]:
    """One row per method and peer of a structured-output run: valid outputs, outputs identical to
    constrained plain decoding's, tokens/s, tau and the speed over constrained plain decoding."""
    run = runs[0]
    head = ["method", "valid", "identical to constrained plain", "tokens/s", "tau", "x constrained plain"]
    if run is None:
        return markdown_table(head, [no_records(spec["runs"][0], head)]) + [
            "", f"No records yet for {spec['runs'][0]}: run `make results`."]
    rows = [[f"`{r['method']}`" + ("" if r.get("lossless", True) else " (other kernels)"),
             f"{r['valid']:.0%}", f"{r['identical']:.0%}", num(r["tokens_per_s"], 1), num(r["tau"]),
             num(r["speedup"], 2, "x")] for r in run["rows"]]
    return markdown_table(head, rows) + ["", *provenance({**run, "settings": {"command": run["command"]}},
                                                         run["header"])]


def load_table(runs: list[dict], spec: dict) -> list[str]:
    """A `specframe serve-bench` run: one row per method (or peer) and request rate, with throughput over
    plain decoding's at the same rate, TTFT and TPOT (median, p99) and texts identical to plain's
    (`specframe.serve.load_report`), the machine, settings and command, the noise line and, with the
    table's `plot`, throughput, TTFT and TPOT against the rate. Without records: the head and a row
    saying so."""
    from specframe.serve.load_report import HEAD, noise_line, results_table, settings_line

    run = runs[0]
    if run is None:
        return markdown_table(HEAD, [no_records(spec["runs"][0], HEAD)]) + [
            "", f"No records yet for {spec['runs'][0]}: run `make results`."]
    patterns = spec.get("rows")
    streams = [s for s in run["streams"] if not patterns or any(fnmatch.fnmatchcase(s["label"], p)
                                                                 for p in patterns)]
    shown = {**run, "settings": {"command": run.get("command")}}
    return (results_table(streams) + ["", *provenance(shown, settings_line(run["settings"])), "",
                                      noise_line(streams, spec.get("control") or run.get("control"))]
            + load_plot(run, spec, streams))


def load_plot(run: dict, spec: dict, streams: list[dict]) -> list[str]:
    """With the table's `plot` (a PNG's path, written as its `page` is): throughput, median TTFT and
    median TPOT against the request rate, drawn there, and the lines that show it on the page."""
    if not spec.get("plot") or not streams:
        return []
    from specframe.serve.load_report import rate_plot

    path, s = ROOT / spec["plot"], run["settings"]
    path.parent.mkdir(parents=True, exist_ok=True)
    rate_plot(streams, path, title=f"{s.get('suite')}, {s.get('model')}")
    link = Path(os.path.relpath(path, (ROOT / spec["page"]).parent)).as_posix()
    return ["", f"![Throughput, TTFT and TPOT against the request rate ({spec['name']})]({link})", "",
            "*Output tokens/s, median time to first token and median time per output token against the "
            "request rate (log scale), one line per method, peers dashed; each shaded band reaches up to "
            "the p99.*"]


def steps_table(runs: list[dict], spec: dict) -> list[str]:
    """One row per `specframe calibrate --out` run: what a verification step of 1 to 33 forward rows (a
    flat tree of 0 to 32 nodes under its root) costs, in ms and as a multiple of one row, the fastest of
    calibrate's rounds; then the machine and each row's command."""
    head = ["configuration", "measured as", *(f"{r} row{'s' if r > 1 else ''}" for r in STEP_ROWS)]
    rows, commands = [], []
    for name, run in zip(spec["runs"], runs):
        label = spec.get("labels", {}).get(name, name)
        if run is None:
            rows.append(no_records(f"`{label}`", head))
            continue
        by_rows = {c["nodes"] + 1: c["flat_ms"] for c in run["costs"]}
        one = by_rows[1]
        s = run["settings"]
        measured = f"{s['backend']}, {s['dtype']}, {s['linear']} linears, {s['attention']} attention"
        if s["backend"] != "kv":  # the backend computes it all: torch's linears and attention do not run
            measured = f"{s['backend']}"
        rows.append([f"`{label}`", measured, *(f"{by_rows[r]:.1f} ({by_rows[r] / one:.1f}x)" if r in by_rows
                                               else "-" for r in STEP_ROWS)])
        commands.append(f"`{label}`: `{portable_command(run['command'], name)}`")
    shown = next((r for r in runs if r is not None), None)
    if shown is None:
        return markdown_table(head, rows) + ["", f"No records yet for {', '.join(spec['runs'])}: run "
                                             "`make results`."]
    s, extra = shown["settings"], shown.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in extra.get("versions", {}).items())
    return markdown_table(head, rows) + [
        "", f"Machine: {extra.get('machine', 'not recorded')}; {versions}.  ",
        f"Settings: {s['model']}, {s['threads']} thread(s), {s['context']} tokens of context, process CPU "
        "time, the fastest of calibrate's rounds.  ", "Commands: " + "; ".join(commands)]


KINDS = {"speed": speed_table, "categories": categories_table, "choice": choice_table,
         "memory": memory_table, "lossless": lossless_table, "batch": batch_table, "presets": presets_table,
         "structured": structured_table, "load": load_table, "steps": steps_table}
LOADERS = {"batch": load_batch_run, "structured": load_structured_run,
           "load": load_load_run, "steps": load_steps_run}  # every other kind: `load_run`


def render_table(spec: dict, records: Path) -> list[str]:
    load = LOADERS.get(spec["kind"], load_run)
    runs = [load(records / name) for name in spec["runs"]]
    own_empty_rows = ("choice", "batch", "structured", "load", "steps")  # kinds that show absent runs
    if spec["kind"] not in own_empty_rows and all(r is None for r in runs):
        return [f"No records yet for {', '.join(spec['runs'])}: run `make results`."]
    if spec["kind"] in ("speed", "categories", "presets"):
        if runs[0] is None:
            return [f"No records yet for {spec['runs'][0]}: run `make results`."]
    return KINDS[spec["kind"]](runs, spec)


def replace_block(text: str, name: str, body: list[str]) -> str:
    begin, end = f"<!-- results:begin {name} -->", f"<!-- results:end {name} -->"
    if begin not in text or end not in text:
        raise SystemExit(f"error: the page has no '{begin}' ... '{end}' markers for table '{name}'")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + "\n".join(body) + "\n" + end + rest.split(end, 1)[1]


def render(plan: dict, records: Path) -> list[Path]:
    pages: dict[Path, str] = {}
    for spec in plan["tables"]:
        page = ROOT / spec["page"]
        text = pages.get(page) or page.read_text("utf-8")
        pages[page] = replace_block(text, spec["name"], render_table(spec, records))
        print(f"rendered {spec['name']} into {spec['page']}", flush=True)
    for page, text in pages.items():
        page.write_text(text, "utf-8")
    return list(pages)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-only", action="store_true", help="render the pages from existing records")
    parser.add_argument("--runs", help="comma list of plan runs to measure (default: all)")
    parser.add_argument("--records", type=Path, default=RECORDS, help="records folder (default: %(default)s)")
    parser.add_argument("--plan", type=Path, default=PLAN, help="benchmark plan (default: %(default)s)")
    args = parser.parse_args(argv)
    plan = tomllib.loads(args.plan.read_text("utf-8"))
    if not args.render_only:
        run_plan(plan, args.records, args.runs.split(",") if args.runs else None)
    render(plan, args.records)


if __name__ == "__main__":
    sys.exit(main())
