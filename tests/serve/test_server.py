"""`specframe serve` over real HTTP on the loopback: answers, streaming, per-request methods and faults.

Every answer is checked against plain greedy decoding of the same prompt, streamed against whole, and
each fault of the issue's table is provoked: malformed bodies, unknown models and methods, over-long
prompts and limits, a full queue, clients that go away, a failing step, shutdown with requests in
flight, and many clients at once. The model is a tiny random Llama with a character tokenizer (no EOS,
so every answer runs to its limit); the openai client is tested on the real model in one slow test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from serve_harness import serving

from specframe import SamplingParams, SpeculativeDecoder
from specframe.decode.session import RowSession
from specframe.serve.engine import Engine
from specframe.testing.targets import reference_greedy, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

PROMPTS = ["abcabcabd abcabcabd abcab", "xyz xyz xyz xy", "hello hello hel", "0101010101 0101"]


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)


@pytest.fixture(scope="module")
def served(target):
    with serving(Engine(target, "pld@4", batch_size=3, queue_size=32, max_tokens=200)) as served:
        yield served


def plain(target, prompt: str, n: int) -> str:
    ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return target.tokenizer.decode(reference_greedy(target, ids, n))


def post(served, body: dict, path: str = "/v1/completions", **kwargs) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=60, **kwargs)


def events(response: httpx.Response) -> list:
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_models_health_and_metrics(served):
    assert httpx.get(served.url + "/v1/models").json()["data"][0]["id"] == "tiny"
    assert httpx.get(served.url + "/health").json()["status"] == "ok"
    metrics = httpx.get(served.url + "/metrics").text
    assert "specframe_generated_tokens_total" in metrics and "specframe_requests_waiting" in metrics


@pytest.mark.parametrize("method", [None, "none", "pld+trie@auto"])
def test_an_answer_is_plain_greedy_decoding_with_its_speculation_metrics(served, target, method):
    body = {"prompt": PROMPTS[0], "max_tokens": 30, **({"method": method} if method else {})}
    answer = post(served, body).json()
    assert answer["choices"][0]["text"] == plain(target, PROMPTS[0], 30)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": len(PROMPTS[0]), "completion_tokens": 30, "total_tokens":
                               len(PROMPTS[0]) + 30}
    speculation = answer["speculation"]
    assert speculation["method"] == {None: "pld@4", "none": "none@1"}.get(method, method)
    assert speculation["tau"] == pytest.approx(30 / speculation["steps"], abs=1e-3)
    if method == "none":
        assert speculation["drafted_tokens"] == 0 and speculation["steps"] == 30
    elif method is None:  # pld@4 drafts every step (at auto the planner may judge drafting not worth it)
        assert speculation["accepted_tokens"] > 0


def test_streamed_equals_whole_and_carries_usage_last(served, target):
    body = {"prompt": PROMPTS[1], "max_tokens": 25}
    whole = post(served, body).json()
    chunks = events(post(served, {**body, "stream": True, "stream_options": {"include_usage": True}}))
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == whole["choices"][0]["text"] == plain(target, PROMPTS[1], 25)
    assert len(texts) > 1 and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert chunks[-1]["speculation"]["method"] == "pld@4"


def test_a_sampled_request_follows_its_seed(served, target):
    """Sampling parameters and seed are the request's own: the same seed gives the same text, which is
    what the library gives for that seed (`sample-match` is reproducible at any budget)."""
    method = "pld+chain+sample-match@4"
    body = {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0.9, "top_p": 0.95, "seed": 11,
            "method": method}
    texts = [post(served, body).json()["choices"][0]["text"] for _ in range(2)]
    other = post(served, {**body, "seed": 12}).json()["choices"][0]["text"]
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    library = SpeculativeDecoder.from_names(target, "pld", "chain", "sample-match", budget=4,
                                            sampling=sampling)
    assert texts[0] == texts[1] == library.generate(PROMPTS[0], max_new_tokens=20).text != other


def test_stop_strings_end_an_answer(served, target):
    full = plain(target, PROMPTS[0], 30)
    answer = post(served, {"prompt": PROMPTS[0], "max_tokens": 30, "stop": [full[6:8]]}).json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["text"] == full[:8]


@pytest.mark.parametrize("body,status,says", [
    ("{not json", 400, "JSON"),
    ({"max_tokens": 5}, 400, "prompt"),
    ({"prompt": "abc", "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "abc", "max_tokens": 0}, 400, "greater than or equal to 1"),
    ({"prompt": "abc", "n": 2}, 400, "n=2"),
    ({"prompt": "abc", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": ["abc", "def"]}, 400, "one prompt per request"),
    ({"prompt": ""}, 400, "empty"),
    ({"prompt": "abc", "temperature": -1}, 400, "temperature"),
    ({"prompt": "abc", "method": "nonsense"}, 400, "unknown drafter 'nonsense'"),
    ({"prompt": "abc", "temperature": 0.8}, 400, "greedy only"),
    ({"prompt": "abc", "max_tokens": 201}, 400, "limit of 200"),
    ({"prompt": "ab" * 200, "max_tokens": 150}, 400, "exceeds the context"),
    ({"prompt": [5, 999]}, 400, "token ids must be in [0, 96)"),
    ({"prompt": "abc", "model": "gpt-4"}, 404, "not served here"),
])
def test_bad_requests_are_refused_before_any_work(served, body, status, says):
    before = dict(served.engine.stats.requests)
    if isinstance(body, str):
        response = httpx.post(served.url + "/v1/completions", content=body,
                              headers={"content-type": "application/json"})
    else:
        response = post(served, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert says in error["message"] and error["type"]
    assert served.engine.stats.requests == before  # nothing was decoded


def test_chat_without_a_template_is_refused(served):
    response = post(served, {"messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions")
    assert response.status_code == 400 and "chat template" in response.json()["error"]["message"]


def test_many_concurrent_clients_each_get_their_own_plain_answer(served, target):
    """24 clients at once on a server decoding 3 rows per method: requests join and leave the batches
    at every step, methods mixed; every answer is its prompt's plain greedy decoding."""
    methods = [None, "none", "pld+trie@auto"]
    jobs = [(PROMPTS[i % 4], 12 + i % 7, methods[i % 3], i % 2 == 0) for i in range(24)]

    async def one(client, prompt, n, method, stream):
        body = {"prompt": prompt, "max_tokens": n, "stream": stream, **({"method": method} if method else {})}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        if stream:
            return "".join(c["choices"][0]["text"] for c in events(response) if c["choices"])
        return response.json()["choices"][0]["text"]

    async def everyone():
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, *job) for job in jobs))

    texts = asyncio.run(everyone())
    assert texts == [plain(target, prompt, n) for prompt, n, _, _ in jobs]
    assert served.engine.running == 0 and served.engine.waiting == 0


