"""The LMDB environment: opening it, guarding it between threads, and compacting it.

Owns every LMDB call (`restore` owns decoding what is read back; `storage.format`
the bytes). Only the persistence actor commits; restore runs once at open, before any
actor starts.

* Durability: ``sync=True, metasync=True``, no ``writemap``/``map_async``, so a
  committed transaction survives a crash.
* Map full: the transaction is aborted whole (LMDB rolls it back), the map doubles
  with no transaction of ours open, and the same batch is retried, up to
  ``Config.max_map_size_bytes``; past that, `StorageFull` and nothing written. The
  same holds for the named databases LMDB creates at open.
* One writer per directory (`lmdb_lock.DirectoryLock`). A read-only opener takes no
  lock file of ours: LMDB serves it a reader slot beside the writer of another
  process (`lmdb_reader.SnapshotStore` reads everything in one transaction, then
  lets go).
* Threads: ``env`` is used from the persistence thread (commits, compaction) and from
  callers' threads (`raw_get`, `load`, `history_items`). One lock, ``_env_lock``, is
  held by every use of it, so none meets an environment that compaction closed or a
  map that growth is resizing (``set_mapsize`` invalidates read transactions open at
  that moment). `flags` answers from the flags read at open and touches nothing.
* Reading back (the store at open, the history, single values): `lmdb_readback`.
* Compaction, and other processes reading the files: `lmdb_compact`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb

from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, StorageError, StorageFull
from tidal_actors.storage.format import Keyspace
from tidal_actors.storage.history_slices import HistorySlices
from tidal_actors.storage.layout import STORE_MARKER
from tidal_actors.storage.lmdb_compact import Compaction
from tidal_actors.storage.lmdb_lock import (
    DirectoryLock,
    LockProbe,
    access_denied,
    lock_voided,
    reader_lock,
)
from tidal_actors.storage.lmdb_readback import LmdbReadBack
from tidal_actors.storage.protocol import HistoryMarks, HistoryStore

if TYPE_CHECKING:
    from tidal_actors.storage.format import Op

__all__ = ["STORE_MARKER", "LmdbStore"]


class LmdbStore(Compaction, LmdbReadBack, HistorySlices, HistoryStore):
    """An LMDB environment with the keyspaces of `Keyspace`.

    Args:
        path: directory (created if missing).
        config: sizes (``map_size_bytes``, ``max_map_size_bytes``).
        read_only: `commit` refuses any op (``data.mdb`` is never written), and no
            lock of ours is taken (``tidal.lock`` is not even opened): it reads beside
            a writer in another process; the directory must hold a store. LMDB's read
            lock is taken before LMDB opens ``data.mdb``, waiting while a compaction
            in another process swaps it (`lmdb_lock.reader_lock`).

    Raises:
        DatabaseLocked: the directory is open already (this or another process).
        StorageFull: LMDB's own records at open do not fit in ``max_map_size_bytes``.
        StorageError: LMDB could not open it (``lock.mdb`` voided by a compaction
            that did not finish while another process has it open: named so).
    """

    durable = True
    layout: str | None = "single"

    def __init__(
        self, path: str | os.PathLike[str], config: Config, *, read_only: bool = False
    ) -> None:
        self.path = Path(path)
        self.config = config
        # read_only: the open itself writes nothing either (`Core` skips its snapshot
        # and meta writes)
        self.read_only = read_only
        self.env: lmdb.Environment | None = None
        self.dbs: dict[str, lmdb._Database] = {}
        self._flags: dict[str, Any] = {}
        self._probe: LockProbe | None = None
        self._broken: str | None = None  # why the environment is not open, if not closed
        self._env_lock = threading.RLock()
        # test hook: called with the ops before each commit; raising injects a failure
        self.fault: Callable[[list[Op]], object] | None = None
        self.history_marks = HistoryMarks()  # what the ledgers may read back (`storage.history`)
        self.reads_history = True  # the history can be read back while open
        self._closed = False
        if self.path.exists() and not self.path.is_dir():
            raise StorageError(f"{self.path} is a file, not a directory: a store is a directory")
        try:
            if read_only and not (self.path / "data.mdb").is_file():
                raise StorageError(f"{self.path} holds no store (no data.mdb); nothing was read")
            if not read_only:
                self.path.mkdir(parents=True, exist_ok=True)
            # a store was made here before: it must still hold its format record
            self.existed = (self.path / STORE_MARKER).exists()
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot create the directory {self.path}: {exc}") from exc
        try:  # a reader takes no lock file of ours: it reads beside a writer
            self._dirlock = DirectoryLock(self.path, exclusive=not read_only)
        except OSError as exc:
            why = access_denied(self.path, read_only, exc)
            raise StorageError(why or f"cannot open LMDB at {self.path}: {exc}") from exc
        try:
            if read_only:
                self._probe = reader_lock(self.path)  # before LMDB opens data.mdb
            map_size = config.map_size_bytes
            data = self.path / "data.mdb"
            if data.exists():
                map_size = max(map_size, data.stat().st_size)
            self.map_size = map_size
            self._open_env()
            if not read_only:
                self._probe = LockProbe(self.path)
                # reader slots left by killed processes (a read transaction open at the
                # kill) stay taken while any other process has the environment open: free them
                self.stale_readers = self._live().reader_check()
            # a data file cut short would fault (SIGBUS) on the first page read past
            # its end: compare its size with the last page the meta page names
            env = self._live()
            needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            if data.exists() and data.stat().st_size < needed:
                raise StorageError(
                    f"{data} is truncated: {data.stat().st_size} bytes, its pages need {needed}"
                )
            self._open_dbs()
        except BaseException as exc:
            # whatever failed, the directory must not stay registered as open here
            self._close_env()
            self._release()
            if isinstance(exc, lmdb.InvalidError) and lock_voided(self.path):
                raise StorageError(
                    f"cannot open LMDB at {self.path}: its lock file, "
                    f"{self.path / 'lock.mdb'}, was voided by a compaction that did not "
                    "finish (the compacting process ended while swapping data.mdb) and "
                    "another process still has the environment open; data.mdb is whole "
                    "(the file before the compaction or the one after): open again once "
                    "no other process has it open (the first opener rebuilds the lock file)"
                ) from exc
            if isinstance(exc, (lmdb.Error, OSError)):
                why = access_denied(self.path, read_only, exc)
                raise StorageError(why or f"cannot open LMDB at {self.path}: {exc}") from exc
            raise

    def _open_env(self) -> None:
        self.env = lmdb.open(
            str(self.path),
            map_size=self.map_size,
            max_dbs=8,
            subdir=True,
            sync=True,
            metasync=True,
            writemap=False,
            map_async=False,
            lock=True,
            readahead=False,
            max_readers=126,
            readonly=self.read_only,
        )
        self._flags = dict(self.env.flags())

    def _open_dbs(self) -> None:
        """Open the named databases: create them in a new store (growing the map while
        LMDB's own records do not fit: a map below the minimum, or pages larger than
        4 KiB); in a store made before, or a read-only open, write nothing: a missing
        one is damage, a `StorageError`, never silently made anew."""
        create = not (self.existed or self.read_only)
        while True:
            try:
                env = self._live()
                self.dbs = {k.value: env.open_db(k.value.encode(), create=create) for k in Keyspace}
                return
            except lmdb.NotFoundError:
                missing = [k.value for k in Keyspace if not self._has_db(k.value)]
                raise StorageError(
                    f"the store at {self.path} has no {', '.join(missing)} keyspace: it is "
                    "damaged (or not a tidal_actors store); nothing was written"
                ) from None
            except lmdb.MapFullError:
                self._grow()

    def _has_db(self, name: str) -> bool:
        try:
            self._live().open_db(name.encode(), create=False)
            return True
        except lmdb.NotFoundError:
            return False

    def _close_env(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()

    def _release(self) -> None:
        if self._probe is not None:  # after the environment: see LockProbe
            self._probe.close()
            self._probe = None
        self._closed = True
        self._dirlock.release()

    def _live(self) -> lmdb.Environment:
        """The open environment (call with ``_env_lock`` held).

        Raises:
            DatabaseClosed: the store was closed.
            StorageError: a failed compaction left it closed.
        """
        if self.env is None:
            if self._broken is not None:
                raise StorageError(self._broken)
            raise DatabaseClosed(f"the store at {self.path} is closed")
        return self.env

    def flags(self) -> dict[str, Any]:
        """The environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``, ...),
        as read when it was last opened (they never change while it is open), so this
        never waits for a compaction.

        Raises:
            DatabaseClosed: the store is closed. StorageError: a failed compaction
                left it closed.
        """
        if self._closed:
            raise DatabaseClosed(f"the store at {self.path} is closed")
        if self._broken is not None:
            raise StorageError(self._broken)
        return dict(self._flags)

    def commit(self, ops: Iterable[Op]) -> None:
        """Apply ``ops`` in one durable transaction (value None deletes the key).

        Raises:
            StorageFull: the map would exceed ``max_map_size_bytes``; nothing written.
            StorageError: any other LMDB failure; nothing written.
        """
        ops = list(ops)
        if self.read_only:
            if ops:
                raise StorageError(f"{self.path} is open read-only: {len(ops)} write(s) refused")
            return
        if self.fault is not None:
            self.fault(ops)
        with self._env_lock:
            env = self._live()
            while True:
                try:
                    with env.begin(write=True) as txn:
                        for ks, key, value in ops:
                            db = self.dbs[ks]
                            if value is None:
                                txn.delete(key, db=db)
                            else:
                                txn.put(key, value, db=db)
                    self.history_marks.committed(ops)
                    return
                except lmdb.MapFullError:
                    self._grow()
                except lmdb.MapResizedError:  # another process grew it: take its size, retry
                    self.adopt_map_size()
                except lmdb.Error as exc:
                    raise StorageError(f"LMDB commit failed: {exc}") from exc

    def take_over_writes(self) -> None:
        """Begin and abort a write transaction. A writer whose process died inside a
        commit leaves LMDB's shared record of the last transaction behind the data
        file's (so other processes' readers go on reading the transaction before
        it) until the next writer takes the write lock and repairs it: a process
        taking over another's writes calls this before anyone reads what that one
        wrote (`runtime.ray_restart.restore`).

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB refused.
        """
        if self.read_only:
            return
        with self._env_lock:
            try:
                self._live().begin(write=True).abort()
            except lmdb.Error as exc:
                raise StorageError(f"cannot take over the writes of {self.path}: {exc}") from exc

    def adopt_map_size(self) -> None:
        """Take the map size another process grew the environment to (no transaction
        of this process may be open).

        Raises:
            DatabaseClosed: the store is closed.
        """
        with self._env_lock:
            env = self._live()
            env.set_mapsize(0)  # LMDB takes the size the meta page names
            self.map_size = env.info()["map_size"]

    def _grow(self) -> None:
        """Double the map (with no transaction of ours open), up to the maximum."""
        new = self.map_size * 2
        if new > self.config.max_map_size_bytes:
            if self.map_size >= self.config.max_map_size_bytes:
                raise StorageFull(
                    f"LMDB map is full at {self.map_size} bytes (max_map_size_bytes="
                    f"{self.config.max_map_size_bytes})"
                )
            new = self.config.max_map_size_bytes
        with self._env_lock:
            self._live().set_mapsize(new)
        self.map_size = new

    def disown(self) -> None:
        """In a forked child: forget the environment without closing it (closing would
        end transactions a parent's thread had open at the fork, in the shared reader
        table) and close the child's copy of the directory lock's descriptor without
        ``LOCK_UN`` (the ``flock`` belongs to the open file the parent shares: unlocking
        would free the parent's; closing only lets it go with the parent). Takes no
        lock (another thread of the parent may have held one at the fork). Later calls
        see a closed store; opening the same store again in the child is refused."""
        self._dirlock.disown(self.env)
        self.env = None
        if self._probe is not None:
            self._probe.close()  # fcntl locks are not inherited: the child holds none
            self._probe = None
        self._closed = True

    def close(self) -> None:
        """Close the environment and release the directory; a second call is a no-op."""
        with self._env_lock:
            if self._closed:
                return
            try:
                self._close_env()
            finally:
                self._release()
