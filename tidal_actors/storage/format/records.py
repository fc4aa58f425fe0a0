"""Values of the users, items and meta keyspaces, and the writes that store them.

Membership value (spec: leave-stop-forward "Serialization"): exactly 9 bytes,
``[status: 1 byte][left_at_ns: 8 bytes little-endian]``; status 0 = Active, 1 = Left;
an Active record stores 0 as ``left_at_ns`` and reads back as None.

Other values are msgpack (integer map keys need ``strict_map_key=False``; tuples come
back as lists, so decoders rebuild the public types explicitly); the Tag table in
`keys.Tag` names each one's shape. Purge ids are 16 bytes big-endian (msgpack ints
stop at 64 bits). Decoders raise ValueError (or whatever msgpack raises) on a value
of the wrong shape; the caller names the key (`keys.undecodable`). Must not do I/O.
"""

from __future__ import annotations

import struct
from typing import Any, cast

import msgpack

from tidal_actors._types import (
    ContributionRecord,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
)
from tidal_actors.storage.format.keys import Keyspace, Op, Tag, encode_key, snapshot_chunk_key

__all__ = [
    "cohorts_op",
    "decode_cohorts",
    "decode_eviction_state",
    "decode_leave_history",
    "decode_link_state",
    "decode_manifest",
    "decode_map",
    "decode_membership",
    "decode_status",
    "decode_tombstone",
    "encode_manifest",
    "encode_membership",
    "encode_status",
    "eviction_state_op",
    "link_state_op",
    "manifest_op",
    "membership_ops",
    "settings_op",
    "snapshot_delete_ops",
    "snapshot_mark_op",
    "status_op",
    "store_meta_op",
    "tombstone_op",
]


def _packb(obj: object) -> bytes:
    """msgpack bytes of ``obj`` (``msgpack.packb`` is untyped)."""
    return cast(bytes, msgpack.packb(obj))


def _is_int(x: object) -> bool:
    return type(x) is int


# users keyspace ------------------------------------------------------------------

_MEMBERSHIP = struct.Struct("<BQ")


def encode_membership(status: MembershipStatus, left_at_ns: int | None) -> bytes:
    """The 9-byte membership value: status byte, then ``left_at_ns`` as u64 LE."""
    return _MEMBERSHIP.pack(status.value, left_at_ns or 0)


def decode_membership(raw: bytes) -> tuple[MembershipStatus, int | None]:
    """Inverse of :func:`encode_membership`; raises ValueError unless exactly 9 bytes."""
    if len(raw) != 9:
        raise ValueError(f"membership value must be 9 bytes, got {len(raw)}")
    status_byte, left_at = _MEMBERSHIP.unpack(raw)
    status = MembershipStatus(status_byte)
    return status, (left_at if status is MembershipStatus.Left else None)


def membership_ops(
    user: int, status: MembershipStatus, left_at_ns: int | None, history: list[list[int | None]]
) -> list[Op]:
    """The writes of a user's membership (9 bytes) and leave history
    (``[[left_at_ns, rejoined_at_ns or nil], ...]``)."""
    return [
        (
            Keyspace.USERS.value,
            encode_key(user, Tag.COMMUNITY_LEAVE),
            encode_membership(status, left_at_ns),
        ),
        (Keyspace.USERS.value, encode_key(user, Tag.LEAVE_HISTORY), _packb(history)),
    ]


def decode_leave_history(raw: bytes) -> list[list[int | None]]:
    """A user's leave epochs ``[[left_at_ns, rejoined_at_ns or None], ...]``."""
    epochs = [list(e) for e in msgpack.unpackb(raw)]
    if not all(len(e) == 2 and _is_int(e[0]) and (e[1] is None or _is_int(e[1])) for e in epochs):
        raise ValueError("not a list of [left_at_ns, rejoined_at_ns or nil]")
    return epochs


def cohorts_op(user: int, cohorts: tuple[str, ...]) -> Op:
    """The write of a user's cohort assignment (a delete when ``cohorts`` is empty)."""
    key = encode_key(user, Tag.COHORT_ASSIGNMENT)
    return (Keyspace.USERS.value, key, _packb(list(cohorts)) if cohorts else None)


def decode_cohorts(raw: bytes) -> tuple[str, ...]:
    """A user's cohort names."""
    cohorts = tuple(msgpack.unpackb(raw))
    if not all(isinstance(c, str) for c in cohorts):
        raise ValueError("not a list of cohort names")
    return cohorts


# items keyspace ------------------------------------------------------------------


def encode_manifest(m: PurgeManifest) -> bytes:
    """msgpack ``[purge_id 16B, user, cohort, created_at_ns, entries, evicted]``."""
    return _packb(
        [m.purge_id.to_bytes16(), m.user_id, m.cohort, m.created_at_ns, m.entries, m.evicted]
    )  # tuples (the entries) pack as msgpack arrays, as lists do


def decode_manifest(raw: bytes) -> PurgeManifest:
    """Inverse of :func:`encode_manifest`, rebuilding the public types."""
    pid, user, cohort, created, entries, evicted = msgpack.unpackb(raw)
    return PurgeManifest(
        PurgeId.from_bytes16(pid),
        user,
        cohort,
        created,
        tuple(ContributionRecord(*e) for e in entries),
        evicted,
    )


def manifest_op(user: int, purge_id: PurgeId, encoded: bytes) -> Op:
    """The write of a purge's manifest (``encoded`` by :func:`encode_manifest`)."""
    key = encode_key(user, Tag.PURGE_MANIFEST, purge_id.to_bytes16())
    return (Keyspace.ITEMS.value, key, encoded)


