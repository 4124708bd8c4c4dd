"""Serving: `specframe serve` (an OpenAI-compatible server with continuous batching and speculation per
request: `engine`, `api`, `app`) and the load benchmark that drives such a server over HTTP (`load`)."""
