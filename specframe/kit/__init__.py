"""The plugin author's kit: the stable helpers first-party plugins use, documented in the API reference.

A plugin imports `specframe` (the public API), `specframe.kit.*` and `specframe.testing`, and nothing else
from specframe; the import contracts in `pyproject.toml` check this for the first-party plugins.
"""
