"""The `specframe` command line. Plugins add sub-commands through the `register_commands(cli)` hook, and
options of `generate` and `bench` through `register_cli_options(register)`."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from specframe.bench.cli import bench_command
from specframe.serve.cli import serve
from specframe.serve.load_cli import serve_bench_command
from specframe.kit.cli_options import (clock_option, device_option, dtype_option, model_option,
                                  phase_timing_option, set_timing, threads_option)
from specframe.terms.errors import ConfigurationError, DrafterError, SpecframeError
from specframe.contract.extensions import CliOption, applied
from specframe.terms.kinds import DEFAULT_BUDGET, DEFAULT_COMPONENTS, ComponentKind
from specframe.plugging.registry import PluginRegistry

STEP_COSTS = "step_costs.json"  # what `specframe calibrate --out` writes


def plugins() -> None:
    """Print installed plugins, their components and versions as JSON."""
    from specframe.plugging.registry import get_registry

    typer.echo(json.dumps(get_registry().describe(), indent=2))


def generate(
    prompt: str = typer.Argument(..., help="Text to continue (or the user message with --chat)."),
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    drafter: str = typer.Option(DEFAULT_COMPONENTS[ComponentKind.DRAFTER],
                                help="Drafter spec, e.g. pld or 'pld(max_ngram=4)'; 'none' = plain."),
    tree: str = typer.Option(DEFAULT_COMPONENTS[ComponentKind.TREE_BUILDER], help="Tree builder spec."),
    verifier: str = typer.Option(DEFAULT_COMPONENTS[ComponentKind.VERIFIER], help="Verifier spec."),
    backend: str = typer.Option(DEFAULT_COMPONENTS[ComponentKind.BACKEND], help="State backend spec."),
    budget: str = typer.Option(DEFAULT_BUDGET, help="Draft tree nodes per step: N (fill N every step), or "
                               "'auto' / 'auto:CAP' (keep the subtree expected to pay, up to CAP nodes). "
                               "Under auto, tau can differ between runs of one greedy prompt while the "
                               "text stays identical: the trees are chosen from this machine's measured "
                               "step costs and the acceptance learned while decoding, so they vary with "
                               "timing."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1, help="Tokens to generate at most."),
    chat: bool = typer.Option(False, help="Wrap the prompt in the model's chat template."),
    stop: Optional[list[str]] = typer.Option(None, help="Stop string (repeatable)."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    seed: Optional[int] = typer.Option(None, help="Seed of a sampled run: one text per seed at any "
                                       "--budget with --verifier sample-match; with rejection over sampled "
                                       "drafts, at a fixed --budget only (auto picks trees by timings)."),
    compare: bool = typer.Option(False, help="Also time a plain-decoding baseline and compare: "
                                 "transformers' own generate on the model, or plain decoding through the "
                                 "backend where it runs other weights (llamacpp); both sides warmed up "
                                 "first, untimed, then --repeats timed runs of each, with a progress bar on "
                                 "a terminal."),
    repeats: int = typer.Option(5, min=1, help="With --compare: timed runs of each side, alternating which "
                                "goes first, so a drift of the machine hits both; the median and range are "
                                "shown."),
    threads: Optional[int] = threads_option(),
    clock: str = clock_option(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with --stream: one per step, "
                                 "then the report)."),
    stream: bool = typer.Option(False, "--stream", help="Print the text as it is generated, step by step "
                                "(what each step's accepted tokens add), then the metrics."),
    phase_timing: bool = phase_timing_option(),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="Structured output: JSON that "
                                               "matches the JSON schema in this file (laid out as "
                                               "json.dumps writes it)."),
    regex: Optional[str] = typer.Option(None, "--regex", help="Structured output: text that matches this "
                                        "regular expression."),
    grammar: Optional[Path] = typer.Option(None, "--grammar", help="Structured output: text of the "
                                           "grammar in this file, in llguidance's Lark dialect, or GBNF "
                                           "(llama.cpp's, rules written with ::=)."),
) -> None:
    """Generate a continuation with a speculative pipeline and print it with its metrics. With
    --json-schema, --regex or --grammar the output follows the target's law masked to what they allow,
    and stays identical to constrained plain decoding (greedy); the drafter `forced` (e.g.
    --drafter 'forced(then=pld)') drafts the tokens they force."""
    from specframe.runtime.load import load_target
    from specframe.plugging.models import model_recipes
    from specframe.terms.sampling import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    pipeline = {"drafter": drafter, "tree": tree, "verifier": verifier, "backend": backend, "budget": budget}
    stop = check_generate(prompt, max_new_tokens, stop, pipeline)
    if stream and compare:
        raise ConfigurationError("--stream prints one decode as it goes, --compare times several: pick one")
    source = constraint_source(json_schema, regex, grammar, compare)
    set_timing(threads, clock, device)
    target = load_target(model, device=device, dtype=dtype, recipes=model_recipes)
    ids = encode_prompt(target, prompt, chat)
    make_decoder = decoder_factory(target, pipeline, sampling, phase_timing, constrained(target, source))
    with warnings.catch_warnings(record=True) as caught:  # e.g. a cache that could not be saved:
        if compare:  # printed after the text
            result, comparison = decode_compared(target, make_decoder, ids, chat, max_new_tokens, stop,
                                                 sampling, repeats, pipeline, phase_timing)
        elif stream:
            result, comparison = decode_streamed(make_decoder, ids, max_new_tokens, stop, as_json), {}
        else:
            result, comparison = decode_once(make_decoder, ids, max_new_tokens, stop), {}
    show_generated(generated_report(result, pipeline, comparison), as_json, text=not stream)
    for warning in caught:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def check_generate(prompt: str, max_new_tokens: int, stop: list[str] | None,
                   pipeline: dict) -> tuple[str, ...]:
    """`generate`'s input checked as the decoder checks it, but before the model loads; returns the stop
    strings as a tuple."""
    from specframe.plugging.pipeline import check_specs
    from specframe.terms.budget import parse_budget
    from specframe.terms.request import check_request_input

    stop = check_request_input(prompt, max_new_tokens, stop or (), stop_name="--stop")
    parse_budget(pipeline["budget"])
    check_specs(pipeline["drafter"], pipeline["tree"], pipeline["verifier"], pipeline["backend"])
    return stop


def constraint_source(json_schema: Path | None, regex: str | None, grammar: Path | None,
                      compare: bool = False) -> dict:
    """`constraint_for`'s keyword from --json-schema, --regex or --grammar (files read, JSON parsed), checked
    before the model loads; {} when none is given."""
    from specframe.support.untrusted import parse_json
    from specframe.terms.constraint import ConstraintError

    given = {k: v for k, v in (("--json-schema", json_schema), ("--regex", regex), ("--grammar", grammar))
             if v is not None}
    if len(given) > 1:
        raise ConstraintError(f"give one of --json-schema, --regex and --grammar, not {' and '.join(given)}")
    if given and compare:
        raise ConstraintError("--compare times transformers' unconstrained generate: leave it out with "
                              f"{next(iter(given))}")
    if regex is not None:
        return checked_source({"regex": regex})
    if json_schema is None and grammar is None:
        return {}
    option, path = next(iter(given.items()))
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConstraintError(f"{option} {path}: cannot read it ({err.strerror or err})") from None
    if grammar is not None:
        try:
            return checked_source({"grammar": data.decode()})
        except UnicodeDecodeError:
            raise ConstraintError(f"--grammar {path}: not UTF-8 text") from None
    return checked_source({"json_schema": parse_json(data, f"--json-schema {path}", "pass a JSON schema file",
                                                     ConstraintError)})


def checked_source(source: dict) -> dict:
    """`source` once llguidance found its schema, regular expression or grammar valid (no model needed)."""
    from specframe.runtime.structured import check_source

    check_source(**source)
    return source


def constrained(target, source: dict):
    """The constraint `source` names, compiled for `target`'s tokenizer (None for none)."""
    from specframe.runtime.structured import constraint_for

    return constraint_for(target, **source) if source else None


