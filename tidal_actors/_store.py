"""Storage: the one LMDB environment, its keyspaces, group commits and restore.

Owns every LMDB call. Only the persistence actor commits; restore runs once at open,
before any actor starts. Layouts are in `_codec.py`.

* Durability: ``sync=True, metasync=True``, no ``writemap``/``map_async``, so a
  committed transaction survives a crash (issue 2, "Control operations").
* Map full: the transaction is aborted whole (LMDB rolls it back), the map doubles
  with no transaction of ours open, and the same batch is retried, up to
  ``Config.max_map_size_bytes``; past that, `StorageFull` and nothing written.
* One opener per directory: a process-wide registry refuses a second open in this
  process (py-lmdb refuses it too, less clearly) and an exclusive ``flock`` on
  ``tidal.lock`` refuses a second process.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np

from ._codec import Keyspace, Tag, decode_key, decode_membership
from ._config import Config
from ._errors import DatabaseLocked, StorageError, StorageFull

__all__ = ["HistoryBatch", "LmdbStore", "MemoryStore", "NullStore", "Restored", "parse_store"]

SNAPSHOT_FORMAT = 4
STORE_MARKER = "tidal.store"  # written once a store's format record is committed
_open_paths: set[str] = set()
_open_lock = threading.Lock()
_DISOWNED: list[Any] = []  # environments and lock files a forked child inherited

Op = tuple[str, bytes, "bytes | None"]


@dataclass
class HistoryBatch:
    """One durable batch of contribution records, as columns (numpy arrays)."""

    shard: int
    seq: int
    cohorts: list[str]
    ci: np.ndarray
    m: np.ndarray
    r: np.ndarray
    u: np.ndarray
    e: np.ndarray
    t: np.ndarray
    w: np.ndarray
    ts: np.ndarray
    # record index -> its signal context's msgpack bytes (`decode_context` reads one)
    contexts: dict[int, Any] | None = None


def decode_context(raw: Any) -> Any:
    """A stored signal context as the mapping it was: msgpack bytes (a context is
    packed at the call), or the mapping itself in stores written before that. A
    tuple key comes back as a tuple (msgpack stores it as an array)."""
    if not isinstance(raw, bytes):
        return raw
    return msgpack.unpackb(raw, strict_map_key=False, object_pairs_hook=_pairs, use_list=True)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_hashable(k): v for k, v in pairs}


def decode_batch(shard: int, seq: int, raw: bytes) -> HistoryBatch:
    try:
        d = msgpack.unpackb(raw, strict_map_key=False)
    except TypeError:
        # a signal context with a tuple key (msgpack packs it as an array, which comes
        # back as an unhashable list): rebuild such keys as tuples, so that one stored
        # context can never make the store impossible to reopen
        d = msgpack.unpackb(raw, strict_map_key=False, object_pairs_hook=_pairs)
    n = len(d["r"]) // 8
    ci_raw = d["ci"]
    ci = (np.frombuffer(ci_raw, dtype=np.uint8) if len(ci_raw) == n
          else np.frombuffer(ci_raw, dtype="<u4"))
    return HistoryBatch(
        shard, seq, d["c"], ci,
        np.frombuffer(d["m"], dtype=np.uint8), np.frombuffer(d["r"], dtype=np.int64),
        np.frombuffer(d["u"], dtype=np.uint64), np.frombuffer(d["e"], dtype=np.uint64),
        np.frombuffer(d["t"], dtype=np.uint64), np.frombuffer(d["w"], dtype=np.float32),
        np.frombuffer(d["ts"], dtype=np.int64), d.get("x"),
    )


@dataclass
class Restored:
    """Everything read back at open, before the actors are built."""

    @property
    def statuses_pending(self) -> bool:
        """Whether a purge's re-materialization was interrupted (resume it)."""
        return any(not s.rematerialized for s, _ in self.statuses.values())

    memberships: dict[int, tuple[Any, int | None]] = field(default_factory=dict)
    histories: dict[int, list[list[int | None]]] = field(default_factory=dict)
    cohorts: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # user -> [(purge id, encoded manifest)]: kept encoded (see CoordinatorState)
    manifests: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    last_purge_id: int = 0
    tombstones: set[tuple[int, int]] = field(default_factory=set)
    eviction: dict[int, tuple[int, list[int], int]] = field(default_factory=dict)
    batches: list[HistoryBatch] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    statuses: dict[int, tuple[Any, int]] = field(default_factory=dict)
    snapshot_mark: dict[str, Any] | None = None
    snapshot_chunks: dict[int, list[bytes]] = field(default_factory=dict)