def slowed(monkeypatch, seconds: float) -> None:
    """Every decoding step sleeps first, so requests stay in flight long enough to be disturbed."""
    step = RowSession._step_rows

    def slow(self):
        time.sleep(seconds)
        step(self)
    monkeypatch.setattr(RowSession, "_step_rows", slow)


def wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_goes_away_frees_its_row(target, monkeypatch):
    slowed(monkeypatch, 0.05)
    with serving(Engine(target, "pld@4", batch_size=2)) as served:
        for stream in (True, False):
            cancelled = served.engine.stats.requests.get("cancelled", 0)
            with httpx.Client(base_url=served.url, timeout=60) as client:
                body = {"prompt": PROMPTS[0], "max_tokens": 300, "stream": stream}
                if stream:
                    with client.stream("POST", "/v1/completions", json=body) as response:
                        next(response.iter_lines())  # the first chunk arrived: it is decoding
                else:  # a raw socket, closed while the server decodes
                    payload = json.dumps(body).encode()
                    with socket.create_connection(("127.0.0.1", served.port)) as sock:
                        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                        sock.sendall(head + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
                        wait_for(lambda: served.engine.running == 1)
            wait_for(lambda n=cancelled + 1: served.engine.stats.requests.get("cancelled", 0) == n)
            assert served.engine.running == 0
        assert post(served, {"prompt": PROMPTS[1], "max_tokens": 10}).json()["choices"][0]["text"] == \
            plain(target, PROMPTS[1], 10)


def test_a_full_queue_answers_429_at_once(target, monkeypatch):
    slowed(monkeypatch, 0.05)
    with serving(Engine(target, "pld@4", batch_size=1, queue_size=1)) as served:
        with httpx.Client(base_url=served.url, timeout=60) as client:
            streams = []
            for _ in range(2):  # one decoding, one waiting
                streams.append(client.stream("POST", "/v1/completions",
                                             json={"prompt": PROMPTS[0], "max_tokens": 100, "stream": True}))
                streams[-1].__enter__()
            wait_for(lambda: served.engine.running == 1 and served.engine.waiting == 1)
            start = time.monotonic()
            refused = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5})
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
            assert time.monotonic() - start < 10  # answered, not queued behind the 100-token requests
            for response in streams:
                response.__exit__(None, None, None)


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(served, target, monkeypatch):
    step, failed = RowSession._step_rows, []

    def fail_once(self):
        if not failed:
            failed.append(True)
            raise RuntimeError("a component broke")
        step(self)
    monkeypatch.setattr(RowSession, "_step_rows", fail_once)
    response = post(served, {"prompt": PROMPTS[2], "max_tokens": 10})
    assert response.status_code == 500 and "a component broke" in response.json()["error"]["message"]
    again = post(served, {"prompt": PROMPTS[2], "max_tokens": 10})
    assert again.json()["choices"][0]["text"] == plain(target, PROMPTS[2], 10)