def decoder_factory(target, pipeline: dict, sampling, phase_timing: bool, constraint=None) -> Callable:
    """A function making a fresh decoder of `pipeline` on `target` (one per timed run under --compare);
    each request it decodes follows `constraint`, when given."""
    from specframe.decode.loop import SpeculativeDecoder

    def make_decoder() -> SpeculativeDecoder:
        decoder = SpeculativeDecoder.from_names(target, pipeline["drafter"], pipeline["tree"],
                                                pipeline["verifier"], pipeline["backend"],
                                                budget=pipeline["budget"], sampling=sampling,
                                                phase_timing=phase_timing)
        if constraint is not None:
            decoder.generate = functools.partial(decoder.generate, constraint=constraint)
            decoder.stream = functools.partial(decoder.stream, constraint=constraint)
        return decoder

    return make_decoder


def decode_once(make_decoder: Callable, ids: list[int], max_new_tokens: int, stop: tuple[str, ...]):
    """One decode of `ids`; where the drafter fails, the text decoded until then is printed first."""
    try:
        return make_decoder().generate(ids, max_new_tokens=max_new_tokens, stop=stop)
    except DrafterError as err:
        typer.echo(getattr(err.partial, "text", None) or "")
        raise


def decode_streamed(make_decoder: Callable, ids: list[int], max_new_tokens: int, stop: tuple[str, ...],
                    as_json: bool):
    """`generate --stream`: print each step's text as it comes (with --json, one object per step), and
    return the result. Where the drafter fails, what was printed is what was decoded."""
    for delta in make_decoder().stream(ids, max_new_tokens=max_new_tokens, stop=stop):
        if as_json:
            typer.echo(json.dumps({"text": delta.text, "token_ids": delta.token_ids}))
        else:
            typer.echo(delta.text, nl=delta.done)
            sys.stdout.flush()
        if delta.done:
            return delta.result