def snapshot_key(config: Config) -> list[Any]:
    """What a ledger snapshot depends on: shard counts, half-lives and bucket width
    (the forward-decayed sums are stored relative to the half-life). A snapshot is
    used only under the same key; otherwise the history is replayed."""
    return [
        SNAPSHOT_FORMAT, config.ledger_shards, config.membership_shards, config.half_life_ns,
        sorted([k, v] for k, v in config.half_life_ns_by_type.items()), config.window_width_ns,
    ]


def parse_store(keyspaces: dict[str, Iterable[tuple[bytes, bytes]]], snapshot_ledgers: list[Any] | None = None) -> Restored:
    """Decode every keyspace's ``(key, value)`` pairs (in key order) into a `Restored`.

    Shared by every store kind, so a restore reads the same layout wherever it lives.
    With ``snapshot_ledgers`` (a :func:`snapshot_key`) set and a snapshot taken under
    that key present, the contribution history is not decoded (the snapshot replaces
    its replay).
    """
    from ._behaviours import decode_manifest
    from ._remat import decode_status

    out = Restored()
    for key, value in keyspaces.get(Keyspace.USERS.value, ()):
        user, tag, _ = decode_key(key)
        if tag == Tag.COMMUNITY_LEAVE:
            out.memberships[user] = decode_membership(value)
        elif tag == Tag.LEAVE_HISTORY:
            out.histories[user] = [list(e) for e in msgpack.unpackb(value)]
        elif tag == Tag.COHORT_ASSIGNMENT:
            out.cohorts[user] = tuple(msgpack.unpackb(value))
    for key, value in keyspaces.get(Keyspace.ITEMS.value, ()):
        user, tag, suffix = decode_key(key)
        if tag == Tag.PURGE_MANIFEST:
            decode_manifest(value)  # a corrupt manifest fails the open, as before
            pid = int.from_bytes(suffix, "big")
            out.manifests.setdefault(user, []).append((pid, bytes(value)))
            out.last_purge_id = max(out.last_purge_id, pid)
        elif tag == Tag.PURGE_TOMBSTONE:
            out.tombstones.update((m, r) for m, r in msgpack.unpackb(value))
        elif tag == Tag.PURGE_STATUS:
            status, bound = decode_status(value)
            out.statuses[int(status.purge_id)] = (status, bound)
    for key, value in keyspaces.get(Keyspace.META.value, ()):
        ident, tag, _ = decode_key(key)
        if tag == Tag.EVICTION_STATE:
            live_from, drained, next_rseq = msgpack.unpackb(value)
            out.eviction[ident] = (live_from, list(drained), next_rseq)
        elif tag == Tag.STORE_META:
            out.meta = msgpack.unpackb(value, strict_map_key=False)
        elif tag == Tag.SNAPSHOT_MARK:
            out.snapshot_mark = msgpack.unpackb(value, strict_map_key=False)
        elif tag == Tag.SNAPSHOT_CHUNK:
            out.snapshot_chunks.setdefault(ident, []).append(bytes(value))
    mark = out.snapshot_mark
    if mark is not None and mark.get("format") != SNAPSHOT_FORMAT:
        out.snapshot_mark = mark = {}  # another build's snapshot: replay the history instead
    if mark and snapshot_ledgers is not None and mark.get("key") == snapshot_ledgers:
        return out
    for key, value in keyspaces.get(Keyspace.HISTORY.value, ()):
        shard, tag, suffix = decode_key(key)
        if tag == Tag.CONTRIBUTION_BATCH:
            out.batches.append(decode_batch(shard, int.from_bytes(suffix, "big"), value))
    return out


