"""Compaction of the LMDB environment: the file rewritten without free pages.

Other processes reading the files (a backup tool, ``mdb_stat``): LMDB takes a POSIX
``fcntl`` read lock on byte 0 of ``lock.mdb`` for every process that has the
environment open; a process that finds no other lock there takes a write lock,
re-initializes the lock file (last transaction id, reader table) and downgrades to
the read lock (mdb.c: ``mdb_env_excl_lock``, ``mdb_env_setup_locks``,
``mdb_env_share_locks``). Compaction replaces ``data.mdb``; a process still
attached would keep ``lock.mdb``'s state of the old file alive, and the new file
would read as empty. So `compact` takes that write lock itself (`LockProbe`) once
its environment is closed: held by another process, compaction is refused, naming
it, and nothing changes; otherwise the file is swapped and reopened under the
lock, so LMDB re-initializes ``lock.mdb`` for the new file. A process attaching
meanwhile waits in LMDB's ``F_SETLKW`` until the reopen downgrades the lock.

`Compaction` is a part of `lmdb_env.LmdbStore` (it uses the environment, its lock
and its reopen); kept here so the opening and the compaction read apart.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import lmdb

from tidal_actors._errors import StorageError
from tidal_actors.storage.lmdb_lock import LockProbe, fsync_path

__all__ = ["Compaction"]


class Compaction:
    """`compact` for `lmdb_env.LmdbStore` (which sets these attributes and defines
    the environment's open, close and liveness check)."""

    path: Path
    read_only: bool
    env: lmdb.Environment | None
    _env_lock: threading.RLock
    _probe: LockProbe | None
    _broken: str | None

    def _live(self) -> lmdb.Environment:
        raise NotImplementedError

    def _open_env(self) -> None:
        raise NotImplementedError

    def _open_dbs(self) -> None:
        raise NotImplementedError

    def _close_env(self) -> None:
        raise NotImplementedError

    def check_compact(self) -> None:
        """Raise now the `StorageError` that `compact` would refuse with before
        copying anything (open read-only, ``lock.mdb`` replaced, another process
        attached), changing nothing: the persistence actor asks before it rewrites
        the history for a compaction (`storage.history_compact`).

        Raises:
            StorageError: as `compact`'s refusals.
        """
        with self._env_lock:
            self._live()
            self._refuse_early()
            pid = self._probe_holder()
            if pid is not None:
                raise self._refusal(pid)

    def _refuse_early(self) -> None:
        if self.read_only:
            raise StorageError(f"{self.path} is open read-only: compaction refused")
        assert self._probe is not None
        if not self._probe.current():
            raise StorageError(
                f"compaction refused: {self.path / 'lock.mdb'} was removed or replaced "
                "while the store was open, so who else has it open cannot be told; "
                "nothing was changed: close the store and open it again"
            )

    def compact(self) -> dict[str, int]:
        """Rewrite the environment without free pages (``mdb_env_copy2`` with
        ``MDB_CP_COMPACT``), so bytes of deleted records are gone from the file, and
        swap the copy in (see the module doc for processes reading beside it).

        Returns ``{"bytes_before": int, "bytes_after": int}`` (data file sizes).

        Raises:
            StorageError: another process has the environment open (named by its
                pid), the store is open read-only, or the copy or the swap failed;
                the old file stays in use, unchanged.
        """
        with self._env_lock:
            self._live()
            self._refuse_early()
            data = self.path / "data.mdb"
            before = data.stat().st_size
            tmp = self.path / "compact.tmp"
            try:
                self._remove(tmp)
                tmp.mkdir()
                self._live().copy(str(tmp), compact=True)
                fsync_path(tmp / "data.mdb")  # LMDB writes the copy without syncing it
            except (OSError, lmdb.Error) as exc:
                self._remove(tmp)
                raise StorageError(f"compaction failed: {exc}") from exc
            pid = self._probe_holder()
            if pid is not None:  # refused while still open: nothing to undo
                self._remove(tmp)
                raise self._refusal(pid)
            self._close_env()
            assert self._probe is not None
            if not self._take_exclusive():  # attached between the check and the close
                pid = self._probe_holder()
                self._remove(tmp)
                self._reopen()
                raise self._refusal(pid)
            try:
                # lock.mdb still describes the old file (its last transaction id picks
                # the meta page): void it first, so a process that attaches before this
                # one reopens (or after it dies here) fails with MDB_INVALID instead of
                # reading the new file through the old state; the first opener rebuilds it
                self._probe.invalidate()
                os.replace(tmp / "data.mdb", data)
                fsync_path(self.path, directory=True)
            except OSError as exc:
                self._reopen()  # the old file (LMDB re-initializes its lock file)
                self._remove(tmp)
                raise StorageError(f"compaction failed: {exc}") from exc
            # still holding byte 0: LMDB sees itself as the first opener, re-initializes
            # lock.mdb for the new file, then downgrades this process's lock to shared
            self._reopen()
            with contextlib.suppress(OSError):
                self._remove(tmp)
            return {"bytes_before": before, "bytes_after": data.stat().st_size}

    def _take_exclusive(self) -> bool:
        """Take byte 0 of lock.mdb; False if another process holds it (a process that
        let go between the attempt and the look is given two more chances)."""
        assert self._probe is not None
        for _ in range(3):
            if self._probe.try_exclusive():
                return True
            if self._probe.holder() is not None:
                return False
        return False

    def _probe_holder(self) -> int | None:
        assert self._probe is not None
        return self._probe.holder()

    def _refusal(self, pid: int | None) -> StorageError:
        who = f"process {pid}" if pid is not None else "another process"
        return StorageError(
            f"compaction refused: {who} has the LMDB environment at {self.path} open "
            "(a reader outside tidal_actors: a backup, mdb_stat, a monitor); replacing "
            "data.mdb under it would lose the store. Nothing was changed: compact again "
            "once it has closed the environment"
        )

    def _reopen(self) -> None:
        """Open the environment again after compaction closed it, then let go of the
        probe's write lock if the open failed (LMDB's own shared lock replaced it if
        not). A failure leaves the store closed: every later use raises StorageError."""
        assert self._probe is not None
        try:
            self._open_env()
            self._open_dbs()
        except (lmdb.Error, StorageError) as exc:
            self._close_env()
            self._probe.unlock()
            self._broken = (
                f"the LMDB environment at {self.path} could not be reopened after compaction: {exc}"
            )
            raise StorageError(self._broken) from exc

    @staticmethod
    def _remove(tmp: Path) -> None:
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
