"""The contract between the runtime and a store: `Store`, and `HistoryStore` for a
store whose history a ledger reads back while it runs (with its `HistoryMarks`).

Implemented by `lmdb_env.LmdbStore` (durable, on disk), `lmdb_reader.SnapshotStore`
(read-only, detached after its one read), `stores.MemoryStore` (durable in a dict,
for the deterministic harness) and `stores.NullStore` (ephemeral: nothing kept).
Only the persistence actor commits; restore (`load`) runs once at open, before any
actor starts. Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from tidal_actors.storage.format import Keyspace, Op, Tag, batch_key_shard_seq
from tidal_actors.storage.restore import Restored, SnapshotKey

__all__ = ["HistoryMarks", "HistoryStore", "Store"]

_BATCH_TAG = int(Tag.CONTRIBUTION_BATCH)


class HistoryMarks:
    """Per store: ``top[shard]`` is one past the highest history batch sequence of
    ledger ``shard`` committed since the open; ``rewrites`` counts commits that took
    records out of the history."""

    def __init__(self) -> None:
        self.top: dict[int, int] = {}
        self.rewrites = 0  # batches rewritten or deleted (erasure, retention)

    def rewritten(self) -> None:
        """Records left the history (a purge's erasure, retention): what a ledger
        read of it before may have changed (called by persistence after the commit)."""
        self.rewrites += 1

    def committed(self, ops: Iterable[Op]) -> None:
        """Note a committed transaction's ops (called by the store after the commit)."""
        top = self.top
        for ks, key, value in ops:
            if (
                ks == Keyspace.HISTORY.value
                and value is not None
                and len(key) == 18
                and key[9] == _BATCH_TAG
            ):
                shard, seq = batch_key_shard_seq(key)
                seq += 1
                if seq > top.get(shard, 0):
                    top[shard] = seq


class Store(Protocol):
    """What the runtime and the persistence behaviour call on any store."""

    durable: bool
    """True when commits are kept (LMDB, memory); False for the ephemeral store."""
    layout: str | None
    """The layout (`storage.layout`): ``"single"`` or ``"shards"`` (the memory store
    holds one environment's keys: ``"single"``); None for the ephemeral store."""

    def commit(self, ops: Iterable[Op]) -> None:
        """Apply ``ops`` (``(keyspace, key, value)``; value None deletes) in one
        transaction, all or nothing.

        Raises:
            StorageFull: the store cannot grow to hold them; nothing written.
            StorageError: any other failure (or a read-only store); nothing written.
        """
        ...

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        """Everything the store holds, decoded (`restore.parse_store`).

        Raises:
            StorageError: a key or value does not decode, or cannot be read.
        """
        ...

    def history_items(self) -> Iterable[tuple[bytes, bytes]]:
        """Every history batch ``(key, value)``, in key order (an iterator may hold a
        read transaction until it is exhausted or closed)."""
        ...

    def compact(self) -> dict[str, int]:
        """Reclaim the space of deleted records: ``{"bytes_before", "bytes_after"}``
        (data file sizes in bytes; 0 and 0 for a store without a file).

        Raises:
            StorageError: compaction was refused or failed; nothing changed.
        """
        ...

    def close(self) -> None:
        """Release the store; a second call does nothing."""
        ...


class HistoryStore(Store, Protocol):
    """A durable store whose history a ledger shard reads back while the database
    runs (`history.HistoryReader`)."""

    history_marks: HistoryMarks
    """Updated after each commit: the highest history batch committed per ledger shard."""
    reads_history: bool
    """Whether the history can be read back while the store is open."""

    def raw_keys(self, keyspace: Keyspace) -> list[bytes]:
        """Every key of ``keyspace``, in key order.

        Raises:
            DatabaseClosed: the store is closed. StorageError: it cannot be read.
        """
        ...

    def get_many(self, keyspace: Keyspace, keys: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        """``(key, value or None)`` of each of ``keys``, read at one point in time.

        Raises:
            DatabaseClosed: the store is closed. StorageError: it cannot be read.
        """
        ...

    def scan(self, keyspace: Keyspace) -> list[tuple[bytes, bytes]]:
        """Every ``(key, value)`` of ``keyspace``, in key order.

        Raises:
            DatabaseClosed: the store is closed. StorageError: it cannot be read.
        """
        ...