class MemoryStore:
    """A store in a dict: same keys and values as LMDB, kept in memory.

    Used by the message-driven harness, so actors can crash and be restored "from
    storage" without a disk. ``fault`` (a callable taking the ops) may raise to
    inject a failed write.
    """

    durable = True

    def __init__(self) -> None:
        self.data: dict[str, dict[bytes, bytes]] = {k.value: {} for k in Keyspace}
        self.fault: Any = None

    def commit(self, ops: Iterable[Op]) -> None:
        ops = list(ops)
        if self.fault is not None:
            self.fault(ops)
        for ks, key, value in ops:
            if value is None:
                self.data[ks].pop(key, None)
            else:
                self.data[ks][key] = value

    def load(self, snapshot_ledgers: list[Any] | None = None) -> Restored:
        return parse_store({ks: sorted(d.items()) for ks, d in self.data.items()}, snapshot_ledgers)

    def history_items(self) -> list[tuple[bytes, bytes]]:
        return sorted(self.data[Keyspace.HISTORY.value].items())

    def compact(self) -> dict[str, int]:
        return {"bytes_before": 0, "bytes_after": 0}

    def close(self) -> None:
        pass


class NullStore:
    """The ephemeral store: commits succeed and nothing is written anywhere."""

    durable = False

    def commit(self, ops: Iterable[Op]) -> None:
        for _ in ops:
            pass

    def load(self, snapshot_ledgers: list[Any] | None = None) -> Restored:
        return Restored()

    def history_items(self) -> list[tuple[bytes, bytes]]:
        return []

    def compact(self) -> dict[str, int]:
        return {"bytes_before": 0, "bytes_after": 0}

    def close(self) -> None:
        pass


