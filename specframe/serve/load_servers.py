"""The servers `specframe serve-bench` drives: `specframe serve` and llama.cpp's own OpenAI server, each
started as a subprocess on the loopback with one thread, waited for until it answers, and stopped; or a
server already running at a URL.

One server runs at a time, so that no two share the cores. A server's log goes to a file under the run's
`--out`, and a server that exits or never answers is reported with the end of that log.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specframe.terms.errors import ConfigurationError, SpecframeError

HOST = "127.0.0.1"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class ServerError(SpecframeError):
    """A server that could not be started, or stopped answering."""


@dataclass(frozen=True)
class Method:
    """One stream label of a server: `label` in the tables, `field` the request's `method` field (None:
    the server's own method, no field sent)."""

    label: str
    field: str | None = None


@dataclass
class Server:
    """A server to drive: `command` starts it (None: it is running at `url` already), `ready` is the path
    that answers 200 once its model is loaded, `lossless` whether its greedy outputs must equal plain
    decoding's (specframe's methods; not a peer on other kernels)."""

    name: str
    methods: list[Method]
    command: list[str] | None = None
    url: str = ""
    ready: str = "/health"
    lossless: bool = True
    env: dict = field(default_factory=dict)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def specframe_server(methods: list[str], *, model: str, batch_size: int, queue_size: int,
                     threads: int) -> Server:
    """`specframe serve` started with the first of `methods`; the others are sent per request through the
    `method` field, to the same server."""
    port = free_port()
    command = [sys.executable, "-m", "specframe.cli", "serve", "--model", model, "--method", methods[0],
               "--batch-size", str(batch_size), "--queue-size", str(queue_size), "--host", HOST,
               "--port", str(port), "--threads", str(threads)]
    return Server("specframe", [Method(methods[0]), *(Method(m, m) for m in methods[1:])], command,
                  f"http://{HOST}:{port}")


# llama.cpp's server is started through the llamacpp plugin's launcher, which loads the model as that
# plugin does (without llama.cpp's repacked weight buffers: plugins/specframe_llamacpp/server.py says
# why); the core names the module and imports nothing of it, nor of llama_cpp.
LLAMACPP_LAUNCHER = "specframe_llamacpp.server"
LLAMACPP_CONTEXT = 4096  # positions, as the llamacpp plugin's peers take by default


def llamacpp_server(*, model: str, threads: int, **_) -> Server:
    """llama.cpp's own OpenAI server (llama-cpp-python's `server` extra) on the GGUF that `model` stands
    for, `threads` threads for prompts and tokens alike, one request at a time as that server decodes.
    `--interrupt_requests false`: by default it ends a streamed answer early as soon as another request
    waits, which under load would cut most answers short."""
    from specframe.runtime.load import gguf_file

    missing = [m for m in ("llama_cpp", "specframe_llamacpp", "fastapi", "uvicorn", "sse_starlette",
                           "starlette_context", "pydantic_settings") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigurationError(f"peer llamacpp-server needs llama-cpp-python and its server extra "
                                 f"(missing: {', '.join(missing)}): pip install 'specframe[serve,llamacpp]', "
                                 "or leave the peer out")
    path = gguf_file(model)
    if path is None:
        raise ConfigurationError(f"peer llamacpp-server runs a GGUF file, and model '{model}' is none: pass "
                                 "--model path/to/model.gguf or a GGUF alias (smollm2-135m)")
    port = free_port()
    command = [sys.executable, "-m", LLAMACPP_LAUNCHER, "--model", str(path), "--host", HOST, "--port",
               str(port), "--n_ctx", str(LLAMACPP_CONTEXT), "--n_threads", str(threads), "--n_threads_batch",
               str(threads), "--interrupt_requests", "false"]
    return Server("llamacpp-server", [Method("llamacpp-server")], command, f"http://{HOST}:{port}",
                  ready="/v1/models", lossless=False)


PEERS = {"llamacpp-server": llamacpp_server}
"""The peers `--peers` names: a function of the run's model options returning the `Server`."""


def url_server(url: str, methods: list[str]) -> Server:
    """A server already running at `url`: every method sent through the `method` field, `default` as no
    field (the server's own method, and the only thing a server other than specframe's understands)."""
    return Server("url", [Method(m, None if m == "default" else m) for m in methods], None, url.rstrip("/"))


@contextmanager
def running(server: Server, log: Path, startup_timeout: float) -> Iterator[Server]:
    """`server` started (unless it runs already), answering at `server.ready`, and stopped on leaving."""
    if server.command is None:
        wait_ready(server, None, log, startup_timeout)
        yield server
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as sink:
        process = subprocess.Popen(server.command, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={**os.environ, **ONE_THREAD, **server.env},
                                   start_new_session=True)
        try:
            wait_ready(server, process, log, startup_timeout)
            yield server
        finally:
            stop(process)


def wait_ready(server: Server, process, log: Path, timeout: float) -> None:
    """Poll `server.ready` until it answers 200; a process that exits first, or no answer within `timeout`
    seconds, is a `ServerError` with the end of its log."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise ServerError(f"{server.name} exited with status {process.returncode} before answering "
                              f"{server.ready}: {log_tail(log)}")
        try:
            if httpx.get(server.url + server.ready, timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            where = log_tail(log) if process is not None else "is it running, and is the URL right?"
            raise ServerError(f"{server.name} at {server.url} did not answer {server.ready} within "
                              f"{timeout:g} s (raise --startup-timeout if its model loads slowly): {where}")
        time.sleep(0.5)


def stop(process: subprocess.Popen, grace: float = 20.0) -> None:
    """Ask `process` to stop (SIGTERM: a server drains or cancels its requests), and kill it if it is
    still there after `grace` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def log_tail(log: Path, lines: int = 15) -> str:
    """The last `lines` lines of a server's log, for an error message."""
    try:
        text = log.read_text("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {log})"
    return f"the end of its log ({log}):\n" + "\n".join(text)


def model_id(server: Server, fallback: str) -> str:
    """The first model `/v1/models` lists (what a request's `model` names), else `fallback`."""
    import httpx

    try:
        listed = httpx.get(server.url + "/v1/models", timeout=10.0).json()
        return str(listed["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return fallback
