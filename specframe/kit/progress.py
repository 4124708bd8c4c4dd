"""Progress and resource reports for a plugin's long jobs (building a datastore, training, distilling).

- `bar(iterable, show=..., **tqdm_options)` draws a tqdm bar on stderr only where stderr is a terminal,
  so a plugin's commands print the same way as specframe's and logs stay free of bar redraws; a bar
  that does not draw still counts, so callers never branch on it. `Bar` is the type it returns.
- `peak_memory_bytes(device)` is the peak accelerator memory (CUDA) or the process's peak resident
  set size, for a job that reports what it needed.
- `now()` is seconds on specframe's clock (wall time unless `--clock` chose another), for a plugin that
  times decoding as specframe does (a bench peer).

Imports neither torch nor transformers: a plugin may import it at the top of any module.
"""

from specframe.support.progress import Bar, bar
from specframe.terms.metrics import now, peak_memory_bytes

__all__ = ["Bar", "bar", "now", "peak_memory_bytes"]
