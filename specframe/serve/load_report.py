"""What `specframe serve-bench` reports: per stream (a method or peer at a request rate) the throughput,
time to first token (TTFT) and time per output token (TPOT), each set against plain decoding's stream at
the same rate, as a table and as a plot against the rate.

Every figure is read off request records (`specframe.serve.load.RequestRecord.to_dict`), so a page can be
rendered again from the records alone (`benchmarks/results.py`, table kind `load`).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from specframe.terms.errors import ConfigurationError


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-th percentile (0-100) of `values`, interpolated linearly between the two nearest ranks (as
    numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: list[float]) -> dict:
    """The median and 99th percentile of `values` (None for no values)."""
    return {"median": percentile(values, 50), "p99": percentile(values, 99)}


def stream_stats(records: list[dict]) -> dict:
    """The statistics of one stream's request records: output tokens per second and completed requests
    per second over the run (from the first send to the last end, errors included, so a request that
    timed out stretches it), TTFT, TPOT and latency (median, p99) over the requests that completed, mean
    tau where the server reported it, and the errors by kind."""
    done = [r for r in records if r["error"] is None]
    sent = [r["sent_s"] for r in records if r["sent_s"] is not None]
    ended = [r["end_s"] for r in records if r["end_s"] is not None]
    window = max(ended) - min(sent) if sent and ended else None
    tokens = sum(r["tokens"] for r in done)
    errors: dict[str, int] = {}
    for r in records:
        if r["error"] is not None:
            kind = r["error"].split(":", 1)[0]
            errors[kind] = errors.get(kind, 0) + 1
    return {"requests": len(records), "completed": len(done), "errors": sum(errors.values()),
            "error_kinds": errors, "duration_s": window, "tokens": tokens,
            "throughput": tokens / window if window else None,
            "request_throughput": len(done) / window if window else None,
            "ttft_s": spread([r["ttft_s"] for r in done if r["ttft_s"] is not None]),
            "tpot_s": spread([r["tpot_s"] for r in done if r["tpot_s"] is not None]),
            "latency_s": spread([r["latency_s"] for r in done if r["latency_s"] is not None]),
            "tau": mean_tau(done), "counted_tokens": any(r["tokens_from"] == "chunks" for r in done)}


def mean_tau(records: list[dict]) -> float | None:
    """Tokens per step over the requests that reported speculation: their tokens over their steps where
    every one gave its steps, else the mean of their tau; None where none reported it."""
    reported = [r["speculation"] for r in records if r.get("speculation")]
    if not reported:
        return None
    if all(s.get("steps") for s in reported):
        return sum(s["tau"] * s["steps"] for s in reported) / sum(s["steps"] for s in reported)
    taus = [s["tau"] for s in reported if s.get("tau") is not None]
    return statistics.fmean(taus) if taus else None


def compared(stats: dict, records: list[dict], plain: dict | None, plain_records: list[dict] | None) -> dict:
    """`stats` with its ratios to plain decoding's stream at the same rate (`plain`: its stats): throughput,
    median TPOT, and how many requests both completed returned identical text (None without plain)."""
    if plain is None:
        return {**stats, "x_plain": None, "tpot_x_plain": None, "identical": None}
    same = total = 0
    texts = {r["index"]: r["text"] for r in plain_records if r["error"] is None}
    for r in records:
        if r["error"] is None and r["index"] in texts:
            total += 1
            same += r["text"] == texts[r["index"]]
    mine, theirs = stats["throughput"], plain["throughput"]
    ratio = mine / theirs if mine and theirs else None
    mine, theirs = stats["tpot_s"]["median"], plain["tpot_s"]["median"]
    return {**stats, "x_plain": ratio, "tpot_x_plain": mine / theirs if mine and theirs else None,
            "identical": [same, total]}


def num(value: float | None, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


HEAD = ["rate req/s", "method", "tokens/s", "x plain", "TTFT median / p99 s", "TPOT median / p99 ms",
        "TPOT x plain", "tau", "identical to plain", "errors"]


def table_rows(streams: list[dict]) -> list[list[str]]:
    """One row per stream (its `stats` with `label`, `rate`, `lossless`), by rate then in the order given:
    the cells of `HEAD`."""
    rows = []
    for s in sorted(streams, key=lambda s: s["rate"]):
        same = s.get("identical")
        label = f"`{s['label']}`" + ("" if s.get("lossless", True) else " (other kernels)")
        rows.append([f"{s['rate']:g}", label, num(s["throughput"], 1), num(s["x_plain"], 2, suffix="x"),
                     f"{num(s['ttft_s']['median'])} / {num(s['ttft_s']['p99'])}",
                     f"{num(s['tpot_s']['median'], 0, 1000)} / {num(s['tpot_s']['p99'], 0, 1000)}",
                     num(s["tpot_x_plain"], 2, suffix="x"), num(s["tau"]),
                     "-" if same is None else f"{same[0]} of {same[1]}", errors_cell(s)])
    return rows


def errors_cell(stats: dict) -> str:
    """`0`, or the count with its kinds: `3 (HTTP 429: 2, timeout: 1)`."""
    if not stats["errors"]:
        return "0"
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(stats["error_kinds"].items()))
    return f"{stats['errors']} ({kinds})"


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table: its head, the rule under it and one line per row of cells."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cells) + " |" for cells in rows)]


def noise_line(streams: list[dict], control: str | None) -> str:
    """How far apart two figures must be to mean something: the control's distance from plain decoding
    (a second plain method, `control`), else a rule of thumb and how to measure it."""
    rows = [s for s in streams if s["label"] == control and s.get("x_plain") is not None]
    if not rows:
        return ("Noise floor: no control row (plain decoding sent a second time under another spec, e.g. "
                "`none+chain@1` beside `none@1`); read differences under about 5 % as noise.")
    ratios = [s["x_plain"] for s in rows] + [s["tpot_x_plain"] for s in rows if s["tpot_x_plain"]]
    return (f"Noise floor: `{control}` decodes exactly like plain decoding and measured "
            f"{min(ratios):.2f}-{max(ratios):.2f}x of its throughput and median TPOT across the rates; read "
            "differences inside that as noise.")


def settings_line(settings: dict) -> str:
    """The settings of a run in words, for the line under its table."""
    s = settings
    count = (f"{s['requests']} requests per rate" if s.get("duration") is None
             else f"{s['duration']:g} s of arrivals per rate")
    where = (f"the server at {s['url']}" if s.get("url") else
             f"`specframe serve` with batch size {s['batch_size']} and a queue of {s['queue_size']}")
    return (f"{s['model']}, {s['suite']} ({s.get('limit') or 'all'} per category, first turns), {count}, "
            f"Poisson arrivals at {', '.join(f'{r:g}' for r in s['rates'])} requests/s (seed {s['seed']}), "
            f"at most {s['max_tokens']} new tokens, greedy, streamed; {where}, {s['threads']} thread(s) per "
            f"server, one server at a time, each started afresh per rate; the methods and servers "
            "take the rate's stream in turn, their order rotated per rate; client-side wall clock")


def results_table(streams: list[dict]) -> list[str]:
    """The lines of the table of `streams` (a run's results, `specframe.serve.load_run.load_results`)."""
    return markdown_table(HEAD, table_rows(streams))


def results_lines(results: dict) -> list[str]:
    """The table of a run's results and its noise line (against the run's control row, if any)."""
    return results_table(results["streams"]) + ["", noise_line(results["streams"], results.get("control"))]


def failed_lossless(streams: list[dict]) -> list[str]:
    """`label at rate` of every lossless stream whose text differed from plain decoding's somewhere."""
    return [f"{s['label']} at {s['rate']:g} req/s" for s in streams
            if s.get("lossless", True) and s.get("identical") and s["identical"][0] < s["identical"][1]]


def rate_plot(streams: list[dict], path: Path, title: str = "") -> Path:
    """Three panels against the request rate: output tokens/s, median TTFT and median TPOT, one line per
    method or peer (peers dashed), the p99 as a shaded band above the median."""
    plt = pyplot()
    labels = list(dict.fromkeys(s["label"] for s in streams))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = [("throughput", None, "output tokens/s"), ("ttft_s", 1.0, "time to first token, s"),
              ("tpot_s", 1000.0, "time per output token, ms")]
    for ax, (key, scale, name) in zip(axes, panels):
        for label in labels:
            mine = sorted((s for s in streams if s["label"] == label), key=lambda s: s["rate"])
            lossless = all(s.get("lossless", True) for s in mine)
            rates = [s["rate"] for s in mine]
            style = "-" if lossless else "--"
            if scale is None:
                ax.plot(rates, [s[key] or 0.0 for s in mine], style, marker="o", label=label)
                continue
            median = [(s[key]["median"] or 0.0) * scale for s in mine]
            line, = ax.plot(rates, median, style, marker="o", label=label)
            p99 = [(s[key]["p99"] or 0.0) * scale for s in mine]
            ax.fill_between(rates, median, p99, color=line.get_color(), alpha=0.12)
        rates = sorted({s["rate"] for s in streams})
        if len(rates) > 1:
            ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("request rate, requests/s (Poisson)")
        ax.set_ylabel(name)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "serving under load")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # same numbers, same bytes
    plt.close(fig)
    return path


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (plots written without a display)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigurationError("the plot needs matplotlib: `pip install 'specframe[bench]'`, or pass "
                                 "--no-plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
