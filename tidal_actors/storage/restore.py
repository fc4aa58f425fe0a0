"""Restore: what any store holds, decoded into a `Restored` before the actors are built.

`parse_store` reads every keyspace through the decoders of `storage.format`, the
same for the LMDB, read-only and memory stores. Must not do I/O (the store hands it
the pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, StorageError
from tidal_actors._types import MembershipStatus, PurgeStatus
from tidal_actors.storage.format import (
    HistoryBatch,
    Keyspace,
    Tag,
    decode_batches,
    decode_cohorts,
    decode_eviction_state,
    decode_key,
    decode_leave_history,
    decode_manifest,
    decode_map,
    decode_membership,
    decode_status,
    decode_tombstone,
    undecodable,
    unseal,
)

DECODE_CHUNK = 256  # history batches decoded together at restore

__all__ = [
    "FORMAT_VERSION",
    "SHARDS_FORMAT",
    "SNAPSHOT_FORMAT",
    "Restored",
    "SnapshotKey",
    "check_layout",
    "check_record",
    "parse_store",
    "snapshot_key",
]

FORMAT_VERSION = 1
"""The format record's ``format`` in a store of the ``single`` layout."""
SHARDS_FORMAT = 2
"""The format record's ``format`` in a store of the ``shards`` layout (`storage.layout`)."""

SNAPSHOT_FORMAT = 4


@dataclass
class Restored:
    """Everything read back at open, before the actors are built."""

    @property
    def statuses_pending(self) -> bool:
        """Whether a purge's re-materialization was interrupted (resume it)."""
        return any(not s.rematerialized for s, _ in self.statuses.values())

    memberships: dict[int, tuple[MembershipStatus, int | None]] = field(default_factory=dict)
    histories: dict[int, list[list[int | None]]] = field(default_factory=dict)
    cohorts: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # user -> [(purge id, encoded manifest)]: kept encoded (see CoordinatorState)
    manifests: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    last_purge_id: int = 0
    tombstones: set[tuple[int, int]] = field(default_factory=set)
    eviction: dict[int, tuple[int, list[int], int]] = field(default_factory=dict)
    batches: list[HistoryBatch] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    statuses: dict[int, tuple[PurgeStatus, int]] = field(default_factory=dict)
    snapshot_mark: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None  # the STORE_SETTINGS record (`storage.settings`), if any
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


def check_layout(meta: dict[str, Any], layout: str, where: object) -> None:
    """Refuse a format record ``meta`` of another layout than the store ``where`` is
    opened in (``single``: its directory holds ``data.mdb``; ``shards``: it holds
    ``shards/``, `storage.layout`); a record without ``layout`` is ``single``'s.

    Raises:
        StorageError: the layouts differ (one environment of a ``shards`` store
            opened as a store, or damage).
    """
    recorded = meta.get("layout", "single")
    if recorded != layout:
        raise StorageError(
            f"{where}: its format record says layout {recorded!r} but it is opened as a "
            f"{layout!r} store: it is damaged, or one environment of a 'shards' store "
            "(open the store's own directory); nothing was written"
        )


