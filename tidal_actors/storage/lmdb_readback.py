"""Reading the LMDB environment back: the whole store at open (`load`), the history
batch by batch, and single values or keyspaces for tools and tests.

`LmdbReadBack` is a part of `lmdb_env.LmdbStore` (it uses the environment, its lock and
its named databases); every read holds ``_env_lock`` and one read transaction, and an
LMDB failure is a `StorageError` naming the keyspace (and the key when one was read).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb

from tidal_actors._errors import StorageError
from tidal_actors.storage.format import Keyspace

if TYPE_CHECKING:
    from tidal_actors.storage.restore import Restored, SnapshotKey

__all__ = ["LmdbReadBack"]


class LmdbReadBack:
    """The reads of `lmdb_env.LmdbStore` (which sets these attributes and defines the
    liveness check)."""

    path: Path
    dbs: dict[str, lmdb._Database]
    _env_lock: threading.RLock

    def _live(self) -> lmdb.Environment:
        raise NotImplementedError

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        """Read the whole store back (membership, manifests, tombstones, history or
        the snapshot that replaces it); see :func:`storage.restore.parse_store`.

        Raises:
            StorageError: a page or a value cannot be read or decoded (naming the
                keyspace, and the key when one was read).
        """
        from tidal_actors.storage.restore import parse_store

        with self.reading() as keyspaces:
            return parse_store(keyspaces, snapshot_ledgers)

    @contextmanager
    def reading(self) -> Iterator[dict[str, Iterable[tuple[bytes, bytes]]]]:
        """Every keyspace's ``(key, value)`` pairs, in key order, read in one read
        transaction (and under ``_env_lock``) held until the block ends: what
        `load` decodes, and what a sharded store (`storage.sharded`) merges.

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read
                (iterating: naming the keyspace and the last key read).
        """
        with self._env_lock, self._begin() as txn:
            yield {k.value: self._read(txn, k) for k in Keyspace}

    def adopt_map_size(self) -> None:
        raise NotImplementedError

    def _begin(self) -> lmdb.Transaction[bytes]:
        """A read transaction (call with ``_env_lock`` held); a map another process
        grew since (``MDB_MAP_RESIZED``) is adopted first."""
        try:
            try:
                return self._live().begin(buffers=False)
            except lmdb.MapResizedError:
                self.adopt_map_size()
                return self._live().begin(buffers=False)
        except lmdb.Error as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc

    def _read(
        self, txn: lmdb.Transaction[bytes], keyspace: Keyspace
    ) -> Iterator[tuple[bytes, bytes]]:
        """A keyspace's ``(key, value)`` pairs; an LMDB failure (a corrupt page) is a
        StorageError naming the keyspace and the last key read before it."""
        key = None
        try:
            for key, value in txn.cursor(db=self.dbs[keyspace.value]):
                yield key, value
        except lmdb.Error as exc:
            after = f" after key {key.hex()}" if key is not None else ""
            raise StorageError(
                f"cannot read the {keyspace.value} keyspace of {self.path}{after}: {exc}"
            ) from exc

    def history_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every durable history batch ``(key, value)``, in key order, one at a time
        (a read transaction, and the environment's lock, held until the iterator is
        exhausted or closed; consume it before committing from another thread)."""
        with self._env_lock, self._begin() as txn:
            yield from self._read(txn, Keyspace.HISTORY)

    def raw_get(self, keyspace: Keyspace, key: bytes) -> bytes | None:
        """Read one value (tests and `inspect`).

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read it.
        """
        with self._env_lock, self._begin() as txn:
            try:
                v = txn.get(key, db=self.dbs[keyspace.value])
            except lmdb.Error as exc:
                raise StorageError(
                    f"cannot read {keyspace.value} key {key.hex()} of {self.path}: {exc}"
                ) from exc
            return bytes(v) if v is not None else None

    def get_many(self, keyspace: Keyspace, keys: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        """``(key, value or None)`` of each key, in one read transaction.

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read.
        """
        with self._env_lock, self._begin() as txn:
            db = self.dbs[keyspace.value]
            try:
                out = []
                for key in keys:
                    v = txn.get(key, db=db)
                    out.append((key, bytes(v) if v is not None else None))
                return out
            except lmdb.Error as exc:
                raise StorageError(
                    f"cannot read the {keyspace.value} keyspace of {self.path}: {exc}"
                ) from exc

    def scan(self, keyspace: Keyspace) -> list[tuple[bytes, bytes]]:
        """Every ``(key, value)`` of ``keyspace``, in key order, in one read transaction.

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read it.
        """
        with self._env_lock, self._begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in self._read(txn, keyspace)]

    def raw_keys(self, keyspace: Keyspace) -> list[bytes]:
        """Every key of ``keyspace``, in key order, values not read (`inspect`).

        Raises:
            DatabaseClosed: the store is closed. StorageError: LMDB failed to read it.
        """
        with self._env_lock, self._begin() as txn:
            return [bytes(k) for k, _ in self._read(txn, keyspace)]
