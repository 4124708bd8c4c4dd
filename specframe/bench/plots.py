"""PNG plots of a benchmark summary: speedup by category and method, acceptance histogram, time split.

matplotlib is an optional dependency (`pip install 'specframe[bench]'`); it is imported only here, with
the non-interactive Agg backend so plots can be written on machines without a display.
"""

from __future__ import annotations

from pathlib import Path

from specframe.terms.errors import ConfigurationError
from specframe.terms.metrics import PHASES

from specframe.bench.report import OVERALL


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigurationError("plots need matplotlib: `pip install 'specframe[bench]'`, "
                                 "or pass --no-plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(table: dict, out: Path, title: str = "") -> list[Path]:
    """Write the three plots of `table` (from `report.summarize`) into `out`; return their paths."""
    plt = _pyplot()
    paths = [speedup_plot(plt, table, out / "speedup.png", title),
             histogram_plot(plt, table, out / "acceptance_histogram.png", title),
             time_split_plot(plt, table, out / "time_split.png", title)]
    plt.close("all")
    return paths


def _grouped(count: int) -> tuple[float, list[float]]:
    """The width of each bar in a group of `count` side by side, and each bar's offset from the group's
    centre: a group spans 0.8 of the gap between groups."""
    width = 0.8 / max(1, count)
    return width, [(i - (count - 1) / 2) * width for i in range(count)]


def _save(fig, path: Path) -> Path:
    """Lay `fig` out, write it to `path` as a PNG and return `path`. No software version in the metadata:
    the same numbers give the same bytes, so a plot committed beside a results page changes only with them."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path


def speedup_plot(plt, table: dict, path: Path, title: str) -> Path:
    """Grouped bars: one group per category, one bar per method (baselines left out), std as error bars."""
    categories = list(table)
    methods = [m for m in dict.fromkeys(m for rows in table.values() for m in rows)
               if not m.startswith("baseline")]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 3 + 0.2 * len(categories) * max(1, len(methods)))), 5))
    width, offsets = _grouped(len(methods))
    for method, offset in zip(methods, offsets):
        xs = [c + offset for c in range(len(categories))]
        stats = [table[c].get(method) for c in categories]
        means = [s["speedup"]["mean"] if s else 0.0 for s in stats]
        errs = [s["speedup"]["std"] if s else 0.0 for s in stats]
        ax.bar(xs, means, width, yerr=errs, label=method, capsize=2)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain decoding (prefill included)")
    ax.set_title(title or "speedup by category")
    ax.legend(fontsize=8)
    return _save(fig, path)


def histogram_plot(plt, table: dict, path: Path, title: str) -> Path:
    """Share of steps that accepted exactly j draft tokens, per method, over all categories."""
    rows = table.get(OVERALL) or next(iter(table.values()))
    methods = {m: s["acceptance_histogram"] for m, s in rows.items()
               if len(s["acceptance_histogram"]) > 1}  # methods that ever accepted a draft token
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((len(h) for h in methods.values()), default=1)
    width, offsets = _grouped(len(methods))
    for (method, hist), offset in zip(methods.items(), offsets):
        total = sum(hist)
        xs = [j + offset for j in range(len(hist))]
        ax.bar(xs, [h / total for h in hist], width, label=method)
    ax.set_xticks(range(top))
    ax.set_xlabel("draft tokens accepted in a step")
    ax.set_ylabel("share of steps")
    ax.set_title(title or "acceptance-length histogram")
    if methods:
        ax.legend(fontsize=8)
    return _save(fig, path)


def time_split_plot(plt, table: dict, path: Path, title: str) -> Path:
    """Stacked horizontal bars: milliseconds per step in each phase, for the specframe pipelines."""
    rows = table.get(OVERALL) or next(iter(table.values()))
    methods = {m: s["time_per_step_ms"] for m, s in rows.items() if s["time_per_step_ms"]}
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.45 * max(1, len(methods))))
    labels = list(methods)
    left = [0.0] * len(labels)
    for phase in PHASES:
        widths = [methods[m].get(phase, 0.0) for m in labels]
        ax.barh(labels, widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per verification step")
    ax.set_title(title or "time per step by phase")
    ax.legend(fontsize=8, ncol=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    return _save(fig, path)


def batch_speedup_plot(table: dict, path: Path, title: str = "") -> Path:
    """Speedup over plain batched decoding against the batch size B (`specframe.bench.batch_report`
    table, or the `batches` of its `batch_results.json`, keyed by B as text): one line per method, the
    `hf-generate` peer included, baselines left out (they are the 1.0 line). Error bars: the speedup's
    95 % bootstrap interval over chunks where the table has one, else its std over repeats."""
    plt = _pyplot()
    sizes = list(table)
    labels = [m for m in dict.fromkeys(m for rows in table.values() for m in rows)
              if any(rows.get(m, {}).get("baseline") for rows in table.values())]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, label in enumerate(labels):
        points = [(int(b), table[b][label]) for b in sizes
                  if label in table[b] and table[b][label]["speedup_plain"]]
        means = [s["speedup_plain"]["mean"] for _, s in points]
        low, high = zip(*(_error(s) for _, s in points)) if points else ((), ())
        dodge = 2 ** (0.03 * (i - (len(labels) - 1) / 2))  # the methods' error bars side by side at each B
        ax.errorbar([b * dodge for b, _ in points], means, yerr=[low, high], marker="o", capsize=2,
                    label=label, linestyle="--" if label.startswith("hf-") else "-")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    xs = [int(b) for b in sizes]
    if len(xs) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(b) for b in xs])
    ax.minorticks_off()
    ax.set_xlabel("batch size B (rows decoded together)")
    ax.set_ylabel("speedup over plain batched decoding")
    ax.set_title(title or "speedup by batch size")
    if labels:
        ax.legend(fontsize=8)
    path = _save(fig, path)
    plt.close(fig)
    return path


def _error(stats: dict) -> tuple[float, float]:
    """How far a speedup's error bar reaches below and above its mean: to the ends of its bootstrap
    interval over chunks, else one std over repeats."""
    mean, interval = stats["speedup_plain"]["mean"], stats.get("speedup_plain_interval")
    if interval:
        return max(0.0, mean - interval[0]), max(0.0, interval[1] - mean)
    return stats["speedup_plain"]["std"], stats["speedup_plain"]["std"]
