"""The stores without LMDB (`MemoryStore`, `NullStore`), and every store's names.

The LMDB environment itself (durability, growth, locking, compaction) is
`lmdb_env.LmdbStore`; restore (`parse_store`, `Restored`) is `restore`'s; the byte
layouts are `storage.format`'s. All are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tidal_actors.storage.format import (
    HistoryBatch,
    Keyspace,
    Op,
    decode_batch,
    decode_context,
    undecodable,
)
from tidal_actors.storage.lmdb_env import STORE_MARKER, LmdbStore
from tidal_actors.storage.protocol import HistoryMarks, HistoryStore, Store
from tidal_actors.storage.restore import (
    SNAPSHOT_FORMAT,
    Restored,
    SnapshotKey,
    parse_store,
    snapshot_key,
)

__all__ = [
    "SNAPSHOT_FORMAT",
    "STORE_MARKER",
    "HistoryBatch",
    "LmdbStore",
    "MemoryStore",
    "NullStore",
    "Op",
    "Restored",
    "SnapshotKey",
    "decode_batch",
    "decode_context",
    "parse_store",
    "snapshot_key",
    "undecodable",
]


class MemoryStore(HistoryStore):
    """A store in a dict: same keys and values as LMDB, kept in memory.

    Used by the message-driven harness, so actors can crash and be restored "from
    storage" without a disk. ``fault`` (a callable taking the ops) may raise to
    inject a failed write.
    """

    durable = True
    layout = "single"  # the keys and values of one LMDB environment

    def __init__(self) -> None:
        self.data: dict[str, dict[bytes, bytes]] = {k.value: {} for k in Keyspace}
        self.fault: Callable[[list[Op]], object] | None = None
        self.history_marks = HistoryMarks()
        self.reads_history = True

    def commit(self, ops: Iterable[Op]) -> None:
        ops = list(ops)
        if self.fault is not None:
            self.fault(ops)
        for ks, key, value in ops:
            if value is None:
                self.data[ks].pop(key, None)
            else:
                self.data[ks][key] = value
        self.history_marks.committed(ops)

    def raw_keys(self, keyspace: Keyspace) -> list[bytes]:
        return sorted(self.data[keyspace.value])

    def get_many(self, keyspace: Keyspace, keys: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        d = self.data[keyspace.value]
        return [(k, d.get(k)) for k in keys]

    def scan(self, keyspace: Keyspace) -> list[tuple[bytes, bytes]]:
        return sorted(self.data[keyspace.value].items())

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        return parse_store({ks: sorted(d.items()) for ks, d in self.data.items()}, snapshot_ledgers)

    def history_items(self) -> list[tuple[bytes, bytes]]:
        return sorted(self.data[Keyspace.HISTORY.value].items())

    def compact(self) -> dict[str, int]:
        return {"bytes_before": 0, "bytes_after": 0}

    def close(self) -> None:
        pass


class NullStore(Store):
    """The ephemeral store: commits succeed and nothing is written anywhere."""

    durable = False
    layout = None

    def commit(self, ops: Iterable[Op]) -> None:
        for _ in ops:
            pass

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        return Restored()

    def history_items(self) -> list[tuple[bytes, bytes]]:
        return []

    def compact(self) -> dict[str, int]:
        return {"bytes_before": 0, "bytes_after": 0}

    def close(self) -> None:
        pass
