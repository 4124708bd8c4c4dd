"""Support: files written atomically under a lock, the specframe home folder, progress bars, tokenizer
identity, resumable training state, settings read from the environment, Ray helpers, and the reader of
untrusted JSON files and text (`untrusted`). Imports only `specframe.terms`."""