def decode_compared(target, make_decoder: Callable, ids: list[int], chat: bool, max_new_tokens: int,
                    stop: tuple[str, ...], sampling, repeats: int, pipeline: dict, phase_timing: bool):
    """`generate --compare`: the decode of median speed and the comparison with the plain baseline
    (`specframe.bench.compare.compare_with_baseline`)."""
    from specframe.bench.compare import baseline_for, compare_with_baseline
    from specframe.bench.runner import WARMUP_PROMPT

    warmup_ids = encode_prompt(target, WARMUP_PROMPT, chat)
    baseline = baseline_for(target, pipeline["backend"], stop, sampling, phase_timing)
    comparison = compare_with_baseline(target, make_decoder, baseline, ids, warmup_ids, max_new_tokens, stop,
                                       sampling, repeats, pipeline["drafter"])
    return comparison.pop("result"), comparison


def generated_report(result, pipeline: dict, comparison: dict) -> dict:
    """What `generate` prints: the text, its metrics, the pipeline and any comparison."""
    return {"text": result.text, "new_tokens": len(result.tokens), "finish_reason": result.finish_reason,
            **{k: v for k, v in result.metrics.to_dict().items() if k != "new_tokens"},
            "pipeline": dict(pipeline), **comparison}


def show_generated(report: dict, as_json: bool, text: bool = True) -> None:
    """Print `report` as one JSON object, or as the text and a table (`print_report`); without its text
    when `text` is False (it was streamed)."""
    if as_json:
        typer.echo(json.dumps(report if text else {k: v for k, v in report.items() if k != "text"},
                              indent=None if not text else 2))
    else:
        print_report(report, text)


