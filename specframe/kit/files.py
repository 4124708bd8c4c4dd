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
- `read_json(path, fix, error)`, `parse_json(text, where, fix, error)` and `json_lines(path, fix, error)`
  read JSON a user or another process wrote, refusing a damaged or crafted file (a syntax error, bytes
  that are not UTF-8, a 5000-digit integer, nesting too deep) with the plugin's own error class;
  `json_or_none(text)` reads a cache line, None where it is bad. `printable(text)` escapes the lone
  surrogates such a file can hold before they are printed; `check_encodable(text, where, fix, error)`
  refuses them before text reaches a tokenizer.

Imports neither torch nor transformers: a plugin may import it at the top of any module.
"""

from specframe.support.atomic_dirs import (
    FILE_LOCK_WAIT, current_umask, exchange, exclusive, file_lock, follow_umask, locked_update, remove_stale,
    temp_name_pattern, write_atomically,
)
from specframe.support.paths import check_writable_dir, specframe_home
from specframe.support.untrusted import (
    check_encodable, json_lines, json_or_none, parse_json, printable, read_json,
)
from specframe.terms.errors import io_failure

__all__ = [
    "FILE_LOCK_WAIT", "check_encodable", "check_writable_dir", "current_umask", "exchange", "exclusive",
    "file_lock", "follow_umask", "io_failure", "json_lines", "json_or_none", "locked_update", "parse_json",
    "printable", "read_json", "remove_stale", "specframe_home", "temp_name_pattern", "write_atomically",
]
