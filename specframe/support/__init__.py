"""Support: files written atomically under a lock, the specframe home folder, progress bars, tokenizer
identity, resumable training state, settings read from the environment and Ray helpers. Imports only
`specframe.terms`."""
