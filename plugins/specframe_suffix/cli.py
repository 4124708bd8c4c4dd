"""`specframe cache info|clear`: describe and delete the `suffix` drafter's persisted response caches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Inspect and clear the suffix drafter's response caches.", no_args_is_help=True)


def describe(path: Path, memory: bool = False) -> dict:
    """A cache file's responses, tokens, size and tokenizer; with `memory`, the library's estimate of the
    suffix tree built from it (needs arctic-inference)."""
    from specframe_suffix.store import read_cache

    stored = read_cache(path)
    report = {"path": str(path), "name": path.stem, "responses": len(stored.responses),
              "tokens": stored.tokens, "bytes_on_disk": path.stat().st_size,
              "tokenizer": stored.identity.to_json()}
    if memory:
        from specframe_suffix.drafter import import_library

        cache_class, _ = import_library()
        cache = cache_class(max_cached_requests=-1)
        for i, response in enumerate(stored.responses):
            cache.start_request(i, [])
            cache.add_active_response(i, response)
            cache.stop_request(i)
        report["tree_memory_bytes"] = int(cache._global_tree.estimate_memory())
    return report


@app.command()
def info(
    cache: Optional[str] = typer.Argument(None, help="Cache name or file (default: every named cache)."),
    memory: bool = typer.Option(False, help="Also build the suffix tree and report its memory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print a cache's responses, tokens, file size and tokenizer, or those of every named cache."""
    from specframe.kit.files import printable
    from specframe_suffix.store import cache_home, missing_cache, resolve_cache

    if cache is not None:
        path = resolve_cache(cache)
        if not path.is_file():
            raise missing_cache(cache, path)
        reports = [describe(path, memory)]
    else:
        reports = []
        for path in sorted(cache_home().glob("*.json")):
            try:
                reports.append(describe(path, memory))
            except Exception as err:  # one damaged cache must not hide the others
                reports.append({"path": str(path), "name": path.stem, "error": str(err)})
    if as_json:
        typer.echo(json.dumps(reports if cache is None else reports[0], indent=2))
        return
    if not reports:
        typer.echo(f"no suffix caches in {cache_home()}")
    for report in reports:  # a tokenizer name from a cache may hold a lone surrogate: printed escaped
        if "error" in report:
            typer.echo(printable(f"{report['name']}: unreadable: {report['error']}"))
            continue
        line = (f"{report['name']}: {report['responses']:,} responses, {report['tokens']:,} tokens, "
                f"{report['bytes_on_disk'] / 1024:,.1f} KiB, tokenizer {report['tokenizer']['name']}")
        if "tree_memory_bytes" in report:
            line += f", tree {report['tree_memory_bytes'] / 2**20:,.2f} MiB"
        typer.echo(printable(f"{line} ({report['path']})"))


@app.command()
def clear(
    cache: Optional[str] = typer.Argument(None, help="Cache name or file to delete."),
    all_caches: bool = typer.Option(False, "--all", help="Delete every named cache."),
) -> None:
    """Delete a cache (damaged ones included), or every named cache with --all. Only files that start
    with the exact header of a suffix cache are deleted: any other file is refused, or with --all left in
    place and named."""
    from specframe_suffix.store import (SuffixCacheError, cache_home, is_cache_file, missing_cache,
                                        resolve_cache)

    if (cache is None) == (not all_caches):
        raise typer.BadParameter("give a cache NAME or PATH, or --all (not both)")
    kept = []
    if all_caches:
        named = sorted(cache_home().glob("*.json"))
        kept = [path for path in named if not is_cache_file(path)]
        files = [path for path in named if path not in kept] + sorted(cache_home().glob("*.json.*.tmp"))
    else:
        path = resolve_cache(cache)
        if not path.is_file():
            raise missing_cache(cache, path)
        if not is_cache_file(path):
            raise SuffixCacheError(
                f"{path} is not a suffix cache: it does not start with the header specframe writes "
                "({\"format\":N,\"tokenizer\":{...},\"responses\":[...), so `specframe cache clear` will "
                "not delete it; delete it yourself if you mean to")
        files = [path]
    for path in files:
        path.unlink(missing_ok=True)
    typer.echo(f"deleted {len(files)} cache file{'s' if len(files) != 1 else ''}"
               + (f" from {cache_home()}" if all_caches else f": {files[0]}"))
    if kept:
        typer.echo(f"left alone, not suffix caches: {', '.join(p.name for p in kept)}")
