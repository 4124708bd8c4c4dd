"""`specframe serve`: the model behind an OpenAI-compatible HTTP API, speculating per request."""

from __future__ import annotations

from typing import Optional

import typer

from specframe.kit.cli_options import device_option, dtype_option, model_option
from specframe.terms.kinds import DEFAULT_BUDGET


def serve(
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    method: str = typer.Option(f"pld@{DEFAULT_BUDGET}", help="The speculative method of requests that name "
                               "none: a preset or a pipeline spec "
                               "DRAFTER[+TREE[+VERIFIER[+BACKEND]]][@BUDGET] as `specframe bench --methods` "
                               "takes (e.g. suffix+trie@auto; 'none' = plain "
                               "decoding). A request picks its own with the body field \"method\"."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Rows decoded together per method: "
                                   "requests join and leave the batch at any step."),
    queue_size: int = typer.Option(64, "--queue-size", min=0, help="Requests waiting for a row at most; "
                                   "one more is answered 429 at once."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on."),
    served_name: Optional[str] = typer.Option(None, "--served-model-name", help="The model's name in the "
                                              "API (default: --model)."),
    temperature: float = typer.Option(0.0, min=0.0, help="Temperature of requests that set none (0 = "
                                      "greedy; a sampled request needs a method with a sampling verifier, "
                                      "e.g. pld+chain+sample-match)."),
    default_max_tokens: int = typer.Option(256, "--default-max-tokens", min=1, help="max_tokens of requests "
                                           "that set none."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens-limit", min=1, help="The most max_tokens a "
                                             "request may ask for (default: the model's context)."),
    drain_s: float = typer.Option(30.0, "--drain-seconds", min=0.0, help="At shutdown (Ctrl-C), how long "
                                  "requests in flight may finish before they are cancelled."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch intra-op threads (default: torch's "
                                          "choice)."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's log level."),
) -> None:
    """Serve the model with an OpenAI-compatible API: /v1/completions, /v1/chat/completions (streamed with
    "stream": true), /v1/models, /health and /metrics. Requests decode in continuous batches; the response
    carries the request's speculation metrics beside its usage (docs/how-to/serve.md)."""
    import torch

    from specframe.plugging.models import model_recipes
    from specframe.runtime.load import load_target
    from specframe.serve.app import run
    from specframe.serve.engine import Engine

    if threads is not None:
        torch.set_num_threads(threads)
    target = load_target(model, device=device, dtype=dtype, recipes=model_recipes)
    engine = Engine(target, method, batch_size=batch_size, queue_size=queue_size, max_tokens=max_tokens)
    typer.echo(f"serving '{served_name or model}' with {engine.default_method} on http://{host}:{port}/v1",
               err=True)
    run(engine, served_name or model, host, port, drain_s=drain_s, log_level=log_level,
        temperature=temperature, default_max_tokens=default_max_tokens)
