"""Running a model inside a component without loading torch when the plugin registers.

- `inference_mode` decorates a component's method that runs a model, as `@torch.inference_mode()` would,
  but imports torch when the method runs, not when its module is imported: `specframe plugins` and
  `specframe --help` import every plugin and must stay light (`tests/core/cli/test_cli_imports.py` checks it).

Imports neither torch nor transformers: a plugin may import it at the top of any module, and must, since
decorators run at import.
"""

from specframe.runtime.devices import inference_mode

__all__ = ["inference_mode"]
