"""Who has a store open: our directory lock, and LMDB's lock file seen from outside.

`DirectoryLock` is one writer per directory: a process-wide registry refuses a
second open in this process (py-lmdb refuses it too, less clearly) and an exclusive
``flock`` on ``tidal.lock`` refuses a second process. A read-only opener claims the
directory in this process only: LMDB serves it a reader slot beside the writer of
another process.

LMDB (mdb.c) takes a POSIX ``fcntl`` lock on byte 0 of ``lock.mdb``: a read lock for
every process that has the environment open, a write lock while the first opener
initializes the file (``mdb_env_excl_lock``, ``mdb_env_setup_locks``,
``mdb_env_share_locks``). `LockProbe` tests and takes that byte; `lmdb_env` uses it
to compact safely, and a read-only open takes the read lock there itself before
LMDB opens the files (`reader_lock`; see `lmdb_compact` for why). POSIX only (Linux
and the BSDs, whose ``struct flock`` differs).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
import threading
from pathlib import Path
from typing import IO

from tidal_actors._errors import DatabaseLocked
from tidal_actors.storage.actor_lock import wait_for_actors
from tidal_actors.storage.layout import COORDINATOR, env_path

__all__ = [
    "DirectoryLock",
    "LockProbe",
    "access_denied",
    "attached_process",
    "fsync_path",
    "lock_voided",
    "reader_lock",
    "void_unlinked",
]

# struct flock: Linux puts the type first, the BSDs (macOS) last
if sys.platform.startswith("linux"):
    _FLOCK = struct.Struct("hhqqi4x")

    def _flock(kind: int) -> bytes:
        return _FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0)

    def _unflock(raw: bytes) -> tuple[int, int]:
        kind, _, _, _, pid = _FLOCK.unpack(raw)
        return kind, pid
else:
    _FLOCK = struct.Struct("qqihh")

    def _flock(kind: int) -> bytes:
        return _FLOCK.pack(0, 1, 0, kind, os.SEEK_SET)

    def _unflock(raw: bytes) -> tuple[int, int]:
        _, _, pid, kind, _ = _FLOCK.unpack(raw)
        return kind, pid


class _Registry:
    """The store directories open in this process (by real path)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: set[str] = set()
        self.inherited: set[str] = set()  # stores a forked child's parent had open
        self.disowned: list[object] = []  # what a forked child inherited: kept, never closed

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread may have held the parent's
        at the fork, and no thread of the child would ever release it)."""
        self.lock = threading.Lock()


_REGISTRY = _Registry()
os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def access_denied(path: Path, read_only: bool, exc: BaseException) -> str | None:
    """The message for an open of the store at ``path`` that the file system refused
    (``exc``: a `PermissionError`, or py-lmdb's error for ``EACCES``/``EROFS``), naming
    the access each kind of open needs; None when ``exc`` is not such a refusal.

    A read-only open takes no lock of ours (``tidal.lock`` is not opened), but LMDB
    records each reader in the reader table of ``lock.mdb`` (creating the file if
    absent), so it needs write access to that file (or to the directory)."""
    text = str(exc)
    denied = isinstance(exc, PermissionError) or any(
        word in text for word in ("Permission denied", "Read-only file system")
    )
    if not denied:
        return None
    if read_only:
        return (
            f"cannot open the store at {path} read-only: {text}. A read-only open takes "
            f"no lock of ours but records its reader in LMDB's reader table, "
            f"{path / 'lock.mdb'}: it needs read access to {path / 'data.mdb'} and write "
            f"access to {path / 'lock.mdb'} (or, while that file is absent, to the "
            f"directory {path})"
        )
    return (
        f"cannot open the store at {path}: {text}. The writer needs write access to the "
        f"directory {path} and to its files (data.mdb, lock.mdb, tidal.lock, tidal.store; actors.lock under the Ray host)"
    )


class DirectoryLock:
    """This process's claim on a store directory, and with ``exclusive`` the
    ``flock`` on its ``tidal.lock`` (see module doc).

    Raises (at construction):
        DatabaseLocked: the directory is open in this process already, was open in
            the parent of this forked process, or (``exclusive``) is open in another.
        OSError: ``tidal.lock`` cannot be opened.
    """

    def __init__(self, path: Path, *, exclusive: bool) -> None:
        self.path = path
        self.key = os.path.realpath(path)
        if self.key in _REGISTRY.inherited:
            raise DatabaseLocked(
                f"{path} was open in the parent of this forked process: py-lmdb keeps "
                "one environment per file in a process, so it cannot be opened here; open "
                "it in a process started with multiprocessing's 'spawn' or 'forkserver' method"
            )
        with _REGISTRY.lock:
            if self.key in _REGISTRY.open:
                raise DatabaseLocked(f"{path} is already open in this process; close it first")
            _REGISTRY.open.add(self.key)
        self._file: IO[bytes] | None = None
        if exclusive:
            try:
                self._file = open(path / "tidal.lock", "a+b")
                try:
                    fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    holder = attached_process(path)  # LMDB's lock names it; ours does not
                    who = f" (process {holder})" if holder is not None else ""
                    raise DatabaseLocked(f"{path} is open in another process{who}") from None
                wait_for_actors(path)  # a dead facade's Ray actors may still write it
            except BaseException:
                self.release()
                raise

    def release(self) -> None:
        """Let go of the ``flock`` and of this process's claim; a second call does nothing."""
        if self._file is not None:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            finally:
                self._file.close()
                self._file = None
        with _REGISTRY.lock:
            _REGISTRY.open.discard(self.key)

    def disown(self, env: object) -> None:
        """In a forked child: keep ``env`` (the inherited environment) alive unclosed,
        close the child's copy of ``tidal.lock``'s descriptor without ``LOCK_UN`` (the
        ``flock`` belongs to the open file the parent shares: unlocking would free the
        parent's; closing only lets it go with the parent), and refuse any later open
        of the directory here. Takes no lock (another thread of the parent may have
        held one at the fork; the child has one thread)."""
        _REGISTRY.disowned.append(env)  # py-lmdb keeps its files registered: no reopen
        if self._file is not None:
            self._file.close()
            self._file = None
        _REGISTRY.open.discard(self.key)
        _REGISTRY.inherited.add(self.key)


class LockProbe:
    """A descriptor of ``lock.mdb`` on which this process takes LMDB's first-opener
    lock (byte 0, length 1) itself.

    POSIX drops every ``fcntl`` lock a process holds on a file when it closes any
    descriptor of that file, LMDB's shared lock included: `close` only after the
    environment is closed.
    """

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        self.fd = os.open(path / "lock.mdb", flags, 0o644)  # LMDB's own mode and flags

    def holder(self) -> int | None:
        """The pid of another process holding a lock on byte 0, or None (``F_GETLK``
        never reports this process's own locks)."""
        kind, pid = _unflock(fcntl.fcntl(self.fd, fcntl.F_GETLK, _flock(fcntl.F_WRLCK)))
        return None if kind == fcntl.F_UNLCK else pid

    def try_exclusive(self) -> bool:
        """Take the write lock on byte 0 without waiting; False if another process
        holds a lock there."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
            return True
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise

    def wait_shared(self) -> None:
        """Take a read lock on byte 0, waiting (``F_SETLKW``) while another process
        holds the write lock there: a compaction swapping ``data.mdb``, or a first
        opener initializing ``lock.mdb``.

        Raises:
            OSError: the lock cannot be taken (``ENOLCK``: no POSIX locks here).
        """
        fcntl.lockf(self.fd, fcntl.LOCK_SH, 1, 0, os.SEEK_SET)

    def current(self) -> bool:
        """Whether the descriptor still names the file at ``lock.mdb`` (it was not
        removed or replaced since the open)."""
        try:
            now = os.stat(self.path / "lock.mdb")
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def invalidate(self) -> None:
        """Zero the lock file's magic number (``MDB_txninfo.mti_magic``, its first 4
        bytes): an opener that finds the file already initialized then fails with
        ``MDB_INVALID``; the first opener (which holds the write lock on byte 0)
        initializes it anew. Call with the write lock held."""
        os.pwrite(self.fd, b"\0\0\0\0", 0)
        os.fsync(self.fd)

    def unlock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)

    def close(self) -> None:
        os.close(self.fd)


def reader_lock(path: Path) -> LockProbe | None:
    """A read-only open's read lock on byte 0 of ``lock.mdb`` in ``path``, taken
    (waiting while a compaction in another process swaps ``data.mdb``) before LMDB
    opens the files: read-only, LMDB opens ``data.mdb`` first and only then waits for
    its lock (mdb.c, ``mdb_env_open``), so it could hold the file a compaction is
    replacing and read it through the new file's lock state. Keep it until the
    environment is closed, then close it (see `LockProbe`): no compaction can begin
    its swap meanwhile. None where ``lock.mdb`` cannot be opened for writing or
    locked (a read-only file system: LMDB then reads without a lock file; a refused
    access: LMDB's own open names it)."""
    try:
        probe = LockProbe(path, create=True)
    except OSError:
        return None
    try:
        probe.wait_shared()
    except OSError:
        probe.close()
        return None
    return probe


def lock_voided(path: Path) -> bool:
    """Whether ``lock.mdb`` in ``path`` carries the zeroed magic number that
    `LockProbe.invalidate` writes (a compaction that did not finish). Call it only
    while this process has no LMDB environment of ``path`` open (closing the
    descriptor it reads through would drop this process's LMDB lock)."""
    try:
        fd = os.open(path / "lock.mdb", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == b"\0\0\0\0"
    except OSError:
        return False
    finally:
        os.close(fd)


def void_unlinked(fd: int, page_bytes: int) -> bool:
    """Zero the two meta pages (``page_bytes`` each) of the data file open at ``fd``
    if no directory entry names it any more (``st_nlink`` 0: it was replaced), so an
    LMDB process still holding it open finds no meta page and fails with
    ``MDB_INVALID`` instead of reading it; a file still linked elsewhere (a hard-link
    backup) is left whole. Returns whether it was zeroed.

    Raises:
        OSError: the file cannot be examined or written.
    """
    if os.fstat(fd).st_nlink != 0:
        return False
    os.pwrite(fd, bytes(2 * page_bytes), 0)
    return True


def attached_process(path: Path) -> int | None:
    """The pid of a process that has the LMDB environment in ``path`` open (a writer,
    or another reader), or None; takes and writes nothing. Call it before this process
    opens the environment: closing the descriptor it uses would drop this process's
    own LMDB lock (see `LockProbe`). ``path``: a store's directory in either layout
    (in the ``shards`` layout, its coordinator's environment is probed: a writer has
    every environment open)."""
    coordinator = env_path(path, COORDINATOR)
    if coordinator.is_dir():
        path = coordinator
    try:
        fd = os.open(path / "lock.mdb", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        kind, pid = _unflock(fcntl.fcntl(fd, fcntl.F_GETLK, _flock(fcntl.F_WRLCK)))
        return None if kind == fcntl.F_UNLCK else pid
    except OSError:
        return None
    finally:
        os.close(fd)


def fsync_path(path: Path, directory: bool = False) -> None:
    """``fsync`` the file (or, with ``directory``, the directory) at ``path``.

    Raises:
        OSError: it cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
