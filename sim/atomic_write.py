"""Atomic writes: a reader (or a crash) sees the old file or folder, or the whole new one.

Everything is written to a staging name beside the target, in the same folder and so on
the same file system, and renamed over the target with ``os.replace``, which POSIX makes
atomic. The one place for this, so that every output (profiles, run folders, sweep cells,
baselines, reports) gets the same guarantees: whole or absent, permissions by the umask
(``mkstemp``/``mkdtemp`` would leave 0600/0700), staging removed on any failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def write_file(path: str | os.PathLike[str], data: bytes | str, *, keep_mode: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (synced to disk before it takes the real name).

    ``keep_mode``: the new file keeps an existing file's permission bits (a rewritten
    baseline stays executable-or-not as its owner made it).
    """
    path = Path(path)
    with staged_file(path, keep_mode=keep_mode) as staging:
        with open(staging, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
    return path


@contextlib.contextmanager
def staged_file(path: str | os.PathLike[str], *, keep_mode: bool = False) -> Iterator[Path]:
    """A staging path to write ``path``'s new contents to (by any library); renamed into place on exit.

    If the block raises, the staging file is removed and ``path`` is untouched.
    """
    path = Path(path)
    staging = new_staging_file(path, keep_mode=keep_mode)
    try:
        yield staging
        commit(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def new_staging_file(path: str | os.PathLike[str], *, keep_mode: bool = False) -> Path:
    """An empty staging file beside ``path`` (its folder created): for writes staged now and
    committed later, after other outputs succeeded (the run's timeline waits for its folder).
    The caller removes it if it never commits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    staging = Path(name)
    try:
        os.chmod(staging, path.stat().st_mode & 0o777 if keep_mode and path.exists() else 0o666 & ~current_umask())
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return staging


def commit(staging: Path, path: str | os.PathLike[str]) -> Path:
    """Rename a finished staging file over ``path``: a reader sees the old file or the whole new one."""
    os.replace(staging, path)
    return Path(path)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging folder to fill; on exit it replaces the folder ``path`` whole (see :func:`replace_dir`).

    If the block raises, the staging folder is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        os.chmod(staging, 0o777 & ~current_umask())
        yield staging
        replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_dir(staging: Path, target: Path) -> None:
    """Put a finished staging folder in place of ``target``, old contents gone, never half of either.

    A folder cannot be renamed over a non-empty one, so the old one is first renamed aside
    (``.NAME.old``) and removed after; a reader sees the old folder, no folder for an
    instant, or the new one.
    """
    if not target.exists():
        os.replace(staging, target)
        return
    retired = target.with_name(f".{target.name}.old")
    shutil.rmtree(retired, ignore_errors=True)
    os.replace(target, retired)
    os.replace(staging, target)
    shutil.rmtree(retired, ignore_errors=True)


def current_umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
