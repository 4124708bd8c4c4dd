"""The target runtime: loading a model (GGUF, hub, local), devices and dtypes, and the CPU patches that make
tree rows and plain steps compute alike (exact attention, packed linear layers, key/value cache helpers)."""
