"""Directories built in a temporary place and published by rename, under an exclusive lock.

Datastore builds (`plugins/specframe_corpus/build.py`) and the GGUF conversion cache
(`specframe/runtime/load.py`)
write into a hidden temporary directory beside their output and rename it into place when complete. This
module holds what both need to do that safely when several processes run at once or one is killed:

- `exclusive(lock_file)`: a `filelock` lock held for the whole check-build-publish sequence, so two
  processes never both decide that the output is theirs to write. The lock file is removed before the
  lock is released, so nothing is left beside the output. A holder killed by a signal cannot remove it:
  that empty file stays, but the lock is the kernel's `flock` on it, released with the process, so the
  file is never taken for a held lock, and the next holder removes it.
- `remove_stale(parent, pattern)`: temporary directories of the same output found while holding its lock
  belong to no live process (a live one would hold the lock), so they are leftovers of a killed run.
- `follow_umask(tree)`: `tempfile.mkdtemp` creates directories with mode 0700; published results get the
  modes the user's umask asks for, like any other file they create.

Single files that several processes update (suffix caches, calibrations, acceptance counts, benchmark
records) use the same pieces: `locked_update(path)` holds the file's lock for a read-merge-write and first
removes the temporaries of killed writes, and `write_atomically(path, text)` publishes a whole new file
with the umask's modes.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

STALE_INODE_RETRIES = 5  # a finishing holder unlinks the lock file: retry on the new one a few times
FILE_LOCK_WAIT = 60.0
"""Seconds `locked_update` waits for another writer of a file: updates hold its lock briefly."""


@contextmanager
def exclusive(
    lock_file: Path, busy: Callable[[], Exception], *, wait: float = 0.0, waiting: str | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` for the block.

    With `wait` 0 one attempt is made; otherwise the call waits up to `wait` seconds (inf: forever),
    printing `waiting` once on stderr if it has to. When the lock stays held by another process the
    exception `busy()` is raised.
    """
    lock = _acquire(lock_file, busy, wait, waiting)
    try:
        yield
    finally:
        _release(lock, lock_file)


def _acquire(lock_file: Path, busy: Callable[[], Exception], wait: float, waiting: str | None) -> FileLock:
    """Acquire the lock on the file currently named `lock_file` (see `_names_locked_file`)."""
    for _ in range(STALE_INODE_RETRIES):
        lock = FileLock(str(lock_file), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            if wait <= 0:
                raise busy() from None
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
                waiting = None
            start = time.monotonic()
            try:
                lock.acquire(timeout=-1 if wait == float("inf") else wait)
            except Timeout:
                raise busy() from None
            wait = max(0.0, wait - (time.monotonic() - start))
        if _names_locked_file(lock, lock_file):
            return lock
        lock.release()  # we locked a file its last holder had already unlinked
    raise busy()


def _names_locked_file(lock: FileLock, lock_file: Path) -> bool:
    """Whether `lock_file` still names the inode we locked.

    Holders unlink the lock file before releasing it (`_release`), so a process that opened the file just
    before that can win the lock on an inode no longer reachable by name while a third process locks a new
    file of the same name. Newer `filelock` versions detect this themselves; this check keeps older ones
    safe too.
    """
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if fd is None:
        return True  # cannot tell: trust filelock
    try:
        held, named = os.fstat(fd), os.stat(lock_file)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _release(lock: FileLock, lock_file: Path) -> None:
    """Unlink the lock file while still holding it, then release: nothing stays beside the output."""
    try:
        lock_file.unlink()
    except FileNotFoundError:
        pass
    finally:
        lock.release()


def remove_stale(parent: Path, pattern: re.Pattern[str], what: str) -> list[str]:
    """Remove the entries of `parent` whose names match `pattern`, and say so on stderr.

    Call this only while holding the lock of the output these entries belong to: then no live process is
    writing them. Returns the removed names.
    """
    if not parent.is_dir():
        return []
    stale = sorted(p for p in parent.iterdir() if pattern.fullmatch(p.name))
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if stale:
        names = ", ".join(str(p) for p in stale)
        print(f"specframe: removed {what} left by an interrupted run: {names}", file=sys.stderr, flush=True)
    return [p.name for p in stale]


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (`os.umask` is process-global)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(tree: Path) -> None:
    """Give `tree` and everything in it the modes a plain `mkdir`/`open` would have given them.

    `tempfile.mkdtemp` makes 0700 directories, and some writers (safetensors) 0600 files; a published
    cache or datastore should instead be as readable as the user's umask allows.
    """
    mask = current_umask()
    os.chmod(tree, 0o777 & ~mask)
    for root, dirs, files in os.walk(tree):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            path = os.path.join(root, name)
            executable = os.stat(path).st_mode & 0o111
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def follow_umask_file(path: Path) -> None:
    """Give the file `path` the mode a plain `open` would have (`tempfile.mkstemp` makes it 0600)."""
    os.chmod(path, 0o666 & ~current_umask())


def temp_name_pattern(prefix: str, suffix: str = "") -> str:
    """A regex for the names `tempfile.mkdtemp(prefix=prefix, suffix=suffix)` (or `mkstemp`) creates (its
    random part is [a-z0-9_])."""
    return re.escape(prefix) + r"[a-z0-9_]+" + re.escape(suffix)


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries `a` and `b` (both must exist) in one atomic step, so that a reader opening either
    name never finds nothing there; False where the system or file system cannot (Linux's `renameat2`
    with RENAME_EXCHANGE, since 3.15, on most local file systems), and nothing was changed."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)  # glibc >= 2.28
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not supported here
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def file_lock(path: Path) -> Path:
    """The lock a writer of the file `path` holds (`.NAME.lock` beside it, removed on release)."""
    return path.parent / f".{path.name}.lock"


def temp_file_pattern(path: Path) -> re.Pattern[str]:
    """Names of the temporary files `write_atomically(path, ...)` makes: `NAME.<random>.tmp`."""
    return re.compile(temp_name_pattern(f"{path.name}.", ".tmp"))


@contextmanager
def locked_update(path: Path, busy: Callable[[], Exception], what: str, *,
                  wait: float = FILE_LOCK_WAIT) -> Iterator[None]:
    """Hold the lock of the file `path` for the block (waiting up to `wait` seconds for another writer),
    after removing the temporary files of writes that were killed (a live writer would hold the lock).

    Writers re-read the file inside the block and merge what they add into what they find, so that no
    process overwrites what another wrote since it last read the file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    waiting = f"specframe: waiting for another process writing {what} ({file_lock(path)})"
    with exclusive(file_lock(path), busy, wait=wait, waiting=waiting):
        remove_stale(path.parent, temp_file_pattern(path), f"temporary files of {what}")
        yield


def write_atomically(path: Path, text: str | bytes) -> None:
    """Replace `path` with a file holding `text` (bytes as they are, a string as UTF-8): written to a
    temporary file beside it, given the modes of the umask, then renamed over it, so a reader sees the
    old file or the new one, whole. Call it inside `locked_update(path, ...)` when other processes may
    write `path` too."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w",
                       encoding=None if isinstance(text, bytes) else "utf-8") as f:
            f.write(text)
        follow_umask_file(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