def tombstone_op(user: int, purge_id: PurgeId, mshards: list[int], rseqs: list[int]) -> Op:
    """The write of a purge's tombstone: msgpack ``[[membership shard, rseq], ...]`` of
    the records it retracted live."""
    key = encode_key(user, Tag.PURGE_TOMBSTONE, purge_id.to_bytes16())
    return (Keyspace.ITEMS.value, key, _packb(list(zip(mshards, rseqs))))


def decode_tombstone(raw: bytes) -> list[tuple[int, int]]:
    """Inverse of :func:`tombstone_op`'s value: ``[(membership shard, rseq), ...]``."""
    pairs = [(m, r) for m, r in msgpack.unpackb(raw)]
    if not all(_is_int(m) and _is_int(r) for m, r in pairs):
        raise ValueError("not a list of [membership shard, rseq]")
    return pairs


def encode_status(s: PurgeStatus, bound: int) -> tuple[bytes, bytes]:
    """Key and value of a purge status record: msgpack ``[purge_id 16B, user, cohort,
    retracted_live, rematerialized, rematerialized_at_ns, excluded, bound]``."""
    key = encode_key(s.user_id, Tag.PURGE_STATUS, s.purge_id.to_bytes16())
    value = _packb(
        [
            s.purge_id.to_bytes16(),
            s.user_id,
            s.cohort,
            s.retracted_live,
            s.rematerialized,
            s.rematerialized_at_ns,
            s.excluded_by_rematerialization,
            bound,
        ]
    )
    return key, value


def status_op(s: PurgeStatus, bound: int) -> Op:
    """The write of a purge status record (:func:`encode_status`)."""
    return (Keyspace.ITEMS.value, *encode_status(s, bound))


def decode_status(raw: bytes) -> tuple[PurgeStatus, int]:
    """Inverse of :func:`encode_status`: the status and the purge's rseq bound."""
    pid, user, cohort, live, done, at, excluded, bound = msgpack.unpackb(raw)
    return PurgeStatus(PurgeId.from_bytes16(pid), user, cohort, live, done, at, excluded), bound


# meta keyspace -------------------------------------------------------------------


def eviction_state_op(mshard: int, watermark: int, next_rseq: int) -> Op:
    """The write of a membership shard's eviction state: msgpack ``[watermark, [],
    next rseq]`` (the drained rseqs are read back from the tombstones)."""
    key = encode_key(mshard, Tag.EVICTION_STATE)
    return (Keyspace.META.value, key, _packb([watermark, [], next_rseq]))


def decode_eviction_state(raw: bytes) -> tuple[int, list[int], int]:
    """``(watermark, drained rseqs, next rseq)``."""
    watermark, drained, next_rseq = msgpack.unpackb(raw)
    if not (_is_int(watermark) and _is_int(next_rseq) and all(map(_is_int, drained))):
        raise ValueError("not [watermark, [drained rseqs], next rseq]")
    return watermark, list(drained), next_rseq


def decode_map(raw: bytes) -> dict[Any, Any]:
    """A msgpack map (STORE_META, SNAPSHOT_MARK, STORE_SETTINGS); ValueError if not one."""
    out = msgpack.unpackb(raw, strict_map_key=False)
    if not isinstance(out, dict):
        raise ValueError(f"not a map: {type(out).__name__}")
    return out


def store_meta_op(format_version: int, membership_shards: int) -> Op:
    """The write of the store's format record: msgpack ``{"format", "membership_shards"}``."""
    value = _packb({"format": format_version, "membership_shards": membership_shards})
    return (Keyspace.META.value, encode_key(0, Tag.STORE_META), value)


def settings_op(record: dict[str, Any]) -> Op:
    """The write of the STORE_SETTINGS record (a msgpack map; `settings` owns its keys)."""
    return (Keyspace.META.value, encode_key(0, Tag.STORE_SETTINGS), _packb(record))


def snapshot_mark_op(snapshot_format: int, key: list[Any]) -> Op:
    """The write of the snapshot mark: msgpack ``{"format", "key"}`` (written after
    the chunks, in the same transaction)."""
    value = _packb({"format": snapshot_format, "key": key})
    return (Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), value)


def snapshot_delete_ops(chunks: dict[int, int]) -> list[Op]:
    """The writes deleting a snapshot, mark first; ``chunks``: ledger shard -> its
    number of chunks."""
    ops: list[Op] = [(Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), None)]
    for shard, n in chunks.items():
        ops.extend((Keyspace.META.value, snapshot_chunk_key(shard, k), None) for k in range(n))
    return ops


def link_state_op(shard: int, sender: str, epoch: int, seq: int) -> Op:
    """The write of a link's state at ledger shard ``shard``: the last message
    (``seq``, in the link's ``epoch``) from ``sender`` (a name, UTF-8 in the key
    suffix) whose history batch commits in the same transaction (msgpack
    ``[epoch, seq]``; `runtime.ray_restart`)."""
    key = encode_key(shard, Tag.LINK_STATE, sender.encode("utf-8"))
    return (Keyspace.META.value, key, _packb([epoch, seq]))


def decode_link_state(raw: bytes) -> tuple[int, int]:
    """``(epoch, seq)`` of a LINK_STATE value."""
    epoch, seq = msgpack.unpackb(raw)
    if not (_is_int(epoch) and _is_int(seq)):
        raise ValueError("not [epoch, seq]")
    return epoch, seq
