"""The store's byte layouts, pinned against bytes built by hand from the layouts the
spec and `storage.format` document: a store written by an earlier build must still
open, so no encoder may drift. The Tag table in the docstring matches the enum."""

from __future__ import annotations

import re
import struct
import zlib

import lz4.block
import msgpack
import pytest

from tidal_actors._errors import StorageError
from tidal_actors._types import (
    ContributionRecord,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
)
from tidal_actors.storage import format as F
from tidal_actors.storage.format import Keyspace, Tag

PID = PurgeId((5 << 64) | 7)
PID16 = (5).to_bytes(8, "big") + (7).to_bytes(8, "big")


def key(entity: int, tag: int, suffix: bytes = b"") -> bytes:
    """Spec: ``entity_id`` 8 bytes BE, ``0x00``, the tag byte, the suffix."""
    return struct.pack(">Q", entity) + b"\x00" + bytes([tag]) + suffix


def test_the_tag_table_lists_every_tag_with_its_value() -> None:
    rows = re.findall(r"^\s+([A-Z_]+)\s+0x([0-9A-F]{2})\s+(\w+)", Tag.__doc__ or "", re.M)
    assert {name: int(v, 16) for name, v, _ in rows} == {t.name: t.value for t in Tag}
    assert {ks for _, _, ks in rows} == {k.value for k in Keyspace}


def test_keys() -> None:
    assert F.encode_key(2**64 - 2, Tag.COMMUNITY_LEAVE) == key(2**64 - 2, 0x11)
    assert F.batch_key(3, 9) == key(3, 0x14, struct.pack(">Q", 9))
    assert F.batch_key_shard_seq(F.batch_key(3, 9)) == (3, 9)
    assert F.snapshot_chunk_key(2, 1) == key(2, 0x19, struct.pack(">I", 1))
    assert F.decode_key(key(4, 0x10, PID16)) == (4, 0x10, PID16)
    with pytest.raises(ValueError):
        F.decode_key(b"\x00" * 9)


def test_seal() -> None:
    k, payload = F.batch_key(1, 2), msgpack.packb({"a": 1})
    sealed = F.seal(k, payload)
    assert sealed == b"\xc1\x01" + struct.pack("<I", zlib.crc32(k + payload)) + payload
    assert bytes(F.unseal(sealed, "history", k)) == payload
    assert F.unseal(payload, "history", k) == payload  # a map written before seals


def test_users_keyspace_values() -> None:
    status, hist = F.membership_ops(9, MembershipStatus.Left, 1234, [[1234, None]])
    assert status == ("users", key(9, 0x11), b"\x01" + struct.pack("<Q", 1234))
    assert hist == ("users", key(9, 0x12), msgpack.packb([[1234, None]]))
    active = F.membership_ops(9, MembershipStatus.Active, None, [])[0][2]
    assert active == b"\x00" + b"\x00" * 8
    assert F.decode_membership(active) == (MembershipStatus.Active, None)
    assert F.decode_leave_history(hist[2]) == [[1234, None]]
    assert F.cohorts_op(9, ("a", "b")) == ("users", key(9, 0x13), msgpack.packb(["a", "b"]))
    assert F.cohorts_op(9, ()) == ("users", key(9, 0x13), None)
    assert F.decode_cohorts(msgpack.packb(["a", "b"])) == ("a", "b")


def test_items_keyspace_values() -> None:
    rec = ContributionRecord(9, "c", 3, 1, 0.5, 100)
    m = PurgeManifest(PID, 9, "c", 200, (rec,), 2)
    raw = msgpack.packb([PID16, 9, "c", 200, [[9, "c", 3, 1, 0.5, 100]], 2])
    assert F.encode_manifest(m) == raw and F.decode_manifest(raw) == m
    assert F.manifest_op(9, PID, raw) == ("items", key(9, 0x10, PID16), raw)
    tomb = F.tombstone_op(9, PID, [0, 1], [5, 6])
    assert tomb == ("items", key(9, 0x15, PID16), msgpack.packb([[0, 5], [1, 6]]))
    assert F.decode_tombstone(tomb[2]) == [(0, 5), (1, 6)]
    s = PurgeStatus(PID, 9, "c", 1, True, 300, 4)
    value = msgpack.packb([PID16, 9, "c", 1, True, 300, 4, 77])
    assert F.status_op(s, 77) == ("items", key(9, 0x17, PID16), value)
    assert F.decode_status(value) == (s, 77)


def test_meta_keyspace_values() -> None:
    ev = F.eviction_state_op(2, 10, 50)
    assert ev == ("meta", key(2, 0x16), msgpack.packb([10, [], 50]))
    assert F.decode_eviction_state(msgpack.packb([10, [3, 4], 50])) == (10, [3, 4], 50)
    meta = F.store_meta_op(1, 4)
    assert meta == ("meta", key(0, 0x18), msgpack.packb({"format": 1, "membership_shards": 4}))
    mark = F.snapshot_mark_op(4, [1, 2])
    assert mark == ("meta", key(0, 0x1A), msgpack.packb({"format": 4, "key": [1, 2]}))
    assert F.snapshot_delete_ops({1: 2}) == [
        ("meta", key(0, 0x1A), None),
        ("meta", key(1, 0x19, struct.pack(">I", 0)), None),
        ("meta", key(1, 0x19, struct.pack(">I", 1)), None),
    ]
    chunk = F.snapshot_chunk_ops(1, [b"\x80"])[0]
    assert chunk == ("meta", key(1, 0x19, b"\x00" * 4), F.seal(chunk[1], b"\x80"))
    assert F.settings_op({"a": 1}) == ("meta", key(0, 0x1B), msgpack.packb({"a": 1}))
    with pytest.raises(ValueError):
        F.decode_map(msgpack.packb([1]))


