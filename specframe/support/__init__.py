"""Support: files written atomically under a lock, the specframe home folder, progress bars, tokenizer
identity, resumable training state and Ray helpers. Imports only `specframe.terms`."""
