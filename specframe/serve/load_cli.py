"""`specframe serve-bench`: the load benchmark of `specframe serve` over HTTP (added to the CLI app in
`specframe.cli`). The run itself is `specframe.serve.load_run.run_load`; this module checks the options
before any server starts and writes the results under `--out`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from specframe.kit.cli_options import model_option
from specframe.terms.errors import ConfigurationError

PAGE = "load_results.md"
PLOT = "load_rate.png"


def serve_bench_command(
    methods: str = typer.Option("suffix@auto", help="Comma list of presets or pipeline specs, as `specframe "
                                "bench --methods` takes. `specframe serve` starts with the first; the others "
                                "are sent per request (the `method` field) to the same server. Plain "
                                "decoding (none@1) is added unless a method drafts nothing. With --url: "
                                "`default` sends no method field."),
    rates: str = typer.Option("0.1,0.2,0.5", help="Comma list of request rates, requests/s (Poisson)."),
    suite: str = typer.Option("spec-bench", help="humaneval, spec-bench, mt-bench or a JSONL file; first "
                              "turns, chat prompts to /v1/chat/completions, raw ones to /v1/completions."),
    limit: int | None = typer.Option(None, help="Questions per category (default: all)."),
    requests: int | None = typer.Option(None, min=1, help="Requests per method and rate (default 16)."),
    duration: float | None = typer.Option(None, help="Instead of --requests: seconds of arrivals per "
                                          "method and rate (rate x duration requests)."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="max_tokens of every request."),
    # "\\[" keeps rich from reading "[serve,llamacpp]" as markup and dropping it
    peers: str = typer.Option("none", help="none, or llamacpp-server: llama.cpp's own OpenAI server on the "
                              "same GGUF, one thread, driven the same way (needs "
                              "specframe\\[serve,llamacpp])."),
    model: str = model_option(),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="specframe serve's --batch-size."),
    queue_size: int = typer.Option(64, "--queue-size", min=1, help="specframe serve's --queue-size."),
    threads: int = typer.Option(1, min=1, help="Threads of each server (torch's, llama.cpp's)."),
    seed: int = typer.Option(0, help="Seed of the arrival times: the same seed, the same arrivals."),
    timeout: float = typer.Option(600.0, help="Seconds a request may take before it counts as an error."),
    startup_timeout: float = typer.Option(900.0, "--startup-timeout", help="Seconds a server may take to "
                                          "answer once started (model load and conversion)."),
    url: str | None = typer.Option(None, help="Drive the server running at this URL instead of starting "
                                   "one (e.g. http://127.0.0.1:8000)."),
    out: Path = typer.Option(Path("results/load"), help="Directory for load_records.jsonl (resumed when "
                             "run again), load_results.json, load_results.md, load_rate.png, server logs."),
    plots: bool = typer.Option(True, help="Write load_rate.png (needs matplotlib)."),
    fresh: bool = typer.Option(False, help="Discard earlier records in --out instead of resuming."),
) -> None:
    """Drive `specframe serve` over HTTP with requests arriving as a Poisson process at each rate, streamed:
    throughput, time to first token and time per output token (median, p99) per method and rate, against
    plain decoding on the same server and, as peers, other servers on the same machine. Starts and stops
    the servers itself, one at a time; exits 3 if a method's greedy text differs from plain decoding's."""
    from specframe.serve.load_run import LoadSettings, run_load

    settings = LoadSettings(suite, limit, parse_rates(rates), requests_per_rate(requests, duration), duration,
                            max_tokens, tuple(checked_methods(methods, url)), tuple(split(peers, "none")),
                            model, batch_size, queue_size, threads, seed, timeout, url)
    check_suite(settings)
    results = run_load(settings, out, fresh=fresh, startup_timeout=startup_timeout)
    write_results(results, out, plots, command_line())


def split(text: str, empty: str = "") -> list[str]:
    """A comma list (parentheses kept whole: `pld(matches=3)`), `empty` meaning none."""
    from specframe.bench.methods import split_parts

    parts = [p.strip() for p in split_parts(text, ",") if p.strip()]
    return [] if parts == [empty] else parts


def parse_rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(r) for r in split(text))
    except ValueError:
        rates = ()
    if not rates or any(not r > 0 for r in rates) or len(set(rates)) < len(rates):
        raise ConfigurationError(f"--rates must be distinct request rates above 0, in requests/s, comma "
                                 f"separated (e.g. 0.1,0.2,0.5), got {text!r}")
    return rates


def requests_per_rate(requests: int | None, duration: float | None) -> int | None:
    """--requests, or None under --duration; 16 when neither is given."""
    if requests is not None and duration is not None:
        raise ConfigurationError("give --requests or --duration, not both")
    if duration is not None and not duration > 0:
        raise ConfigurationError(f"--duration must be above 0 seconds, got {duration:g}")
    return None if duration is not None else requests or 16


def checked_methods(text: str, url: str | None) -> list[str]:
    """--methods as specs the registry knows (`default` kept with --url), plain decoding added."""
    from specframe.bench.methods import parse_method
    from specframe.plugging.registry import get_registry
    from specframe.serve.load_run import with_plain

    methods = split(text)
    if not methods:
        raise ConfigurationError("--methods is empty: name at least one method, e.g. suffix@auto")
    if len(set(methods)) < len(methods):
        raise ConfigurationError(f"--methods names a method twice: {text}")
    for method in methods:
        if method == "default" and url is None:
            raise ConfigurationError("--methods default (no method field) goes with --url only")
        if method != "default":
            parse_method(method, get_registry())
    return with_plain(methods)


def check_suite(settings) -> None:
    """The suite read once before any server starts, so that a bad one fails at once; a note where it
    holds fewer questions than a method sends over all rates (they then repeat)."""
    from specframe.support.prompt_suites import load_suite

    held = len(load_suite(settings.suite, settings.limit))
    needed = sum(settings.count(rate) for rate in settings.rates)
    if held < needed:
        typer.secho(f"note: --suite {settings.suite} holds {held} question(s) here and each method sends "
                    f"{needed} requests over the rates, so questions repeat: a drafter that remembers "
                    "answers (suffix) meets some it has answered; raise --limit or lower --requests",
                    fg="yellow", err=True)


def command_line() -> str:
    """This process's command line, as a results page shows it."""
    return "specframe " + shlex.join(sys.argv[1:])


def write_results(results: dict, out: Path, plots: bool, command: str) -> None:
    """load_results.json, load_results.md (printed) and load_rate.png under `out`; exit 3 when a lossless
    method's text differed from plain decoding's."""
    from specframe.serve.load_report import failed_lossless, rate_plot, results_lines, settings_line

    results = {**results, "command": command}
    (out / "load_results.json").write_text(json.dumps(results, indent=1), "utf-8")
    lines = [f"## Load: {results['settings']['suite']} on {results['settings']['model']}", "",
             *results_lines(results), "", f"Settings: {settings_line(results['settings'])}.  ",
             f"Command: `{command}`"]
    (out / PAGE).write_text("\n".join(lines) + "\n", "utf-8")
    if plots and results["streams"]:
        rate_plot(results["streams"], out / PLOT, f"{results['settings']['suite']}, "
                  f"{results['settings']['model']}")
    typer.echo("\n".join(lines))
    typer.echo(f"written under {out}: load_records.jsonl, load_results.json, {PAGE}"
               + (f", {PLOT}" if plots else ""))
    failed = failed_lossless(results["streams"])
    if failed:
        typer.secho(f"LOSSLESS MISMATCH: greedy text differs from plain decoding's for {', '.join(failed)}",
                    fg="red", err=True)
        raise typer.Exit(3)
