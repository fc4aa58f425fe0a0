"""Key and value layouts of the LMDB store, and the stable shard hashes.

Owns every byte layout written to disk (one table of tags below) and the two hash
functions that place users and cohorts on shards. Must not do I/O.

Key layout (spec: leave-stop-forward "Storage key", retroactive-purge FR-3)::

    encode_key(entity_id, tag, suffix) = entity_id.to_bytes(8, "big") + b"\\x00" + bytes([tag]) + suffix

Membership value (spec: leave-stop-forward "Serialization"): exactly 9 bytes,
``[status: 1 byte][left_at_ns: 8 bytes little-endian]``; status 0 = Active, 1 = Left;
an Active record stores 0 as ``left_at_ns`` and reads back as None.

Other values are msgpack (integer map keys need ``strict_map_key=False``; tuples come
back as lists, so decoders rebuild the public types explicitly). History batches and
snapshot chunks, the large values, are sealed (LMDB checksums nothing)::

    seal(key, payload) = b"\xc1" + bytes([SEAL_VERSION]) + crc32(key + payload).to_bytes(4, "little") + payload

The CRC covers the value's key too, so a value copied or moved under another key (a
history batch counted twice, two shards' snapshot chunks swapped) fails like a
corrupt one.

``0xC1`` is the one byte msgpack never uses, so a value written before seals (a bare
msgpack map, first byte ``0x80``-``0x8F``, ``0xDE`` or ``0xDF``) is told apart by its
first byte and read as it is; any other first byte is corruption.
"""

from __future__ import annotations

import enum
import struct
import zlib
from array import array
from typing import Any

import msgpack

from tidal_actors._errors import StorageError
from tidal_actors._types import ContributionRecord, MembershipStatus, PurgeId, PurgeManifest
from tidal_actors.core.sharding import ledger_shard_of, membership_shard_of  # re-exported

__all__ = [
    "Keyspace",
    "Tag",
    "decode_key",
    "decode_manifest",
    "decode_membership",
    "encode_batch",
    "encode_key",
    "encode_manifest",
    "encode_membership",
    "ledger_shard_of",
    "membership_capacity",
    "membership_shard_of",
    "seal",
    "unseal",
]


class Tag(enum.IntEnum):
    """The tag byte of every key (one table for the whole store).

    ===================  =====  ==========  =========================================
    tag                  value  keyspace    entity_id / suffix / value
    ===================  =====  ==========  =========================================
    PURGE_MANIFEST       0x10   items       user / purge_id 16B BE / msgpack manifest
    COMMUNITY_LEAVE      0x11   users       user / empty / 9 bytes (see module doc)
    LEAVE_HISTORY        0x12   users       user / empty / msgpack [[left, rejoined|nil]]
    COHORT_ASSIGNMENT    0x13   users       user / empty / msgpack [cohort names]
    CONTRIBUTION_BATCH   0x14   history     ledger shard / batch seq 8B BE / sealed msgpack
    PURGE_TOMBSTONE      0x15   items       user / purge_id 16B BE / msgpack rseq list
    EVICTION_STATE       0x16   meta        membership shard / empty / msgpack [E, D]
    PURGE_STATUS         0x17   items       user / purge_id 16B BE / msgpack status
    STORE_META           0x18   meta        0 / empty / msgpack {format, shards}
    SNAPSHOT_CHUNK       0x19   meta        ledger shard / chunk 4B BE / sealed msgpack
    SNAPSHOT_MARK        0x1A   meta        0 / empty / msgpack {ledgers, chunks}
    STORE_SETTINGS       0x1B   meta        0 / empty / msgpack {setting: value}
    ===================  =====  ==========  =========================================
    """

    PURGE_MANIFEST = 0x10
    COMMUNITY_LEAVE = 0x11
    LEAVE_HISTORY = 0x12
    COHORT_ASSIGNMENT = 0x13
    CONTRIBUTION_BATCH = 0x14
    PURGE_TOMBSTONE = 0x15
    EVICTION_STATE = 0x16
    PURGE_STATUS = 0x17
    STORE_META = 0x18
    SNAPSHOT_CHUNK = 0x19
    SNAPSHOT_MARK = 0x1A
    STORE_SETTINGS = 0x1B


class Keyspace(str, enum.Enum):
    """Named LMDB databases in the one environment."""

    USERS = "users"
    ITEMS = "items"
    HISTORY = "history"
    META = "meta"


def encode_key(entity_id: int, tag: int, suffix: bytes = b"") -> bytes:
    """``entity_id`` (8 bytes BE) + ``0x00`` + ``tag`` (1 byte) + ``suffix``."""
    return entity_id.to_bytes(8, "big") + b"\x00" + bytes((tag,)) + suffix


