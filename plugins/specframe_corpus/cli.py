"""`specframe datastore build|info`: build a REST datastore from sources, and describe one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from specframe.kit.cli_options import device_option, dtype_option, model_option
from specframe_corpus.answers import ANSWER_BATCH

app = typer.Typer(help="Build and inspect REST retrieval datastores.", no_args_is_help=True)


@app.command()
def build(
    source: list[str] = typer.Option(
        ...,
        help="A directory, a JSONL or text file, python-stdlib, python-site, model:PROMPTS.jsonl (the "
        "target's answers to your prompts), model:self (to prompts it writes itself), "
        "model-continue:PROMPTS.jsonl (its raw continuations) or model-continue:python-stubs (its bodies "
        "for standard-library function stubs) (repeatable).",
    ),
    out: str = typer.Option(
        ..., help="Datastore directory to create (a bare name goes under $SPECFRAME_HOME/datastores)."
    ),
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    glob: str = typer.Option("**/*", help="Files to take from a directory source."),
    field: Optional[str] = typer.Option(None, help="JSONL field holding the text or the chat turns."),
    append: bool = typer.Option(
        False, help="Add the sources to an existing datastore (no re-tokenizing); to a sharded one, as new "
        "shards (--shards of them, default 1)."
    ),
    overwrite: bool = typer.Option(False, help="Replace an existing datastore."),
    answer_tokens: int = typer.Option(256, min=1, help="model: sources: new tokens per answer."),
    batch_size: int = typer.Option(ANSWER_BATCH, min=1, help="model: sources: prompts per generation batch."),
    self_prompts: int = typer.Option(2000, min=1, help="model:self: how many prompts the target writes; "
                                      "model-continue:python-stubs: how many stubs it continues."),
    shards: Optional[int] = typer.Option(
        None, help="Split the corpus into N shards of whole documents, each an ordinary datastore, under "
        "one manifest; the drafter searches them as one store."
    ),
    ray: Optional[str] = typer.Option(
        None, help="Build the shards in parallel as Ray tasks: 'local' starts Ray on this machine, else "
        "the ADDRESS of a Ray cluster (needs `pip install 'specframe[ray]'`)."
    ),
    ray_cpus: Optional[int] = typer.Option(None, help="--ray local: CPUs Ray may use (default: all)."),
) -> None:
    """Tokenize SOURCEs with MODEL's tokenizer and index them into a datastore at OUT."""
    from specframe import load_target
    from specframe_corpus.build import build_datastore
    from specframe_corpus.source_specs import parse_source

    sources = [parse_source(s, glob, field, max_new_tokens=answer_tokens, batch_size=batch_size,
                            self_prompts=self_prompts) for s in source]
    destination, sharded = checked_destination(out, append=append, shards=shards, ray=ray, ray_cpus=ray_cpus)
    target = load_target(model, device=device, dtype=dtype)  # model: sources generate with it
    if sharded:
        from specframe_corpus.distributed import build_sharded_datastore

        manifest = build_sharded_datastore(destination, sources, target, shards=shards or 1, ray=ray,
                                           ray_cpus=ray_cpus, append=append, overwrite=overwrite)
        typer.echo(sharded_summary(destination, manifest))
    else:
        header = build_datastore(destination, sources, target, append=append, overwrite=overwrite)
        typer.echo(build_summary(destination, header))


def checked_destination(out: str, *, append: bool, shards: int | None, ray: str | None,
                        ray_cpus: int | None) -> tuple[str, bool]:
    """Where `datastore build` writes (a bare name goes under the datastore home) and whether it builds
    shards; the Ray options and the directory checked before the model loads."""
    from specframe.kit.files import check_writable_dir
    from specframe_corpus.shards import is_sharded
    from specframe_corpus.stores import datastore_home

    destination = out if ("/" in out or out.startswith(".")) else str(datastore_home() / out)
    sharded = shards is not None or (append and is_sharded(destination))
    if ray is not None and not sharded:
        raise typer.BadParameter("--ray builds shards: add --shards N", param_hint="--ray")
    if ray_cpus is not None:
        from specframe_corpus.distributed import check_ray_options

        check_ray_options(ray, ray_cpus)
    check_writable_dir(Path(destination).parent, "the directory of --out", "pass an --out in a writable one")
    return destination, sharded


def sharded_summary(destination: str, manifest: dict) -> str:
    """The line `datastore build` prints for a sharded datastore: its size and this build's speed."""
    stats = manifest["builds"][-1]
    return (f"built {destination}: {manifest['n_tokens']:,} tokens in {manifest['n_documents']:,} documents, "
            f"{len(manifest['shards'])} shards ({len(stats['shards'])} new, {stats['executor']}), "
            f"{stats['seconds']:.1f} s ({stats['tokens_per_second']:,} tokens/s)")


def build_summary(destination: str, header: dict) -> str:
    """The line `datastore build` prints for a single datastore: its size, speed and peak memory."""
    stats = header["build"]
    return (f"built {destination}: {header['n_tokens']:,} tokens in {header['n_documents']:,} documents, "
            f"{stats['seconds']:.1f} s ({stats['tokens_per_second'] or 0:,} tokens/s tokenizing, "
            f"{stats['index_seconds']:.1f} s indexing), peak memory "
            f"{stats['peak_memory_bytes'] / 2**20:,.0f} MiB")


@app.command()
def info(
    path: str = typer.Argument(..., help="Datastore directory or name."),
    verify: bool = typer.Option(False, help="Also check every file against its recorded digest."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print a datastore's header, sizes and load time."""
    from specframe.kit.files import printable
    from specframe_corpus.stores import resolve_datastore
    from specframe_corpus.shards import open_store

    start = time.perf_counter()
    store = open_store(resolve_datastore(path))
    load_s = time.perf_counter() - start
    if verify:
        store.verify()
    report = {**store.describe(), "load_seconds": round(load_s, 4), "verified": verify}
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    tok = report["tokenizer"]
    lines = [
        ("path", report["path"]),
        ("format", f"{report['format']} v{report['format_version']}"),
        ("tokenizer", f"{tok['name']} (vocab {tok['vocab_size']}, {tok['fingerprint'][:23]})"),
        ("tokens", f"{report['n_tokens']:,} ({report['token_dtype']})"),
        ("documents", f"{report['n_documents']:,}"),
        (
            "on disk",
            f"{report['bytes_on_disk'] / 2**20:,.1f} MiB, {report['bytes_per_token']:.2f} bytes/token",
        ),
        ("built", f"{report.get('built_at')} in {report.get('build', {}).get('seconds')} s"),
        *([("shards", f"{len(report['shards'])} (sharded store)")] if "shards" in report else []),
        ("load", f"{load_s * 1e3:.1f} ms"),
        ("verified", "yes" if verify else "no (--verify)"),
    ]
    lines += [
        (f"source {i}", f"{s['source']} [{s['kind']}]: {s['documents']:,} documents, {s['tokens']:,} tokens")
        for i, s in enumerate(report["sources"], 1)
    ]
    width = max(len(name) for name, _ in lines)
    for name, value in lines:  # a name or source from the header may hold a lone surrogate: escaped
        typer.echo(printable(f"{name:<{width}}  {value}"))
