"""Storage: the keyspaces' layouts read back (restore), and the stores without LMDB.

`parse_store` decodes what any store holds into a `Restored`; the LMDB environment
itself (durability, growth, locking, compaction) is `_lmdb_env.LmdbStore`, exported
here too. Layouts are in `_codec.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from tidal_actors._config import Config
from tidal_actors._errors import StorageError
from tidal_actors.storage.format import (
    Keyspace,
    Tag,
    decode_key,
    decode_membership,
    encode_key,
    unseal,
)
from tidal_actors.storage.history import HistoryMarks
from tidal_actors.storage.lmdb_env import STORE_MARKER, LmdbStore

__all__ = [
    "STORE_MARKER",
    "HistoryBatch",
    "LmdbStore",
    "MemoryStore",
    "NullStore",
    "Restored",
    "parse_store",
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


def decode_batch(shard: int, seq: int, raw: bytes, key: bytes | None = None) -> HistoryBatch:
    """A history batch's columns from its stored (sealed) value.

    ``key`` (default: the key of ``shard`` and ``seq``) names the batch in errors.

    Raises:
        StorageError: the value is corrupt (its CRC-32, its msgpack, or columns whose
            lengths disagree), naming the keyspace and the key in hex.
    """
    if key is None:
        key = encode_key(shard, Tag.CONTRIBUTION_BATCH, seq.to_bytes(8, "big"))
    try:
        return _decode_batch(shard, seq, unseal(raw, Keyspace.HISTORY.value, key))
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a corrupt value makes msgpack or numpy raise
        raise undecodable(Keyspace.HISTORY, key, exc) from exc


def undecodable(keyspace: Keyspace, key: bytes, exc: BaseException) -> StorageError:
    """The error for a stored value (or key) that does not decode."""
    return StorageError(
        f"cannot decode {keyspace.value} key {bytes(key).hex()}: {type(exc).__name__}: {exc}"
    )


def _decode_batch(shard: int, seq: int, raw: Any) -> HistoryBatch:
    try:
        d = msgpack.unpackb(raw, strict_map_key=False)
    except TypeError:
        # a signal context with a tuple key (msgpack packs it as an array, which comes
        # back as an unhashable list): rebuild such keys as tuples, so that one stored
        # context can never make the store impossible to reopen
        d = msgpack.unpackb(raw, strict_map_key=False, object_pairs_hook=_pairs)
    n = len(d["r"]) // 8
    ci_raw = d["ci"]
    ci = (
        np.frombuffer(ci_raw, dtype=np.uint8)
        if len(ci_raw) == n
        else np.frombuffer(ci_raw, dtype="<u4")
    )
    b = HistoryBatch(
        shard,
        seq,
        d["c"],
        ci,
        np.frombuffer(d["m"], dtype=np.uint8),
        np.frombuffer(d["r"], dtype=np.int64),
        np.frombuffer(d["u"], dtype=np.uint64),
        np.frombuffer(d["e"], dtype=np.uint64),
        np.frombuffer(d["t"], dtype=np.uint64),
        np.frombuffer(d["w"], dtype=np.float32),
        np.frombuffer(d["ts"], dtype=np.int64),
        d.get("x"),
    )
    # a legacy (unsealed) value can be corrupt and still decode: check its shape
    if not (isinstance(b.cohorts, list) and all(isinstance(c, str) for c in b.cohorts)):
        raise ValueError("the cohort names are not a list of strings")
    if any(len(col) != n for col in (ci, b.m, b.u, b.e, b.t, b.w, b.ts)):
        raise ValueError(f"columns of unequal lengths for {n} records")
    if n and int(ci.max()) >= len(b.cohorts):
        raise ValueError(f"a cohort index past the batch's {len(b.cohorts)} cohort names")
    if b.contexts is not None and not isinstance(b.contexts, dict):
        raise ValueError("the signal contexts are not a map")
    return b


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
    settings: dict[str, Any] | None = None  # the STORE_SETTINGS record (`_settings`), if any
    snapshot_chunks: dict[int, list[bytes | memoryview]] = field(default_factory=dict)  # unsealed


def snapshot_key(config: Config) -> list[Any]:
    """What a ledger snapshot depends on: shard counts, half-lives and bucket width
    (the forward-decayed sums are stored relative to the half-life). A snapshot is
    used only under the same key; otherwise the history is replayed."""
    return [
        SNAPSHOT_FORMAT,
        config.ledger_shards,
        config.membership_shards,
        config.half_life_ns,
        sorted([k, v] for k, v in config.half_life_ns_by_type.items()),
        config.window_width_ns,
    ]


SnapshotKey = list[Any] | Callable[[Restored], list[Any]] | None


def parse_store(
    keyspaces: dict[str, Iterable[tuple[bytes, bytes]]], snapshot_ledgers: SnapshotKey = None
) -> Restored:
    """Decode every keyspace's ``(key, value)`` pairs (in key order) into a `Restored`.

    Shared by every store kind, so a restore reads the same layout wherever it lives.
    With ``snapshot_ledgers`` (a :func:`snapshot_key`) set and a snapshot taken under
    that key present, the contribution history is not decoded (the snapshot replaces
    its replay). A callable is asked for the key once the users, items and meta are
    decoded (a read-only open takes its settings from the store's own record).

    Raises:
        StorageError: a key or value does not decode (naming its keyspace and the key
            in hex), or a sealed value fails its CRC-32.
    """
    from tidal_actors.core.remat import decode_status
    from tidal_actors.storage.format import decode_manifest
    from tidal_actors.storage.settings import decode_settings

    out = Restored()

    def users(key: bytes, value: bytes) -> None:
        user, tag, _ = decode_key(key)
        if tag == Tag.COMMUNITY_LEAVE:
            out.memberships[user] = decode_membership(value)
        elif tag == Tag.LEAVE_HISTORY:
            epochs = [list(e) for e in msgpack.unpackb(value)]
            if not all(len(e) == 2 and _int(e[0]) and (e[1] is None or _int(e[1])) for e in epochs):
                raise ValueError("not a list of [left_at_ns, rejoined_at_ns or nil]")
            out.histories[user] = epochs
        elif tag == Tag.COHORT_ASSIGNMENT:
            cohorts = tuple(msgpack.unpackb(value))
            if not all(isinstance(c, str) for c in cohorts):
                raise ValueError("not a list of cohort names")
            out.cohorts[user] = cohorts

    def items(key: bytes, value: bytes) -> None:
        user, tag, suffix = decode_key(key)
        if tag == Tag.PURGE_MANIFEST:
            decode_manifest(value)  # a corrupt manifest fails the open, as before
            pid = int.from_bytes(suffix, "big")
            out.manifests.setdefault(user, []).append((pid, bytes(value)))
            out.last_purge_id = max(out.last_purge_id, pid)
        elif tag == Tag.PURGE_TOMBSTONE:
            pairs = [(m, r) for m, r in msgpack.unpackb(value)]
            if not all(_int(m) and _int(r) for m, r in pairs):
                raise ValueError("not a list of [membership shard, rseq]")
            out.tombstones.update(pairs)
        elif tag == Tag.PURGE_STATUS:
            status, bound = decode_status(value)
            out.statuses[int(status.purge_id)] = (status, bound)

    def meta(key: bytes, value: bytes) -> None:
        ident, tag, _ = decode_key(key)
        if tag == Tag.EVICTION_STATE:
            live_from, drained, next_rseq = msgpack.unpackb(value)
            if not (_int(live_from) and _int(next_rseq) and all(map(_int, drained))):
                raise ValueError("not [watermark, [drained rseqs], next rseq]")
            out.eviction[ident] = (live_from, list(drained), next_rseq)
        elif tag == Tag.STORE_META:
            out.meta = _map(msgpack.unpackb(value, strict_map_key=False))
        elif tag == Tag.SNAPSHOT_MARK:
            out.snapshot_mark = _map(msgpack.unpackb(value, strict_map_key=False))
        elif tag == Tag.STORE_SETTINGS:
            out.settings = decode_settings(value)
        elif tag == Tag.SNAPSHOT_CHUNK:
            out.snapshot_chunks.setdefault(ident, []).append(
                unseal(value, Keyspace.META.value, key)
            )

    def history(key: bytes, value: bytes) -> None:
        shard, tag, suffix = decode_key(key)
        if tag == Tag.CONTRIBUTION_BATCH:
            out.batches.append(decode_batch(shard, int.from_bytes(suffix, "big"), value, key))

    _decode_each(keyspaces, Keyspace.USERS, users)
    _decode_each(keyspaces, Keyspace.ITEMS, items)
    _decode_each(keyspaces, Keyspace.META, meta)
    if callable(snapshot_ledgers):
        snapshot_ledgers = snapshot_ledgers(out)
    mark = out.snapshot_mark
    if mark is not None and mark.get("format") != SNAPSHOT_FORMAT:
        out.snapshot_mark = mark = {}  # another build's snapshot: replay the history instead
    if mark and snapshot_ledgers is not None and mark.get("key") == snapshot_ledgers:
        return out
    _decode_each(keyspaces, Keyspace.HISTORY, history)
    return out


def _decode_each(
    keyspaces: dict[str, Iterable[tuple[bytes, bytes]]], keyspace: Keyspace, decode: Any
) -> None:
    """``decode(key, value)`` for each pair of ``keyspace``; whatever a corrupt pair
    makes it raise becomes a StorageError naming the keyspace and the key."""
    key = b""
    try:
        for key, value in keyspaces.get(keyspace.value, ()):
            decode(key, value)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack, numpy and the decoders raise many kinds
        raise undecodable(keyspace, key, exc) from exc


def _int(x: Any) -> bool:
    return type(x) is int


def _map(x: Any) -> dict[Any, Any]:
    if not isinstance(x, dict):
        raise ValueError(f"not a map: {type(x).__name__}")
    return x


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


class NullStore:
    """The ephemeral store: commits succeed and nothing is written anywhere."""

    durable = False

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
