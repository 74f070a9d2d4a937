"""Atomic writes: readers see the old version or the new one, never half a file or directory.

Write into a temporary sibling, fsync every file and the directory, then rename over the target.
For a directory that already exists, the old one is moved aside first and removed after the swap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `target` atomically; on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        for root, _, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(tmp, target)
        _fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Yield an open temporary file; on success it is fsynced and renamed over `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the `.NAME.tmp-*` that writes into `directory` left when their process was killed: readers never see them,
    but each can be a whole checkpoint. Call only while no writer runs there. (`.old-*` stays: a kill between
    atomic_dir's two renames leaves the only complete copy there.)"""
    removed = []
    for path in Path(directory).glob(".*.tmp-*"):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        removed.append(path)
    return removed
