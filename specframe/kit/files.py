"""Files and folders a plugin writes: atomic writes, file and directory locks, the specframe home folder,
the writable-directory check and the wording of I/O errors.

A plugin that stores something (a datastore, a learned store, trained weights) needs these so that a
killed process or two processes at once never leave a half-written file, and so that a read-only or full
disk is reported with what to do instead of a traceback:

- `write_atomically(path, text)` replaces a file whole; `locked_update(path, ...)` holds its lock while a
  writer re-reads and merges (`file_lock` names that lock, `FILE_LOCK_WAIT` is the default wait).
- `exclusive(lock_file, busy)` holds a lock on a whole output (a directory being built); under it,
  `remove_stale(parent, pattern, what)` removes the temporary entries of killed writers, which
  `temp_name_pattern(prefix)` matches.
- `exchange(a, b)` swaps two directories in one step, so readers never find nothing;
  `follow_umask(tree)` and `current_umask()` give published files the modes the user's umask asks for.
- `specframe_home()` is the folder for specframe's caches and named stores; `check_writable_dir(path,
  what, fix)` refuses a folder that cannot be written before slow work starts.
- `io_failure(err, fix)` words a failed read or write (the disk full, permission denied) for the
  error that replaces it.

Imports neither torch nor transformers: a plugin may import it at the top of any module.
"""

from specframe.support.atomic_dirs import (
    FILE_LOCK_WAIT, current_umask, exchange, exclusive, file_lock, follow_umask, locked_update, remove_stale,
    temp_name_pattern, write_atomically,
)
from specframe.support.paths import check_writable_dir, specframe_home
from specframe.terms.errors import io_failure

__all__ = [
    "FILE_LOCK_WAIT", "check_writable_dir", "current_umask", "exchange", "exclusive", "file_lock",
    "follow_umask", "io_failure", "locked_update", "remove_stale", "specframe_home", "temp_name_pattern",
    "write_atomically",
]