def check_record(meta: dict[str, Any], config: Config, where: object, layout: str) -> None:
    """Refuse a store's format record ``meta`` (non-empty) that ``config`` cannot
    write: another layout than ``layout`` (`check_layout`), a later format, or other
    ``membership_shards``. ``where`` names the store. Called by an open before it
    writes anything (`runtime.restore.check_meta`, and a sharded store before it
    makes an environment, `storage.sharded`).

    Raises:
        StorageError: another layout; a format later than `SHARDS_FORMAT` (or not
            an int).
        InvalidArgument: ``membership_shards`` differs from the recorded count.
    """
    check_layout(meta, layout, where)
    if not isinstance(meta.get("format", 1), int) or meta.get("format", 1) > SHARDS_FORMAT:
        raise StorageError(
            f"{where} was written in format {meta.get('format')!r}, by a later version of "
            f"tidal_actors (this one reads formats up to {SHARDS_FORMAT}): open it with that "
            "version"
        )
    stored = meta.get("membership_shards")
    if stored is not None and stored != config.membership_shards:
        raise InvalidArgument(
            "membership_shards",
            config.membership_shards,
            f"this store was written with membership_shards={stored}; record numbering depends on it",
        )


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
    from tidal_actors.storage.settings import decode_settings

    out = Restored()

    def users(key: bytes, value: bytes) -> None:
        user, tag, _ = decode_key(key)
        if tag == Tag.COMMUNITY_LEAVE:
            out.memberships[user] = decode_membership(value)
        elif tag == Tag.LEAVE_HISTORY:
            out.histories[user] = decode_leave_history(value)
        elif tag == Tag.COHORT_ASSIGNMENT:
            out.cohorts[user] = decode_cohorts(value)

    def items(key: bytes, value: bytes) -> None:
        user, tag, suffix = decode_key(key)
        if tag == Tag.PURGE_MANIFEST:
            decode_manifest(value)  # a corrupt manifest fails the open
            pid = int.from_bytes(suffix, "big")
            out.manifests.setdefault(user, []).append((pid, bytes(value)))
            out.last_purge_id = max(out.last_purge_id, pid)
        elif tag == Tag.PURGE_TOMBSTONE:
            out.tombstones.update(decode_tombstone(value))
        elif tag == Tag.PURGE_STATUS:
            status, bound = decode_status(value)
            out.statuses[int(status.purge_id)] = (status, bound)

    def meta(key: bytes, value: bytes) -> None:
        ident, tag, _ = decode_key(key)
        if tag == Tag.EVICTION_STATE:
            out.eviction[ident] = decode_eviction_state(value)
        elif tag == Tag.STORE_META:
            out.meta = decode_map(value)
        elif tag == Tag.SNAPSHOT_MARK:
            out.snapshot_mark = decode_map(value)
        elif tag == Tag.STORE_SETTINGS:
            out.settings = decode_settings(value)
        elif tag == Tag.SNAPSHOT_CHUNK:
            out.snapshot_chunks.setdefault(ident, []).append(
                unseal(value, Keyspace.META.value, key)
            )

    pending: list[tuple[int, int, bytes, bytes | None]] = []

    def history(key: bytes, value: bytes) -> None:
        shard, tag, suffix = decode_key(key)
        if tag == Tag.CONTRIBUTION_BATCH:
            pending.append((shard, int.from_bytes(suffix, "big"), value, key))
            if len(pending) >= DECODE_CHUNK:  # decoded together (`decode_batches`)
                out.batches.extend(decode_batches(pending))
                pending.clear()

    _decode_each(keyspaces, Keyspace.USERS, users)
    _decode_each(keyspaces, Keyspace.ITEMS, items)
    _decode_each(keyspaces, Keyspace.META, meta)
    if callable(snapshot_ledgers):
        snapshot_ledgers = snapshot_ledgers(out)
    mark = out.snapshot_mark
    if mark is not None and mark.get("format") != SNAPSHOT_FORMAT:
        out.snapshot_mark = mark = {}  # another build's snapshot: replay the history instead
    if mark and snapshot_ledgers is not None and mark.get("key") == snapshot_ledgers:
        if _chunks_whole(out, snapshot_ledgers):
            return out
        # the mark without its chunks: a read of a ``shards`` store that began the
        # ledgers' read transactions before a writer's close committed the chunks and
        # the coordinator's after it committed the mark (`storage.sharded`)
        out.snapshot_mark = mark = {}
    _decode_each(keyspaces, Keyspace.HISTORY, history)
    out.batches.extend(decode_batches(pending))
    return out


def _chunks_whole(out: Restored, key: list[Any]) -> bool:
    """Whether ``out`` holds the snapshot chunks of every ledger shard that snapshot
    ``key`` (`snapshot_key`: the ledger shard count at index 1) names: two each
    (`format.snapshot.encode_ledger`)."""
    shards = key[1] if len(key) > 1 and isinstance(key[1], int) else 0
    return all(len(out.snapshot_chunks.get(i, ())) >= 2 for i in range(shards))


def _decode_each(
    keyspaces: dict[str, Iterable[tuple[bytes, bytes]]],
    keyspace: Keyspace,
    decode: Callable[[bytes, bytes], None],
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
