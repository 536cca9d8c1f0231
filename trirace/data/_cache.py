"""Crash- and race-safe cache files shared by the tokenizer and token caches."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], None], shared: bool = False) -> None:
    """Write via a temp file in the same directory, then rename over `path`.

    os.replace is atomic on POSIX, so readers see either the old file or the
    complete new one, never a torn write, even if this process is killed.
    `shared`: readable by others as the umask allows, as a file open() makes (a
    temp file is private to its owner).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if shared:
                mask = os.umask(0)
                os.umask(mask)
                os.fchmod(f.fileno(), 0o666 & ~mask)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Exclusive lock so that, of many processes starting at once, one builds a
    cache entry and the rest wait and then read it (training is not free, and
    every rank must end up with the very same vocabulary). The kernel drops
    the lock if its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
