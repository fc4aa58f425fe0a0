"""An independent reader of the durable history in an LMDB store's data file, from
docs/storage-format.md ("History batch": versions 1, 2, 3) with `lmdb`, `lz4`,
`msgpack` and `struct` only, not the package's decoder: tests check with it what a
purge or a retention pass left on disk.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import lmdb
import lz4.block
import msgpack

Rec = tuple[str, int, int, int, int]
"""``(cohort, user, entity, type, ts)``."""

_COLS = ("m", "ci", "r", "u", "e", "t", "w", "ts")
_MASK = 2**64 - 1


def _signed(v: int) -> int:
    return v - 2**64 if v >= 2**63 else v


def _decode_columnar(p: bytes) -> tuple[list[Rec], dict[str, Any]]:
    version, codec, n, raw_len = struct.unpack_from("<BBII", p, 0)
    index: dict[str, Any] = {}
    if version == 3:
        (x,) = struct.unpack_from("<I", p, 10)
        ts_min, kind, f = struct.unpack_from("<qBI", p, 14)
        users_filter = p[27 : 27 + f]
        names = msgpack.unpackb(p[27 + f : 14 + x])
        index = {"ts_min": ts_min, "kind": kind, "filter": users_filter, "names": names}
        packed = p[14 + x :]
    else:
        assert version == 2, version
        packed = p[10:]
    body = packed if codec in (0, 3) else lz4.block.decompress(packed, uncompressed_size=raw_len)
    assert len(body) == raw_len
    (h,) = struct.unpack_from("<I", body, 0)
    head = msgpack.unpackb(body[4 : 4 + h], strict_map_key=False)
    if version == 2:
        names, head = head
    index["contexts"] = {
        i: msgpack.unpackb(c, strict_map_key=False) if isinstance(c, bytes) else c
        for i, c in (head or {}).items()
    }
    at = 4 + h
    descs = body[at : at + 8]
    at += 8
    with_base = [i for i, d in enumerate(descs) if d >> 4]
    bases = dict(zip(with_base, struct.unpack_from(f"<{len(with_base)}q", body, at)))
    at += 8 * len(with_base)
    cols: dict[str, list[int]] = {}
    m: list[int] = []
    for i, (name, d) in enumerate(zip(_COLS, descs)):
        width, transform = d & 15, d >> 4
        fmt = {0: None, 1: "B", 2: "H", 4: "I", 8: "Q"}[width]
        items = list(struct.unpack_from(f"<{n}{fmt}", body, at)) if fmt else [0] * n
        at += n * width
        if width and width < 8:  # two's complement at that width, for the deltas
            items = [v - (1 << (8 * width)) if v >> (8 * width - 1) else v for v in items]
        if transform == 0:
            vals = [v & _MASK for v in items]
        elif transform == 1:
            vals, acc = [], bases[i]
            for v in items:
                acc = (acc + v) & _MASK
                vals.append(acc)
        else:  # delta within the membership shard
            vals, last = [], {}
            for v, s in zip(items, m):
                last[s] = (last.get(s, bases[i]) + v) & _MASK
                vals.append(last[s])
        if name == "m":
            m = vals
        cols[name] = vals
    recs = [
        (names[c], u, e, t, _signed(ts))
        for c, u, e, t, ts in zip(cols["ci"], cols["u"], cols["e"], cols["t"], cols["ts"])
    ]
    return recs, index


def transforms(payload: bytes) -> list[int]:
    """The transform of each column (order `_COLS`) of a version 3 payload."""
    (x,) = struct.unpack_from("<I", payload, 10)
    codec, _, raw_len = struct.unpack_from("<BII", payload, 1)
    packed = payload[14 + x :]
    body = packed if codec in (0, 3) else lz4.block.decompress(packed, uncompressed_size=raw_len)
    (h,) = struct.unpack_from("<I", body, 0)
    return [d >> 4 for d in body[4 + h : 12 + h]]


def decode(payload: bytes) -> tuple[list[Rec], dict[str, Any]]:
    """The records of one unsealed batch payload and its index (for versions 2 and 3:
    with ``contexts``, record index -> the signal's context; empty for version 1)."""
    if payload[0] in (2, 3):
        return _decode_columnar(payload)
    mp = msgpack.unpackb(payload, strict_map_key=False)
    n = len(mp["u"]) // 8
    ci = struct.unpack(f"<{n}{'B' if len(mp['c']) < 256 else 'I'}", mp["ci"])
    us, es, tt, ts = (
        struct.unpack(f"<{n}{f}", mp[c])
        for f, c in (("Q", "u"), ("Q", "e"), ("Q", "t"), ("q", "ts"))
    )
    return [(mp["c"][c], u, e, t, s) for c, u, e, t, s in zip(ci, us, es, tt, ts)], {}


def env_dirs(path: str) -> list[str]:
    """The LMDB environments of the store at ``path``: itself (the single layout), or
    each directory under its ``shards/`` (the shards layout, docs/storage-format.md)."""
    shards = os.path.join(path, "shards")
    if not os.path.isdir(shards):
        return [path]
    return [os.path.join(shards, n) for n in sorted(os.listdir(shards))]


def data_bytes(path: str) -> bytes:
    """Every byte of the store's data files (``data.mdb`` of each environment)."""
    out = b""
    for d in env_dirs(path):
        with open(os.path.join(d, "data.mdb"), "rb") as f:
            out += f.read()
    return out


def history(path: str) -> dict[bytes, tuple[list[Rec], dict[str, Any]]]:
    """Every history batch of the store at ``path`` (either layout): key -> (records,
    index)."""
    out = {}
    for d in env_dirs(path):
        env = lmdb.open(d, readonly=True, lock=False, max_dbs=8, subdir=True)
        try:
            db = env.open_db(b"history", create=False)
            with env.begin() as txn:
                for k, v in txn.cursor(db):
                    v = bytes(v)
                    assert v[0] == 0xC1, v[:1]
                    assert bytes(k) not in out, k  # a batch in one environment only
                    out[bytes(k)] = decode(v[6:])
        finally:
            env.close()
    return out