def decode_key(key: bytes) -> tuple[int, int, bytes]:
    """Inverse of :func:`encode_key`: ``(entity_id, tag, suffix)``."""
    if len(key) < 10 or key[8] != 0:
        raise ValueError(f"not an encoded key: {key!r}")
    return int.from_bytes(key[:8], "big"), key[9], bytes(key[10:])


SEAL_MAGIC = 0xC1
SEAL_VERSION = 1
_SEAL = struct.Struct("<BBI")


def seal(key: bytes, payload: bytes) -> bytes:
    """``payload``, the value stored under ``key``, framed with a magic byte, a version
    and the CRC-32 of key and payload (see module doc)."""
    return _SEAL.pack(SEAL_MAGIC, SEAL_VERSION, zlib.crc32(payload, zlib.crc32(key))) + payload


def unseal(raw: bytes, keyspace: str, key: bytes) -> bytes | memoryview:
    """The payload of a :func:`seal` ed value (without copying it); a msgpack map
    without the magic byte (written before values were sealed) is returned as it is.

    Raises:
        StorageError: neither sealed nor a msgpack map, the frame is cut short, of an
            unknown version, or its CRC-32 does not match (naming ``keyspace`` and
            ``key`` in hex).
    """
    if not raw or raw[0] != SEAL_MAGIC:
        if raw and (0x80 <= raw[0] <= 0x8F or raw[0] in (0xDE, 0xDF)):
            return raw  # a msgpack map: written before values were sealed
        first = f"0x{raw[0]:02x}" if raw else "nothing"
        raise StorageError(
            f"cannot decode {keyspace} key {key.hex()}: neither sealed nor a msgpack map (first byte {first})"
        )
    if len(raw) < _SEAL.size:
        raise StorageError(
            f"cannot decode {keyspace} key {key.hex()}: sealed value cut short ({len(raw)} bytes)"
        )
    _, version, crc = _SEAL.unpack_from(raw)
    if version != SEAL_VERSION:
        raise StorageError(
            f"cannot decode {keyspace} key {key.hex()}: unknown seal version {version}"
        )
    payload = memoryview(raw)[_SEAL.size :]
    if zlib.crc32(payload, zlib.crc32(key)) != crc:
        raise StorageError(
            f"cannot decode {keyspace} key {key.hex()}: CRC-32 mismatch (a corrupt value, "
            "or one stored under another key)"
        )
    return payload


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


def membership_capacity(total: int, shard: int, shards: int) -> int:
    """Contribution-log capacity of one membership shard: ``total`` split evenly.

    Shard ``i`` holds ``total // shards`` records, plus one if ``i < total % shards``.
    """
    return total // shards + (1 if shard < total % shards else 0)


def encode_batch(
    records: list[tuple[int, int, int, str, int, int, float, int]], contexts: dict[int, Any] | None
) -> bytes:
    """One durable history batch's payload: msgpack of columns (stored sealed with its
    key, ``_codec.seal``; ``_store.decode_batch`` reads it).

    Columns are little-endian arrays: ``m`` u8, ``r`` i64, ``u``/``e``/``t`` u64, ``w``
    f32, ``ts`` i64, ``ci`` u8 (or u32 when a batch has 256+ cohorts) indexing ``c``,
    the batch's cohort names; ``x`` maps record index to its signal context's msgpack
    bytes (a msgpack bin; stores written before contexts were packed at the call hold
    the mapping itself there).
    """
    names = sorted({rec[3] for rec in records})
    pos = {c: i for i, c in enumerate(names)}
    ci = array("B" if len(names) < 256 else "I", (pos[rec[3]] for rec in records))
    payload: dict[str, Any] = {
        "c": names,
        "ci": ci.tobytes() if ci.typecode == "B" else array("I", ci).tobytes(),
        "m": array("B", (rec[0] for rec in records)).tobytes(),
        "r": array("q", (rec[1] for rec in records)).tobytes(),
        "u": array("Q", (rec[2] for rec in records)).tobytes(),
        "e": array("Q", (rec[4] for rec in records)).tobytes(),
        "t": array("Q", (rec[5] for rec in records)).tobytes(),
        "w": array("f", (rec[6] for rec in records)).tobytes(),
        "ts": array("q", (rec[7] for rec in records)).tobytes(),
    }
    if contexts:
        payload["x"] = contexts
    return msgpack.packb(payload)  # type: ignore[no-any-return]


def encode_manifest(m: PurgeManifest) -> bytes:
    """msgpack of a manifest; the purge id stays 16 bytes (msgpack ints stop at 64 bits)."""
    return msgpack.packb(  # type: ignore[no-any-return]
        [
            m.purge_id.to_bytes16(),
            m.user_id,
            m.cohort,
            m.created_at_ns,
            m.entries,
            m.evicted,
        ]  # tuples pack as msgpack arrays, as lists do
    )


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