@pytest.mark.parametrize("drain_s,finish", [(60.0, "length"), (0.0, "cancelled")])
def test_shutdown_drains_or_cancels_requests_in_flight(target, monkeypatch, drain_s, finish):
    slowed(monkeypatch, 0.02)
    chunks: list = []
    with serving(Engine(target, "pld@4", batch_size=2), drain_s=drain_s) as served:
        def read():
            with httpx.stream("POST", served.url + "/v1/completions", timeout=60,
                              json={"prompt": PROMPTS[0], "max_tokens": 60, "stream": True}) as response:
                chunks.extend(line for line in response.iter_lines() if line.startswith("data: "))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: served.engine.running == 1)
    reader.join(60)
    assert chunks[-1] == "data: [DONE]"
    last = json.loads(chunks[-2][len("data: "):])
    if finish == "length":
        assert last["choices"][0]["finish_reason"] == "length"
    else:
        assert "cancelled" in last["error"]["message"]
    assert served.engine.stats.requests.get(finish) == 1


@pytest.mark.slow
def test_the_openai_client_streams_and_not_on_the_real_model(smollm2):
    """The openai package as a client: completions and chat, whole and streamed, the method chosen per
    request through `extra_body`; streamed equals whole, and speculative equals plain."""
    from openai import OpenAI

    with serving(Engine(smollm2, "pld@auto", batch_size=2)) as served:
        client = OpenAI(base_url=served.url + "/v1", api_key="unused")
        messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40)
        plain_answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40,
                                                      extra_body={"method": "none"})
        streamed = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == whole.choices[0].message.content == plain_answer.choices[0].message.content
        assert whole.usage.completion_tokens == 40
        assert whole.model_extra["speculation"]["method"] == "pld@auto"
        completion = client.completions.create(model="tiny", prompt="def add(a, b):\n", max_tokens=24)
        pieces = client.completions.create(model="tiny", prompt="def add(a, b):\n", max_tokens=24,
                                           stream=True)
        assert "".join(p.choices[0].text for p in pieces if p.choices) == completion.choices[0].text
