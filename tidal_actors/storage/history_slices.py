"""Reading the durable history a slice at a time, the environment's lock held only
while a slice is read, so the persistence actor commits between slices.

A purge's erasure reads every history batch's index (`history_rewrite`); read in
one transaction under the environment's lock (`LmdbStore.history_items`) that holds
off every commit for the whole scan. Read in slices from another thread, each slice
is one short read transaction, and a commit waits for at most one slice. Batches
committed between two slices are seen if their keys sort after the slice read last
(a batch key is its ledger shard, then its sequence number).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from tidal_actors._errors import StorageError
from tidal_actors.storage.format import Keyspace

__all__ = ["SLICE_BATCHES", "HistorySlices"]

SLICE_BATCHES = 256  # history batches read in one read transaction


class HistorySlices:
    """`history_slices` for `lmdb_env.LmdbStore` (which sets these attributes and
    defines the environment's liveness check and read transactions)."""

    path: Path
    dbs: dict[str, Any]
    _env_lock: threading.RLock

    def _begin(self) -> lmdb.Transaction[bytes]:
        raise NotImplementedError

    def history_slice(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` history batches ``(key, value)`` whose keys sort after
        ``after`` (None: from the first), in key order, read in one read transaction.

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read.
        """
        out: list[tuple[bytes, bytes]] = []
        with self._env_lock, self._begin() as txn:
            try:
                cursor = txn.cursor(db=self.dbs[Keyspace.HISTORY.value])
                found = cursor.first() if after is None else cursor.set_range(after)
                while found and len(out) < limit:
                    key = cursor.key()
                    if after is None or key != after:
                        out.append((key, cursor.value()))
                    found = cursor.next()
            except lmdb.Error as exc:
                raise StorageError(
                    f"cannot read the history keyspace of {self.path}: {exc}"
                ) from exc
        return out

    def history_slices(self, limit: int = SLICE_BATCHES) -> Iterator[tuple[bytes, bytes]]:
        """Every history batch ``(key, value)`` in key order, read `history_slice` by
        slice of ``limit``: no transaction or lock is held between slices.

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read.
        """
        after: bytes | None = None
        while True:
            part = self.history_slice(after, limit)
            yield from part
            if len(part) < limit:
                return
            after = part[-1][0]
