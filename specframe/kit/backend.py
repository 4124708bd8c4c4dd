"""For StateBackend authors: the rows a backend pads each forward to, the calibration it is handed, its
cost with padding, the appending KV cache, how many rows attention keeps exact, slot bookkeeping for
batches, and the GGUF file behind a model name.

- `Calibration` is what a backend is handed when it is built (`StateBackend.__init__`'s `calibration`,
  kept as `self.calibration`): the step cost measured for it on this machine (`specframe calibrate`, or
  the first `budget="auto"` request), which `cost_model()` may return, and the rows calibration chose to
  pad its forwards to. A backend never reads the store itself and is never changed after it is built: a
  calibration measured later reaches a new backend built with it (`specframe.plugging.pipeline`).
- `forward_min_rows(value, device, backend, linear, calibrated=...)` is the backend's `min_rows`
  option resolved: the value given, else no padding off the CPU, else what calibration chose
  (`calibrated`: the `Calibration.min_rows` handed down); `pads_by_measurement(value, device, linear)`
  says whether that choice is left to calibration, which is what a backend's
  `StateBackend.pads_by_measurement()` returns. On a CPU, 1- and 2-row matrix products are slower than
  4-row ones, so padding small forwards can pay; where other work grows with the rows it is a loss,
  hence measured per model.
- `PaddedCost(base, rows)` is a cost model for a backend that pads: trees of fewer nodes cost what
  `rows - 1` nodes cost.
- `buffered_cache(config)` is a transformers `DynamicCache` whose attention layers append in place, so a
  step copies no cache.
- `RaggedCache(config)` is a transformers cache for several sequences of different lengths scored in one
  forward (a batch's rows), each in a slot of one buffer per layer; `BatchBackend` is the interface such a
  batch implements (`StateBackend.batch`), and `SlottedRow` and `SlottedRows` (`specframe.kit.slots`) keep
  rows in slots of shared buffers.
- `exact_rows(model)` is how many rows one forward may take and still give each row exactly what a
  forward of that row alone would, on the CPU's exact attention (None where the model is not computed
  exactly anyway): the most rows a backend may score at once and keep greedy decoding identical.
- `gguf_file(name)` is the GGUF file a model name stands for (a `.gguf` path, or the file of an alias
  such as `smollm2-135m` inside its wheel), or None: for a backend that runs the GGUF itself, such as
  llama.cpp, beside the model specframe converted from it.

Imports torch and transformers: import it inside the methods that build or run the backend, never at a
plugin module's top.
"""

from specframe.contract.batch import BatchBackend
from specframe.contract.calibration import Calibration
from specframe.kit.slots import SlottedRow, SlottedRows
from specframe.runtime.attention import additive_mask, exact_rows
from specframe.runtime.devices import forward_min_rows, pads_by_measurement
from specframe.runtime.kv_cache import RaggedCache, buffered_cache
from specframe.runtime.load import gguf_file
from specframe.terms.cost import PaddedCost

__all__ = ["BatchBackend", "Calibration", "PaddedCost", "RaggedCache", "additive_mask", "buffered_cache",
           "exact_rows", "forward_min_rows", "SlottedRow", "SlottedRows", "gguf_file", "pads_by_measurement"]
