"""For plugins that train (s4c heads, hybrid mixers): a resumable training state and the bounds check of a
training config.

- `save_train_state(path, tensors, optimizer, extra)` writes the weights, the optimizer's state and JSON
  extras to one safetensors file, atomically, so a killed run resumes from its last save;
  `read_train_state(path, hint)` reads it back and refuses a damaged or foreign file, saying how to
  start afresh (`hint`). `STATE_FILE` is the file's name in a run directory.
- `refuse_pickled_state(directory, hint)` refuses a run directory whose only state is a pickle, which is
  never loaded (loading a pickle can run any code).
- `check_bounds(what, settings, at_least, positive)` refuses a config whose fields fall below their
  bounds (zero steps, a zero learning rate) before a model is loaded.

Imports torch: import it in the modules that train, never in a plugin's `__init__`.
"""

from specframe.plugging.options import check_bounds
from specframe.support.train_state import STATE_FILE, read_train_state, refuse_pickled_state, save_train_state

__all__ = ["STATE_FILE", "check_bounds", "read_train_state", "refuse_pickled_state", "save_train_state"]
