"""The plugin author's kit: the stable helpers first-party plugins use, documented in the API reference.

A plugin imports `specframe` (the public API), `specframe.kit.*` and `specframe.testing`, and nothing else
from specframe; the import contracts in `pyproject.toml` check this for the first-party plugins. The kit's
modules, grouped by who needs them:

- `specframe.kit.drafting`: draws, draw order, the greedy token, tokenizer identity (drafters, tree
  builders, verifiers);
- `specframe.kit.components`: `required`, the one way a component reaches another it declares in its
  `requires` (a drafter running another plugin's drafter);
- `specframe.kit.inference`: `inference_mode` for methods that run a model;
- `specframe.kit.models`: packed linear layers, the linear kernel, truncated models (imports torch);
- `specframe.kit.backend`: padding, the calibration a backend is handed, the KV cache, exact rows, batch
  slots (imports torch);
- `specframe.kit.files`: atomic writes, locks, the specframe home folder, I/O errors;
- `specframe.kit.training`: resumable training state, config bounds (imports torch);
- `specframe.kit.progress`, `specframe.kit.ray`, `specframe.kit.prompts`: progress bars, Ray, the
  benchmark's prompt suites;
- `specframe.kit.cli_options`: the typer options specframe's own commands share.

The modules that import torch say so; import them inside the methods that run a model, so that registering
a plugin (`specframe plugins`, `specframe --help`) stays light.
"""