def _hand_body(head: bytes) -> bytes:
    """The body of the batch of `test_history_batch_value`, by hand from the layout:
    head, descriptors, bases, items; ``r`` and ``ts`` as deltas at a write, the
    other columns plain in the narrowest width their values need."""
    return (
        struct.pack("<I", len(head))
        + head
        + bytes([0x01, 0x01, 0x11, 0x01, 0x01, 0x01, 0x04, 0x11])  # transform << 4 | width
        + struct.pack("<qq", 5, 100)  # the bases of r and ts
        + b"\x01\x00"  # m
        + b"\x01\x00"  # ci: "b" is 1, "a" is 0
        + struct.pack("<bb", 0, 1)  # r: 5, 6
        + b"\x09\x08"  # u
        + b"\x03\x04"  # e
        + b"\x01\x02"  # t
        + struct.pack("<ff", 0.5, 1.0)  # w: the float32 bits
        + struct.pack("<bb", 0, 100)  # ts: 100, 200
    )


def test_history_batch_value() -> None:
    """Version 3, built by hand from the layout: header, index (names, least ts, the
    sorted distinct users: kind 0), then the body with the contexts as its head."""
    cols = ([1, 0], [5, 6], [9, 8], ["b", "a"], [3, 4], [1, 2], [0.5, 1.0], [100, 200])
    op = F.batch_op(2, 7, cols, {1: b"\x80"})
    # the least ts, kind 0 (the sorted distinct users), 16 bytes of them, the names
    index = struct.pack("<qBI", 100, 0, 16) + struct.pack("<QQ", 8, 9) + msgpack.packb(["a", "b"])
    body = _hand_body(msgpack.packb({1: b"\x80"}))
    key = F.batch_key(2, 7)
    assert op[:2] == ("history", key)
    payload = op[2][6:]
    assert op[2] == F.seal(key, payload)
    version, codec, n, size, x = struct.unpack_from("<BBIII", payload)
    assert (version, n, size, payload[14 : 14 + x]) == (3, 2, len(body), index)
    if codec == 1:
        assert lz4.block.decompress(payload[14 + x :], uncompressed_size=size) == body
    else:
        assert (codec, payload[14 + x :]) == (0, body)
    b = F.decode_batch(2, 7, op[2])
    assert b.cohorts == ["a", "b"] and b.u.tolist() == [9, 8] and b.contexts == {1: b"\x80"}
    assert b.r.tolist() == [5, 6] and b.ts.tolist() == [100, 200] and b.w.tolist() == [0.5, 1.0]
    got = F.batch_index(op[2], key)
    assert got is not None and (got.names, got.ts_min, got.user_kind) == (["a", "b"], 100, 0)


def test_history_batch_version_2_value_still_decodes() -> None:
    """A version 2 payload (no index; the names in the body's head), by hand, stored
    and compressed: it decodes alike, and has no index."""
    body = _hand_body(msgpack.packb([["a", "b"], {1: b"\x80"}]))
    key = F.batch_key(2, 7)
    for codec, rest in ((0, body), (1, lz4.block.compress(body, store_size=False))):
        value = F.seal(key, struct.pack("<BBII", 2, codec, 2, len(body)) + rest)
        b = F.decode_batch(2, 7, value)
        assert b.cohorts == ["a", "b"] and b.ci.tolist() == [1, 0] and b.m.tolist() == [1, 0]
        assert b.r.tolist() == [5, 6] and b.u.tolist() == [9, 8] and b.e.tolist() == [3, 4]
        assert b.t.tolist() == [1, 2] and b.w.tolist() == [0.5, 1.0]
        assert b.ts.tolist() == [100, 200] and b.contexts == {1: b"\x80"}
        assert F.batch_index(value, key) is None


def test_history_batch_version_1_value_still_decodes() -> None:
    """A store written before version 2 holds msgpack maps: they decode alike."""
    payload = msgpack.packb(
        {
            "c": ["a", "b"],
            "ci": b"\x01\x00",
            "m": b"\x01\x00",
            "r": struct.pack("<qq", 5, 6),
            "u": struct.pack("<QQ", 9, 8),
            "e": struct.pack("<QQ", 3, 4),
            "t": struct.pack("<QQ", 1, 2),
            "w": struct.pack("<ff", 0.5, 1.0),
            "ts": struct.pack("<qq", 100, 200),
            "x": {1: b"\x80"},
        }
    )
    for value in (F.seal(F.batch_key(2, 7), payload), payload):  # sealed, and from before seals
        b = F.decode_batch(2, 7, value)
        assert b.cohorts == ["a", "b"] and b.ci.tolist() == [1, 0] and b.m.tolist() == [1, 0]
        assert b.r.tolist() == [5, 6] and b.u.tolist() == [9, 8] and b.e.tolist() == [3, 4]
        assert b.t.tolist() == [1, 2] and b.w.tolist() == [0.5, 1.0]
        assert b.ts.tolist() == [100, 200] and b.contexts == {1: b"\x80"}


def test_history_batch_of_an_unknown_version_names_the_key_and_what_to_do() -> None:
    key = F.batch_key(2, 7)
    with pytest.raises(StorageError, match=rf"history key {key.hex()}.*version 4.*later version"):
        F.decode_batch(2, 7, F.seal(key, b"\x04" + bytes(20)))
