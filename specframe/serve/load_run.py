"""A `specframe serve-bench` run: every method and peer driven at every request rate, the records kept
under `--out` as each stream ends (so a stopped run resumes where it stopped), and the results written.

Fairness. Per rate, every server is started afresh (so a rate's figures do not depend on which rates ran
before it: a drafter that remembers answers starts empty), warmed up untimed, and each of its methods
sends the whole Poisson stream of that rate in turn, alone on the server: a method's requests never
share a batch with another method's, so each stream's throughput is that method's. Every method at a
rate meets the same arrival times and the same prompts; the order of the servers, and of the methods on
a server, is rotated by one place from one rate to the next, so that none always goes first. Each rate
takes the next questions of the suite, so a drafter that remembers earlier answers meets new ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from specframe.serve.load import (LoadRequest, arrival_times, request_body, run_stream,
                                  suite_requests)
from specframe.serve.load_report import compared, stream_stats
from specframe.support.prompt_suites import WARMUP_PROMPT
from specframe.serve.load_servers import (PEERS, Server, ServerError, model_id, running, specframe_server,
                                          url_server)
from specframe.support.progress import bar
from specframe.terms.errors import ConfigurationError, SpecframeError

RECORDS = "load_records.jsonl"
SETTINGS = "load_settings.json"
RESULTS = "load_results.json"
PLAIN = "none@1"  # plain decoding on the same server, added where no method decodes plainly
WARMUP_TOKENS = 16


@dataclass(frozen=True)
class LoadSettings:
    """What a run measures; records taken with other settings are not mixed in (see `LoadStore`)."""

    suite: str
    limit: int | None
    rates: tuple[float, ...]
    requests: int | None
    duration: float | None
    max_tokens: int
    methods: tuple[str, ...]
    peers: tuple[str, ...]
    model: str
    batch_size: int
    queue_size: int
    threads: int
    seed: int
    timeout: float
    url: str | None = None

    def count(self, rate: float) -> int:
        """Requests in a stream at `rate`: `requests`, or what `duration` seconds of arrivals hold."""
        return self.requests if self.duration is None else max(1, round(rate * self.duration))


def drafter_of(method: str) -> str:
    """The drafter's name in a method spec or preset (`none` in `none+chain@1`); for a spec the registry
    does not know, the name it starts with."""
    from specframe.bench.methods import parse_method, split_parts
    from specframe.plugging.registry import get_registry

    try:
        return parse_method(method, get_registry()).drafter.name
    except SpecframeError:
        return split_parts(method.split("@", 1)[0])[0].split("(", 1)[0].strip()


def with_plain(methods: list[str]) -> list[str]:
    """`methods` with plain decoding (`PLAIN`) added last unless one of them drafts nothing already, or
    they hold only `default` (a server whose method is not ours to choose)."""
    if methods == ["default"] or any(drafter_of(m) == "none" for m in methods):
        return methods
    return [*methods, PLAIN]


def plain_labels(methods: list[str]) -> list[str]:
    """The methods that decode plainly: the first is what others are set against, a second the control."""
    return [m for m in methods if m != "default" and drafter_of(m) == "none"]


def plan_servers(settings: LoadSettings) -> list[Server]:
    """The servers of a run: `specframe serve` with the methods (or the server at `--url`), then each
    peer."""
    methods = list(settings.methods)
    first = (url_server(settings.url, methods) if settings.url else
             specframe_server(methods, model=settings.model, batch_size=settings.batch_size,
                              queue_size=settings.queue_size, threads=settings.threads))
    peers = []
    for name in settings.peers:
        if name not in PEERS:
            raise ConfigurationError(f"unknown peer '{name}': use {', '.join(PEERS)} or none")
        peers.append(PEERS[name](model=settings.model, threads=settings.threads))
    return [first, *peers]


class LoadStore:
    """The records of a run under `out`: one JSON line per request, a stream's lines appended once it
    ends; the settings beside them, and records of other settings refused rather than mixed."""

    def __init__(self, out: Path, settings: LoadSettings, fresh: bool = False):
        self.path, self.settings = out / RECORDS, json.loads(json.dumps(asdict(settings)))  # as kept
        out.mkdir(parents=True, exist_ok=True)
        kept = out / SETTINGS
        if fresh:
            self.path.unlink(missing_ok=True)
        elif kept.exists() and self.path.exists() and json.loads(kept.read_text("utf-8")) != self.settings:
            raise ConfigurationError(f"{out} holds load records taken with other settings ({kept}): pass "
                                     "--fresh to discard them, or another --out")
        kept.write_text(json.dumps(self.settings, indent=1), "utf-8")
        lines = self.path.read_text("utf-8").splitlines() if self.path.exists() else []
        self.records = [json.loads(line) for line in lines if line.strip()]

    def done(self, label: str, rate: float) -> bool:
        return any(r["label"] == label and r["rate"] == rate for r in self.records)

    def add(self, server: Server, label: str, rate: float, records: list[dict]) -> None:
        rows = [{"label": label, "rate": rate, "server": server.name, "lossless": server.lossless, **r}
                for r in records]
        with open(self.path, "a", encoding="utf-8") as sink:
            sink.write("".join(json.dumps(r) + "\n" for r in rows))
        self.records += rows


def rotated(items: list, by: int) -> list:
    """`items` rotated left by `by` places: the order of the servers, or methods, at the `by`-th rate."""
    return items[by % len(items):] + items[:by % len(items)] if items else items


def run_load(settings: LoadSettings, out: Path, *, fresh: bool = False, startup_timeout: float = 900.0,
             progress: bool = True) -> dict:
    """Run every stream not yet recorded under `out` and return the results (`load_results`)."""
    store = LoadStore(out, settings, fresh)
    servers = plan_servers(settings)
    todo = sum(settings.count(rate) for rate in settings.rates for s in servers for m in s.methods
               if not store.done(m.label, rate))
    offset = 0
    with bar(total=todo, show=progress, desc="serve-bench", unit="request") as shown:
        for i, rate in enumerate(settings.rates):
            requests = suite_requests(settings.suite, settings.limit, settings.count(rate), offset)
            offset += len(requests)
            arrivals = arrival_times(rate, len(requests), f"{settings.seed}:{rate:g}")
            for server in rotated(servers, i):
                methods = rotated([m for m in server.methods if not store.done(m.label, rate)], i)
                if methods:
                    log = out / "logs" / f"{server.name}.log"
                    with running(server, log, startup_timeout):
                        drive(server, methods, rate, requests, arrivals, settings, store, shown, log)
    return load_results(store, settings)


def drive(server: Server, methods: list, rate: float, requests: list[LoadRequest], arrivals: list[float],
          settings: LoadSettings, store: LoadStore, shown, log: Path) -> None:
    """On a running `server` (logging to `log`): warm each of `methods` up, then send each one's stream
    in turn."""
    model = model_id(server, settings.model)
    for method in methods:
        warm_up(server, method, model, requests[0].chat, settings.timeout, log)
    for method in methods:
        shown.set_description(f"{method.label} at {rate:g} req/s")
        bodies = [request_body(r, model, settings.max_tokens, method.field) for r in requests]
        records = asyncio.run(run_stream(server.url, requests, bodies, arrivals, timeout=settings.timeout,
                                         on_done=lambda _: shown.update()))
        rows = [r.to_dict() for r in records]
        store.add(server, method.label, rate, rows)
        stats = stream_stats(rows)
        print(f"{method.label} at {rate:g} req/s: {stats['completed']} of {stats['requests']} requests, "
              f"{stats['throughput'] or 0:.1f} tokens/s, {stats['errors']} error(s)", file=sys.stderr,
              flush=True)


def warm_up(server: Server, method, model: str, chat: bool, timeout: float, log: Path | None = None) -> None:
    """One untimed request of `method` (loads, calibrates and compiles what the first request would); a
    method the server refuses stops the run here, with the server's answer."""
    request = LoadRequest(0, "warm-up", WARMUP_PROMPT, chat)
    body = request_body(request, model, WARMUP_TOKENS, method.field)
    record, = asyncio.run(run_stream(server.url, [request], [body], [0.0], timeout=timeout))
    if record.error is not None:
        where = f"; its log: {log}" if log is not None and server.command is not None else ""
        raise ServerError(f"the warm-up request of '{method.label}' on {server.name} failed: {record.error} "
                          f"(check the method with `specframe bench --list-methods`{where})")


def load_results(store: LoadStore, settings: LoadSettings) -> dict:
    """The run's results: per stream its statistics set against plain decoding's at the same rate, the
    plain and control labels, and the settings."""
    plain = plain_labels(list(settings.methods))
    order = [*settings.methods, *settings.peers]  # the rows of a rate as the command names them
    keys = sorted(dict.fromkeys((r["label"], r["rate"]) for r in store.records),
                  key=lambda k: (k[1], order.index(k[0]) if k[0] in order else len(order)))
    grouped = {k: [r for r in store.records if (r["label"], r["rate"]) == k] for k in keys}
    stats = {k: stream_stats(rows) for k, rows in grouped.items()}
    streams = []
    for (label, rate), rows in grouped.items():
        base = (plain[0], rate) if plain else None
        mine = compared(stats[label, rate], rows, stats.get(base), grouped.get(base))
        if plain and label == plain[0]:
            mine["identical"] = None  # the reference itself
        streams.append({"label": label, "rate": rate, "server": rows[0]["server"],
                        "lossless": rows[0]["lossless"], **mine})
    return {"settings": asdict(settings), "plain": plain[0] if plain else None,
            "control": plain[1] if len(plain) > 1 else None, "streams": streams}
