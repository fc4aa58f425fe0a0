"""Keys, tags and the seal of the LMDB store, and the stable shard hashes.

Key layout (spec: leave-stop-forward "Storage key", retroactive-purge FR-3)::

    encode_key(entity_id, tag, suffix) = entity_id.to_bytes(8, "big") + b"\\x00" + bytes([tag]) + suffix

History batches and snapshot chunks, the large values, are sealed (LMDB checksums
nothing)::

    seal(key, payload) = b"\\xc1" + bytes([SEAL_VERSION]) + crc32(key + payload).to_bytes(4, "little") + payload

The CRC covers the value's key too, so a value copied or moved under another key (a
history batch counted twice, two shards' snapshot chunks swapped) fails like a
corrupt one.

``0xC1`` is the one byte msgpack never uses, so a value written before seals (a bare
msgpack map, first byte ``0x80``-``0x8F``, ``0xDE`` or ``0xDF``) is told apart by its
first byte and read as it is; any other first byte is corruption. Must not do I/O.
"""

from __future__ import annotations

import enum
import struct
import zlib

from tidal_actors._errors import StorageError
from tidal_actors.core.sharding import ledger_shard_of, membership_shard_of  # re-exported

__all__ = [
    "SEAL_MAGIC",
    "SEAL_VERSION",
    "Keyspace",
    "Op",
    "Tag",
    "batch_key",
    "batch_key_shard_seq",
    "decode_key",
    "encode_key",
    "ledger_shard_of",
    "membership_capacity",
    "membership_shard_of",
    "seal",
    "snapshot_chunk_key",
    "undecodable",
    "unseal",
]

Op = tuple[str, bytes, "bytes | None"]
"""One store write: ``(keyspace name, key, value)``; value None deletes the key."""


class Tag(enum.IntEnum):
    """The tag byte of every key (one table for the whole store).

    ===================  =====  ==========  =========================================
    tag                  value  keyspace    entity_id / suffix / value
    ===================  =====  ==========  =========================================
    PURGE_MANIFEST       0x10   items       user / purge_id 16B BE / msgpack manifest
    COMMUNITY_LEAVE      0x11   users       user / empty / 9 bytes (see `records`)
    LEAVE_HISTORY        0x12   users       user / empty / msgpack [[left, rejoined|nil]]
    COHORT_ASSIGNMENT    0x13   users       user / empty / msgpack [cohort names]
    CONTRIBUTION_BATCH   0x14   history     ledger shard / batch seq 8B BE / sealed columns
    PURGE_TOMBSTONE      0x15   items       user / purge_id 16B BE / msgpack [[mshard, rseq]]
    EVICTION_STATE       0x16   meta        membership shard / empty / msgpack [watermark, [], next]
    PURGE_STATUS         0x17   items       user / purge_id 16B BE / msgpack status
    STORE_META           0x18   meta        0 / empty / msgpack {format, shards}
    SNAPSHOT_CHUNK       0x19   meta        ledger shard / chunk 4B BE / sealed msgpack
    SNAPSHOT_MARK        0x1A   meta        0 / empty / msgpack {format, key}
    STORE_SETTINGS       0x1B   meta        0 / empty / msgpack {setting: value}
    LINK_STATE           0x1C   meta        ledger shard / sender name / msgpack [epoch, seq]
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
    LINK_STATE = 0x1C


class Keyspace(str, enum.Enum):
    """Named LMDB databases, in each environment of a store (`storage.layout`)."""

    USERS = "users"
    ITEMS = "items"
    HISTORY = "history"
    META = "meta"


def encode_key(entity_id: int, tag: int, suffix: bytes = b"") -> bytes:
    """``entity_id`` (8 bytes BE) + ``0x00`` + ``tag`` (1 byte) + ``suffix``."""
    return entity_id.to_bytes(8, "big") + b"\x00" + bytes((tag,)) + suffix


def decode_key(key: bytes) -> tuple[int, int, bytes]:
    """Inverse of :func:`encode_key`: ``(entity_id, tag, suffix)``.

    Raises:
        ValueError: shorter than 10 bytes, or byte 8 is not ``0x00``.
    """
    if len(key) < 10 or key[8] != 0:
        raise ValueError(f"not an encoded key: {key!r}")
    return int.from_bytes(key[:8], "big"), key[9], bytes(key[10:])


def batch_key(shard: int, seq: int) -> bytes:
    """Key of ledger ``shard``'s history batch ``seq`` (history keyspace): 18 bytes."""
    return encode_key(shard, Tag.CONTRIBUTION_BATCH, seq.to_bytes(8, "big"))


def batch_key_shard_seq(key: bytes) -> tuple[int, int]:
    """``(ledger shard, batch sequence)`` of a :func:`batch_key`."""
    return int.from_bytes(key[:8], "big"), int.from_bytes(key[10:18], "big")


def snapshot_chunk_key(shard: int, chunk: int) -> bytes:
    """Key of ledger ``shard``'s snapshot chunk ``chunk`` (meta keyspace)."""
    return encode_key(shard, Tag.SNAPSHOT_CHUNK, chunk.to_bytes(4, "big"))


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


def undecodable(keyspace: Keyspace, key: bytes, exc: BaseException) -> StorageError:
    """The error for a stored value (or key) that does not decode, naming the
    keyspace, the key in hex and the cause."""
    return StorageError(
        f"cannot decode {keyspace.value} key {bytes(key).hex()}: {type(exc).__name__}: {exc}"
    )


def membership_capacity(total: int, shard: int, shards: int) -> int:
    """Contribution-log capacity of one membership shard: ``total`` split evenly.

    Shard ``i`` holds ``total // shards`` records, plus one if ``i < total % shards``.
    """
    return total // shards + (1 if shard < total % shards else 0)
