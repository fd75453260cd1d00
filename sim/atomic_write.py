"""Atomic writes: a reader (or a crash) sees the old file or folder, or the whole new one.

Everything is written to a staging name beside the target, in the same folder and so on
the same file system, and renamed over the target with ``os.replace``, which POSIX makes
atomic. The one place for this, so that every output (profiles, run folders, sweep cells,
baselines, reports) gets the same guarantees: whole or absent, permissions by the umask
(``mkstemp``/``mkdtemp`` would leave 0600/0700), staging removed on any failure.

A staging name carries its writer's process id (``.NAME.PID.RANDOM[.tmp]``), so that what a
process killed with ``kill -9`` left behind is recognised and removed by the next write beside
it (:func:`clean_stale`). :func:`output_lock` keeps two processes from writing one output at
once, and :func:`check_output` tells, before any work, whether an output could be written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from sim.errors import InputError

STALE_AFTER_S = 24 * 3600.0  # a staging name older than this is removed even if its pid is alive (reused)


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
    clean_stale(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_staging_prefix(path), suffix=".tmp")
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
    clean_stale(path)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(path), dir=path.parent))
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
    (to a staging name of its own) and removed after; a reader sees the old folder, no folder
    for an instant, or the new one. Should another process put a folder there in between,
    the move is tried again: the last writer wins, and no rename error escapes.
    """
    for _ in range(20):
        retired = target.with_name(f"{_staging_prefix(target)}{secrets.token_hex(4)}.old")
        with contextlib.suppress(FileNotFoundError):
            os.replace(target, retired)
        try:
            os.replace(staging, target)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            continue  # another writer's folder arrived first: retire it too
        finally:
            shutil.rmtree(retired, ignore_errors=True)
        return
    raise OSError(errno.EBUSY, f"{target} keeps being replaced by another process")


def _staging_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def clean_stale(path: str | os.PathLike[str]) -> list[Path]:
    """Remove what writers of ``path`` killed mid-write left beside it: staging files and folders
    whose owner process is gone (or that are older than :data:`STALE_AFTER_S`). Returns them."""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[A-Za-z0-9_]+(\.tmp|\.old)?$")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if entry.name == f".{path.name}.lock" and _unheld(Path(entry.path)):
            removed.append(Path(entry.path))  # its holder was killed before it could remove it
            continue
        match = pattern.match(entry.name)
        if not match:
            continue
        pid = int(match.group(1))
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if pid != os.getpid() and (not _alive(pid) or age > STALE_AFTER_S):
            stale = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
            removed.append(stale)
    return removed


def _unheld(lock: Path) -> bool:
    """Remove ``lock`` if no process holds its flock (output_lock checks the file it locked is still there)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        lock.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# ---------------------------------------------------------------------------------------------
# Before the work: can the output be written, and is nobody else writing it?


def output_problem(path: str | os.PathLike[str], *, folder: bool) -> str | None:
    """Why ``path`` (a file, or a folder when ``folder``) could not be written at the end of the
    work, or None: it is of the other kind, a parent is a file, or the nearest existing parent
    folder refuses a new file (tried for real: permissions, read-only file systems, quotas)."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        return "it is a file, not a folder"
    if not folder and path.is_dir():
        return "it is a folder, not a file"
    for parent in path.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            return f"{parent} is a file, not a folder"
        try:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=_staging_prefix(path), suffix=".tmp")
        except OSError as exc:
            return f"cannot create files in {parent}: {exc.strerror or exc}"
        os.close(fd)
        os.unlink(probe)
        return None
    return None


def check_output(path: str | os.PathLike[str], *, folder: bool, field: str | None = None,
                 source: str | None = None) -> Path:
    """:func:`output_problem` as one InputError (naming ``field`` and ``source``, else the path)."""
    problem = output_problem(path, folder=folder)
    if problem is not None:
        raise InputError(f"cannot write {path}: {problem}", field=field, source=source)
    return Path(path)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str], *, field: str | None = None, source: str | None = None,
                error: Callable[[str], InputError] | None = None) -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``path`` while this process works towards writing it.

    A second process asking for the same output is refused at once (InputError: exit 2),
    before its work: waiting would hide that two runs were started at one folder, and one
    of the results would be thrown away. The lock is an ``flock``, which the kernel releases
    when its holder dies, even by ``kill -9``; the file is removed on release, and so are the
    folders made to hold it if the output never came (a failed run leaves no empty ``runs/``).
    ``error`` makes the refusal's InputError from its message (to name where the output was given).
    """
    path = Path(path)
    error = error or (lambda message: InputError(message, field=field, source=source or str(path)))
    lock = path.with_name(f".{path.name}.lock")
    created = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise error(f"another specbatch process (pid {holder}) is writing {path} now; "
                        "wait for it to finish or choose another output") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino  # not a file its last holder just removed
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
        if not path.exists():
            for folder in created:  # deepest first
                try:
                    folder.rmdir()
                except OSError:
                    break


def current_umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