class LmdbStore:
    """An LMDB environment with the keyspaces of `Keyspace`.

    Args:
        path: directory (created if missing).
        config: sizes (``map_size_bytes``, ``max_map_size_bytes``).

    Raises:
        DatabaseLocked: the directory is open already (this or another process).
        StorageError: LMDB could not open it.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], config: Config, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.config = config
        # read_only: `commit` refuses any op (data.mdb is never written); the open
        # itself writes nothing either (`Core` skips its snapshot and meta writes)
        self.read_only = read_only
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # a store was made here before: it must still hold its format record
            self.existed = (self.path / STORE_MARKER).exists()
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot create the directory {self.path}: {exc}") from exc
        self._key = os.path.realpath(self.path)
        with _open_lock:
            if self._key in _open_paths:
                raise DatabaseLocked(f"{self.path} is already open in this process; close it first")
            _open_paths.add(self._key)
        self._lockfile: Any = None
        try:
            self._lockfile = open(self.path / "tidal.lock", "a+b")
            try:
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise DatabaseLocked(f"{self.path} is open in another process") from None
            map_size = config.map_size_bytes
            data = self.path / "data.mdb"
            if data.exists():
                map_size = max(map_size, data.stat().st_size)
            self.env = lmdb.open(
                str(self.path), map_size=map_size, max_dbs=8, subdir=True,
                sync=True, metasync=True, writemap=False, map_async=False,
                lock=True, readahead=False, max_readers=126,
            )
            # reader slots left by killed processes (a read transaction open at the kill)
            # stay taken while any other process has the environment open: free them
            self.stale_readers = self.env.reader_check()
            # a data file cut short would fault (SIGBUS) on the first page read past
            # its end: compare its size with the last page the meta page names
            needed = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
            if data.exists() and data.stat().st_size < needed:
                raise StorageError(
                    f"{data} is truncated: {data.stat().st_size} bytes, its pages need {needed}"
                )
            self.dbs = {k.value: self.env.open_db(k.value.encode()) for k in Keyspace}
        except BaseException as exc:
            # whatever failed, the directory must not stay registered as open here
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
                self.env = None  # type: ignore[assignment]
            self._release()
            if isinstance(exc, (lmdb.Error, OSError)):
                raise StorageError(f"cannot open LMDB at {self.path}: {exc}") from exc
            raise
        self.map_size = self.env.info()["map_size"]
        # set_mapsize invalidates read transactions open at that moment: growth and the
        # reads made outside the persistence thread (raw_get) never overlap
        self._resize_lock = threading.Lock()
        self.fault: Any = None  # test hook: callable(ops) raising to inject a failure

    def _release(self) -> None:
        if self._lockfile is not None:
            try:
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
            finally:
                self._lockfile.close()
                self._lockfile = None
        with _open_lock:
            _open_paths.discard(self._key)

    def flags(self) -> dict[str, Any]:
        """The environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``, ...)."""
        return dict(self.env.flags())

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
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for ks, key, value in ops:
                        db = self.dbs[ks]
                        if value is None:
                            txn.delete(key, db=db)
                        else:
                            txn.put(key, value, db=db)
                return
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise StorageError(f"LMDB commit failed: {exc}") from exc

    def _grow(self) -> None:
        new = self.map_size * 2
        if new > self.config.max_map_size_bytes:
            if self.map_size >= self.config.max_map_size_bytes:
                raise StorageFull(
                    f"LMDB map is full at {self.map_size} bytes (max_map_size_bytes="
                    f"{self.config.max_map_size_bytes})"
                )
            new = self.config.max_map_size_bytes
        with self._resize_lock:
            self.env.set_mapsize(new)
        self.map_size = new

    def load(self, snapshot_ledgers: list[Any] | None = None) -> Restored:
        """Read the whole store back (membership, manifests, tombstones, history or
        the snapshot that replaces it); see :func:`parse_store`."""
        with self.env.begin(buffers=False) as txn:
            return parse_store(
                {k.value: txn.cursor(db=self.dbs[k.value]) for k in Keyspace}, snapshot_ledgers
            )

    def history_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every durable history batch ``(key, value)``, in key order, one at a time
        (a read transaction held until the iterator is exhausted or closed; consume
        it before committing from the same thread)."""
        with self.env.begin(buffers=False) as txn:
            yield from txn.cursor(db=self.dbs[Keyspace.HISTORY.value])

    def compact(self) -> dict[str, int]:
        """Rewrite the environment without free pages (``mdb_env_copy2`` with
        ``MDB_CP_COMPACT``), so bytes of deleted records are gone from the file.

        Returns ``{"bytes_before": ..., "bytes_after": ...}`` (data file sizes).

        Raises:
            StorageError: the copy or the swap failed (the old file stays in use).
        """
        data = self.path / "data.mdb"
        before = data.stat().st_size
        tmp = self.path / "compact.tmp"
        try:
            if tmp.exists():
                for f in tmp.iterdir():
                    f.unlink()
            else:
                tmp.mkdir()
            self.env.copy(str(tmp), compact=True)
            self.env.close()
            os.replace(tmp / "data.mdb", data)
            tmp.rmdir()
        except (OSError, lmdb.Error) as exc:
            raise StorageError(f"compaction failed: {exc}") from exc
        finally:
            if not self._env_open():
                self._reopen()
        return {"bytes_before": before, "bytes_after": data.stat().st_size}

    def _env_open(self) -> bool:
        try:
            self.env.info()
            return True
        except lmdb.Error:
            return False

    def _reopen(self) -> None:
        self.env = lmdb.open(
            str(self.path), map_size=self.map_size, max_dbs=8, subdir=True,
            sync=True, metasync=True, writemap=False, map_async=False,
            lock=True, readahead=False, max_readers=126,
        )
        self.dbs = {k.value: self.env.open_db(k.value.encode()) for k in Keyspace}

    def raw_get(self, keyspace: Keyspace, key: bytes) -> bytes | None:
        """Read one value (tests and `inspect`)."""
        with self._resize_lock, self.env.begin() as txn:
            v = txn.get(key, db=self.dbs[keyspace.value])
            return bytes(v) if v is not None else None

    def disown(self) -> None:
        """In a forked child: forget the environment and the directory lock without
        closing or unlocking either (both are the parent's; an ``flock`` is shared
        through the inherited open file). Later calls see a closed store."""
        _DISOWNED.append(getattr(self, "env", None))  # never closed from the child
        self.env = None  # type: ignore[assignment]
        if self._lockfile is not None:
            _DISOWNED.append(self._lockfile)  # no LOCK_UN: that would free the parent's lock
            self._lockfile = None
        with _open_lock:
            _open_paths.discard(self._key)

    def close(self) -> None:
        """Close the environment and release the directory; a second call is a no-op."""
        env = getattr(self, "env", None)
        if env is not None:
            env.close()
            self.env = None  # type: ignore[assignment]
            self._release()
