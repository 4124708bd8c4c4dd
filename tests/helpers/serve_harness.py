"""A `specframe serve` app run by uvicorn on a loopback port in a thread of the test process, so tests call
it over real HTTP (httpx, the openai client) and can stop it to watch it shut down."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from specframe.serve.app import Server, make_app
from specframe.serve.engine import Engine
from specframe.serve.load_servers import free_port


class Served:
    """A running server: its base URL, its engine, and `stop()`."""

    def __init__(self, engine: Engine, drain_s: float = 30.0, **app_options):
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(engine, "tiny", drain_s=drain_s, **app_options), host="127.0.0.1",
                                port=self.port, log_level="warning", lifespan="on")
        self.server = Server(config, engine, drain_s)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the test server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@contextmanager
def serving(engine: Engine, **app_options):
    served = Served(engine, **app_options).start()
    try:
        yield served
    finally:
        served.stop()
