"""A read-only view of a store: one read transaction, then no hold on the files.

Owns `SnapshotStore`, what ``TidalDb.open(path, read_only=True)`` (and so
``tidal-actors inspect``) reads through. It takes no lock of ours (``tidal.lock``
stays the writer's), reads the whole store in one LMDB read transaction (so what it
holds is a consistent snapshot as of that read, even while a writer in another
process commits), keeps the small keyspaces' pairs, and then closes the environment:
its reader slot is free again, so a writer's ``compact()`` is refused only while
that one read runs. Its open takes LMDB's read lock before LMDB opens the files
(`lmdb_lock.reader_lock`), so an open made while a compaction swaps ``data.mdb``
waits and then reads the new file. Must not write: no commit, no lock file of ours, nothing created.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb

from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, StorageError
from tidal_actors.storage.format import Keyspace
from tidal_actors.storage.lmdb_env import LmdbStore
from tidal_actors.storage.restore import Restored, SnapshotKey, parse_store
from tidal_actors.storage.sharded import ShardedStore, layout_of

__all__ = ["ShardedSnapshotStore", "SnapshotStore", "latest_event", "open_snapshot_store"]

# users and items are small; the history is kept so that the ledgers, which settle
# the detail of records out of the log, read them back as of the same read
# (`storage.history.HistoryReader`); meta (snapshot chunks) is not kept
_KEPT = (Keyspace.USERS, Keyspace.ITEMS, Keyspace.HISTORY)


def latest_event(restored: Restored) -> int | None:
    """The latest contribution's time (int ns) in ``restored``'s history, if any."""
    stamps = [int(b.ts.max()) for b in restored.batches if len(b.ts)]
    return max(stamps) if stamps else None


class SnapshotStore(LmdbStore):
    """A store opened read-only and detached after :meth:`load`.

    Raises (at construction): StorageError when ``path`` holds no store, or LMDB
    cannot open it; DatabaseLocked when this process has it open already (py-lmdb
    keeps one environment per file in a process: read through that database).
    """

    def __init__(self, path: str | os.PathLike[str], config: Config) -> None:
        super().__init__(path, config, read_only=True)
        self._kept: dict[str, dict[bytes, bytes]] | None = None
        self.read_at_ns: int | None = None  # wall time of the read (int ns)
        self.recorded_settings = (
            False  # whether the store records its settings (`facades.readonly`)
        )
        self.latest_event_ns: int | None = None  # the latest contribution's time, if replayed

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        """Read everything in one read transaction (see `LmdbStore.load`), then detach."""
        with self.reading() as keyspaces:
            restored = parse_store(keyspaces, snapshot_ledgers)
        self.latest_event_ns = latest_event(restored)
        return restored

    @contextmanager
    def reading(self) -> Iterator[dict[str, Iterable[tuple[bytes, bytes]]]]:
        """Every keyspace in one read transaction (see `LmdbStore.reading`); the users,
        items and history keyspaces are read whole and kept (for `raw_get`, `scan`,
        the ledgers' reads of the history), and the store detaches when the block ends.

        A writer that grew the map since this open makes LMDB refuse the transaction
        (``MDB_MAP_RESIZED``): the new size is adopted and the read begins again."""
        for attempt in range(5):
            with self._env_lock:
                try:
                    txn = self._live().begin(buffers=False)
                except lmdb.MapResizedError:
                    if attempt == 4:
                        raise StorageError(
                            f"cannot read {self.path}: its map keeps growing"
                        ) from None
                    self._live().set_mapsize(0)  # LMDB takes the size the writer's meta page names
                    continue
                except lmdb.Error as exc:
                    raise StorageError(f"cannot read {self.path}: {exc}") from exc
                self.read_at_ns = time.time_ns()
                kept: dict[str, dict[bytes, bytes]] = {k.value: {} for k in _KEPT}
                with txn:
                    # kept keyspaces are read whole (a valid snapshot skips the history)
                    yield {
                        k.value: (
                            list(self._keep(txn, k, kept[k.value]))
                            if k in _KEPT
                            else self._read(txn, k)
                        )
                        for k in Keyspace
                    }
                self._kept = kept
                self._detach()
                return
        raise AssertionError("unreachable")

    def _keep(
        self, txn: lmdb.Transaction[bytes], keyspace: Keyspace, into: dict[bytes, bytes]
    ) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._read(txn, keyspace):
            into[bytes(key)] = bytes(value)
            yield key, value

    def _detach(self) -> None:
        """Close the environment (its reader slot freed); this process may open the
        store again, as a writer too."""
        self._close_env()
        if self._probe is not None:  # after the environment: see `lmdb_lock.LockProbe`
            self._probe.close()
            self._probe = None
        self._dirlock.release()

    def close(self) -> None:
        """Let go of what was kept (and of the environment, if :meth:`load` never ran)."""
        with self._env_lock:
            if self._kept is None:
                super().close()
            self._kept = None
            self._closed = True

    def _snapshot(self, keyspace: Keyspace) -> dict[bytes, bytes]:
        if self._closed:
            raise DatabaseClosed(f"the store at {self.path} is closed")
        if self._kept is None or keyspace.value not in self._kept:
            raise StorageError(
                f"{self.path} was read once, at its read-only open; its {keyspace.value} "
                "keyspace is not kept: open it again to read it"
            )
        return self._kept[keyspace.value]

    def raw_get(self, keyspace: Keyspace, key: bytes) -> bytes | None:
        """One value as of the read (users and items keyspaces)."""
        return self._snapshot(keyspace).get(bytes(key))

    def raw_keys(self, keyspace: Keyspace) -> list[bytes]:
        """Every key of ``keyspace`` as of the read, in key order."""
        return sorted(self._snapshot(keyspace))

    def get_many(self, keyspace: Keyspace, keys: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        """``(key, value or None)`` of each key as of the read."""
        kept = self._snapshot(keyspace)
        return [(k, kept.get(bytes(k))) for k in keys]

    def scan(self, keyspace: Keyspace) -> list[tuple[bytes, bytes]]:
        """Every ``(key, value)`` of ``keyspace`` as of the read, in key order."""
        return sorted(self._snapshot(keyspace).items())

    def history_items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.scan(Keyspace.HISTORY))


class ShardedSnapshotStore(ShardedStore):
    """`SnapshotStore` for a store of the ``shards`` layout: each environment read
    once (one read transaction each: the ledgers' first, `ShardedStore.reading`),
    kept, and detached.

    Raises (at construction): as `SnapshotStore`.
    """

    def __init__(self, path: str | os.PathLike[str], config: Config) -> None:
        super().__init__(
            path, config, read_only=True, open_env=lambda p, ro: SnapshotStore(p, config)
        )
        self.read_at_ns: int | None = None
        self.recorded_settings = False
        self.latest_event_ns: int | None = None

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        """Read every environment (see `ShardedStore.load`), then detach them all."""
        try:
            restored = super().load(snapshot_ledgers)
        finally:
            if self._dirlock is not None:  # as a SnapshotStore's: this process may open it again
                self._dirlock.release()
                self._dirlock = None
        self.read_at_ns = min(
            t for e in self.envs.values() if (t := getattr(e, "read_at_ns", None)) is not None
        )
        self.latest_event_ns = latest_event(restored)
        return restored


def open_snapshot_store(
    path: str | os.PathLike[str], config: Config
) -> SnapshotStore | ShardedSnapshotStore:
    """The read-only view of the store at ``path``, in its layout (`layout.layout_of`)."""
    if layout_of(Path(path), config) == "shards":
        return ShardedSnapshotStore(path, config)
    return SnapshotStore(path, config)