def calibrate(
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    backend: str = typer.Option(DEFAULT_COMPONENTS[ComponentKind.BACKEND], help="State backend spec."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch intra-op threads to calibrate for "
                                          "(default: torch's choice; the cost is stored per thread count)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    out: Optional[Path] = typer.Option(None, help="Also write the measurement, with the settings and "
                                       f"the command, to OUT/{STEP_COSTS} (what `make results` reads)."),
) -> None:
    """Measure what one verification step costs by tree size and context length (what budget=auto
    weighs) and store it. Where it cannot be stored after measuring (a full disk, a lock held too long),
    the measurement is still printed, then an `error:` line says why, and the exit status is 2."""
    import torch

    from specframe.plugging.calibration import cost_key, cost_path, measure_cost, store_cost
    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target
    from specframe.support.paths import check_writable_dir, specframe_home
    from specframe.plugging.pipeline import assemble, check_specs

    check_specs(backend=backend)  # before the model loads
    check_writable_dir(specframe_home() / "costs", "the calibration directory",
                       "set SPECFRAME_HOME to a writable directory (calibrations are stored under it)")
    if threads is not None:
        torch.set_num_threads(threads)
    target = load_target(model, device=device, dtype=dtype, recipes=model_recipes)
    pipeline = assemble(target, backend=backend)
    key = cost_key(pipeline.backend)
    path = cost_path(key)
    build = pipeline.build_backend  # measured on backends built for measuring (None: on its own backend)
    cost = measure_cost(build or (lambda calibration: pipeline.backend), probe=build is not None)
    unstored = store_cost(path, key, cost)
    slopes = cost.flat_slope or (0.0,) * len(cost.sizes)  # none where the model's context is too short
    rows = [{"nodes": n, "flat_ms": 1000 * f, "chain_ms": 1000 * c, "flat_ratio": f / cost.flat_s[0],
             "flat_us_per_context_token": 1e6 * k}
            for n, f, c, k in zip(cost.sizes, cost.flat_s, cost.chain_s, slopes)]
    if out is not None:
        write_step_costs(out, target, backend, cost, rows)
    if as_json:
        typer.echo(json.dumps({"path": str(path), "stored": unstored is None, "context": cost.context,
                               "costs": rows, "min_rows": cost.min_rows,
                               "padding_ms": [1000 * t for t in cost.padding_s]}, indent=2))
        check_stored(path, unstored)
        return
    show_cost(target, backend, cost, rows)
    check_stored(path, unstored)
    typer.echo(f"stored in {path}")


def write_step_costs(out: Path, target, backend: str, cost, rows: list[dict]) -> None:
    """`rows` with what they were measured on, into OUT/`STEP_COSTS`: the settings (the backend, the dtype,
    the thread count and the CPU linear kernel the model runs) and the command, with the
    `SPECFRAME_CPU_LINEAR` it ran under."""
    import torch

    from specframe.bench.report import command_text
    from specframe.runtime.packed_linear import ENV, linear_kernel
    from specframe.support.atomic_dirs import write_atomically

    model = target.model
    chosen = os.environ.get(ENV, "").strip()
    settings = {"model": target.name, "backend": backend, "device": str(target.device),
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(), "linear": linear_kernel(model),
                "attention": getattr(model.config, "_attn_implementation", None), "context": cost.context}
    command = (f"{ENV}={chosen} " if chosen else "") + command_text(None)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / STEP_COSTS, json.dumps({"settings": settings, "command": command, "costs": rows},
                                                  indent=1))


def show_cost(target, backend: str, cost, rows: list[dict]) -> None:
    """The measured step cost as a table, and the padding choice if calibration made one."""
    import torch
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    where = target.device if target.device.type != "cpu" else f"{torch.get_num_threads()} thread(s)"
    console = Console()
    console.print(Text(f"step cost: {target.name} on '{backend}', {where}, "
                       f"{str(next(target.model.parameters()).dtype).removeprefix('torch.')}, "
                       f"{cost.context} tokens of context", style="bold"))  # a line, not a wrapped title
    table = Table()
    for column in ("tree nodes", "flat tree ms", "chain ms", "flat / empty", "flat: us per context token"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["nodes"]), f"{r['flat_ms']:.1f}", f"{r['chain_ms']:.1f}",
                      f"{r['flat_ratio']:.2f}", f"{r['flat_us_per_context_token']:.1f}")
    console.print(table)
    padding = padding_line(cost)
    if padding:
        typer.echo(padding)


