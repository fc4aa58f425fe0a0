"""Storage: the keyspaces' layouts read back (restore), and the stores without LMDB.

`parse_store` decodes what any store holds into a `Restored`; the LMDB environment
itself (durability, growth, locking, compaction) is `_lmdb_env.LmdbStore`, exported
here too. Layouts are in `_codec.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from ._codec import Keyspace, Tag, decode_key, decode_membership
from ._config import Config
from ._lmdb_env import STORE_MARKER, LmdbStore

__all__ = [
    "STORE_MARKER", "HistoryBatch", "LmdbStore", "MemoryStore", "NullStore", "Restored", "parse_store",
]

SNAPSHOT_FORMAT = 4

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
    contexts: dict[int, Any] | None = None


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