def check_stored(path, unstored: str | None) -> None:
    """Refuse to end as a success a calibration that was measured but, for the reason `unstored`, not
    stored: budget=auto would measure again on its first use."""
    if unstored is not None:
        raise ConfigurationError(f"the calibration above was measured but could not be stored in {path}: "
                                 f"{unstored}, then run `specframe calibrate` again (until it is stored, "
                                 "budget=auto measures again on first use)")


def padding_line(cost) -> str | None:
    """What the calibration measured to choose whether the backend pads its forwards, if it did."""
    if not cost.padding_s:
        return None
    from specframe.runtime.devices import CPU_MIN_ROWS

    alone, padded = (1000 * t for t in cost.padding_s)
    choice = f"are padded to {cost.min_rows} rows" if cost.min_rows > 1 else "are not padded"
    return (f"a plain step took {alone:.1f} ms alone and {padded:.1f} ms padded to {CPU_MIN_ROWS} rows: "
            f"this backend's forwards {choice}")


def encode_prompt(target, prompt: str, chat: bool) -> list[int]:
    """Token ids of `prompt` (checked by `check_request_input`), wrapped in the model's chat template
    when `chat` is set."""
    from specframe.terms.errors import PromptError

    tokenizer = target.tokenizer
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise PromptError(f"model '{target.name}' has no chat template: drop --chat")
        from specframe.support.prompt_suites import chat_ids

        return chat_ids(tokenizer, [{"role": "user", "content": prompt}],
                        "or pass a plain prompt without --chat")
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def print_report(report: dict, text: bool = True) -> None:
    """The text (unless `text` is False), then the metrics as a table under a title line of its own (a long
    pipeline spec would wrap inside a narrow table's title), then any note on the comparison."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if text:
        console.print(report["text"], markup=False, highlight=False)
    parts = [str(v) for k, v in report["pipeline"].items() if k != "budget"]
    console.print(Text("specframe " + "+".join(parts), style="bold"))
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    repeated = "repeats" in report  # --compare: the run of median speed, with the range over repeats
    speed = f"{report['tokens_per_s']:.1f}"
    rows = [("new tokens", report["new_tokens"]), ("steps", report["steps"]), ("tau", f"{report['tau']:.2f}"),
            ("alpha", f"{report['alpha']:.2f}"),
            (f"tokens/s (median of {report['repeats']})", speed + span(report["tokens_per_s_range"], ".1f"))
            if repeated else ("tokens/s", speed),
            ("wall s", f"{report['wall_s']:.2f}")]
    rows += [(f"ms/step {k}", f"{v:.2f}") for k, v in report["time_per_step_ms"].items()]
    if report.get("fallback_steps"):  # a verifier using draft probabilities fell back on some steps
        reasons = ", ".join(f"{reason}: {n}" for reason, n in report["fallbacks"].items())
        rows.append(("verified by", f"sample-and-match on {report['fallback_steps']} of {report['steps']} "
                     f"steps ({reasons}), {report['pipeline']['verifier']} on the rest"))
    if repeated:
        base = f"{report['baseline_tokens_per_s']:.1f}" + span(report["baseline_tokens_per_s_range"], ".1f")
        rows += [("baseline", report["baseline"]),
                 (f"baseline tokens/s (median of {report['repeats']})", base),
                 ("speedup (median)",
                  f"{report['speedup']:.2f}x" + span(report["speedup_range"], ".2f", "x")),
                 ("noise (baseline's spread)", f"±{100 * report['noise']:.0f} %" if report["repeats"] > 1
                  else "not measured (one repeat)"),
                 ("clock", f"{report['clock']}, {report['threads']} thread(s)"),
                 ("identical", str(report["identical"]) if "identical" in report else "n/a (sampled)")]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    if report.get("note"):
        console.print(Text("note: " + report["note"], style="yellow"))


def span(values: list[float], spec: str, unit: str = "") -> str:
    """' (range a-b)' for a [min, max] pair."""
    low, high = values
    return f" (range {low:{spec}}{unit}-{high:{spec}}{unit})"


def show_version(value: bool) -> None:
    """`--version`: print the package's version and exit."""
    if value:
        from specframe import __version__

        typer.echo(f"specframe {__version__}")
        raise typer.Exit()


def top_level(version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                           help="Print specframe's version and exit.")) -> None:
    """specframe: try, combine and compare speculative decoding methods."""


def core_app(options: list[CliOption] = ()) -> typer.Typer:
    """The `specframe` app with the core commands, `generate` and `bench` taking the plugin `options`."""
    cli = typer.Typer(help="specframe: try, combine and compare speculative decoding methods.",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    cli.callback()(top_level)
    cli.command()(plugins)
    cli.command()(calibrate)
    cli.command()(serve)
    cli.command("serve-bench")(serve_bench_command)
    for name, command in {"generate": generate, "bench": bench_command}.items():
        cli.command(name)(with_plugin_options(command, [o for o in options if name in o.commands]))
    return cli


def build_app(registry: PluginRegistry | None = None) -> typer.Typer:
    """The `specframe` app with every plugin's options and sub-commands. A plugin that fails to load, whose
    hook raises or whose option clashes with a core one is left out and listed by `specframe plugins`;
    the rest of the CLI works."""
    from specframe.plugging.registry import get_registry

    registry = registry or get_registry()
    options = []
    for flag, option in registry.cli_options.items():
        clash = option_clash(option)
        if clash:
            owner = registry.cli_options.owner(flag)
            registry.failures[owner] = "; ".join(filter(None, [registry.failures.get(owner), clash]))
        else:
            options.append(option)
    cli = core_app(options)
    registry.call_each("register_commands", cli=cli)
    return cli


def with_plugin_options(command: Callable, options: list[CliOption]) -> Callable:
    """`command` with `options` added to the signature typer reads; their values are applied while it runs
    (exported environment variables, or component options: see `specframe.contract.extensions.applied`)."""
    if not options:
        return command
    signature = inspect.signature(command, eval_str=True)
    added = [inspect.Parameter(o.dest, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[o.type],
                               default=typer.Option(o.default, o.flag, help=o.help)) for o in options]

    @functools.wraps(command)
    def run(**kwargs):
        values = {o: kwargs.pop(o.dest) for o in options}
        with applied(values):
            return command(**kwargs)

    run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *added])
    run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
    return run


def option_clash(option: CliOption) -> str | None:
    """Why `option` cannot be added to its commands (one has an option of that name already), or None."""
    commands = {"generate": generate, "bench": bench_command}
    for name in option.commands:
        for param in inspect.signature(commands[name]).parameters.values():
            declared = getattr(param.default, "param_decls", None) or ()  # typer.Option(..., "--json")
            flags = {"--" + param.name.replace("_", "-"), *declared}
            if option.dest == param.name or option.flag in flags:
                return (f"option {option.flag} left out: `specframe {name}` has {', '.join(sorted(flags))} "
                        "already")
    return None


def main() -> None:
    """Run the CLI and exit with its code: 0, 2 for a usage or specframe error, the code of a command's
    `typer.Exit` (bench: 3 on a lossless mismatch), 130 when interrupted (Ctrl-C)."""
    for stream in (sys.stdout, sys.stderr):  # text read from files may hold lone surrogates: print escapes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = build_app()(standalone_mode=False)  # returns the code of typer.Exit instead of exiting
    except SpecframeError as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        raise SystemExit(2) from None
    except typer.Abort:
        code = INTERRUPTED
    except typer.TyperException as err:  # usage errors (typer's own click exceptions)
        err.show()
        raise SystemExit(err.exit_code) from None
    if code == INTERRUPTED:  # typer turns Ctrl-C into this code
        typer.secho("interrupted", fg="red", err=True)
    raise SystemExit(code if isinstance(code, int) else 0)


INTERRUPTED = 130  # 128 + SIGINT, as shells report it
app = core_app()  # the core commands alone; `main` runs `build_app()`, which adds the plugins'


if __name__ == "__main__":
    main()
