"""The columnar encoding of a history batch (version 3, and version 2 read): each
integer column in the narrowest byte width its values, or their deltas, need, the
whole compressed with LZ4 (its block format, fast mode), behind an index read
without decompressing (the cohort names, the least timestamp, a filter of the
user ids: `user_filter`), so that an erasure or a retention pass decodes only the
batches that can hold what it drops.

Payload (the value under a ``CONTRIBUTION_BATCH`` key is ``seal(key, payload)``)::

    offset  size  field
    0       1     version, 0x03 (0x02: version 2, read, has no index; a version 1
                  payload is a msgpack map: 0x80-0x8F, 0xDE, 0xDF)
    1       1     codec of the body: 0x00 stored as it is, 0x01 one LZ4 block; 0x02
                  and 0x03 the same (LZ4, stored), written at compaction's settings
                  (compact() leaves such a lone block as it is)
    2       4     n, the number of records (u32 LE)
    6       4     the body's length before compression (u32 LE)
    version 3 only, the index:
    10      4     x, the index's length (u32 LE)
    14      8     the least ts (i64 LE, ns; 2**63 - 1 when n is 0)
    22      1     the user filter's kind (`user_filter`)
    23      4     f, the user filter's length (u32 LE)
    27      f     the user filter
    27+f    ...   the cohort names (sorted), a msgpack array of str, to the index's
                  end (14 + x)
    then the body

Body, uncompressed::

    4        u32 LE  h, the header's length
    h        msgpack contexts or nil (version 2: [cohort names (sorted), contexts
                     or nil]); contexts: record index -> the signal context's
                     msgpack bytes
    then eight columns in this order: m, ci, r, u, e, t, w, ts, each
    1        descriptor: transform << 4 | width (width 1, 2, 4 or 8; 0: every item is 0
             and none is stored)
    8        base (i64 LE), for transforms 1 and 2 only
    n*width  the items, little-endian: unsigned for transform 0, two's complement
             for transforms 1 and 2

A column's values are taken as 64-bit integers (``w`` as the float32's bit
pattern), every transform exact modulo 2**64:

* transform 0, plain: item i is value i (``m``, ``ci`` and ``w`` are always plain);
* transform 1, delta: ``base`` is the first value, item i is ``v[i] - v[i-1]`` (item
  0 is 0), so ``v = base + cumsum(items)``;
* transform 2, delta within the membership shard (``r`` only): ``base`` is the first
  value, item i is ``v[i] - p`` with ``p`` the value of the last record before i of
  the same ``m`` (``base`` for the first record of each ``m``).

The encoder picks, per column, the transform whose items need the fewest bytes,
plain on a tie (a ledger shard's writes skip the search: ``r`` and ``ts`` delta,
the others plain, ``ci`` as wide as the number of names needs, ``w`` in 4 bytes).
The body is stored as it is (codec 0, or 3 at compaction's settings) when LZ4 does
not make it shorter.

The encoder is `columns_encode`, the decoder `columns_decode`; this module holds
what both read. Must not do I/O.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = [
    "CODEC_LZ4",
    "CODEC_LZ4_COMPACTED",
    "CODEC_NONE",
    "CODEC_NONE_COMPACTED",
    "COLUMNS",
    "DELTA",
    "DELTAS",
    "HEAD",
    "INDEX_FIXED",
    "INDEX_LEN",
    "LEVEL_COMPACT",
    "LEVEL_WRITE",
    "MDELTA",
    "OUT",
    "PLAIN",
    "SDT",
    "TARGET",
    "TS_NONE",
    "U32",
    "UDT",
    "VERSION",
    "VERSION_2",
    "WIDTHS",
    "is_columnar",
]

VERSION = 3  # what is written
VERSION_2 = 2  # read: no index
CODEC_NONE = 0
CODEC_LZ4 = 1
CODEC_LZ4_COMPACTED = 2  # an LZ4 block too, written at compaction's settings
CODEC_NONE_COMPACTED = 3  # stored as it is, written at compaction's settings
LEVEL_WRITE = 0  # a ledger shard's writes: transforms fixed, LZ4's fast mode
LEVEL_COMPACT = 1  # compact()'s rewrites: transforms searched, LZ4's fast mode
COLUMNS = ("m", "ci", "r", "u", "e", "t", "w", "ts")

HEAD = struct.Struct("<BBII")
INDEX_LEN = struct.Struct("<I")  # version 3: the index's length, after HEAD
INDEX_FIXED = struct.Struct("<qBI")  # the least ts, the user filter's kind and length
TS_NONE = (1 << 63) - 1  # the least ts of a batch of no record
U32 = struct.Struct("<I")
PLAIN, DELTA, MDELTA = 0, 1, 2
WIDTHS = (1, 2, 4, 8)
UDT = {w: np.dtype(f"<u{w}") for w in WIDTHS}
SDT = {w: np.dtype(f"<i{w}") for w in WIDTHS}
OUT: dict[str, np.dtype[Any]] = {
    "m": np.dtype("<u1"),
    "ci": np.dtype("<u4"),
    "r": np.dtype("<i8"),
    "u": np.dtype("<u8"),
    "e": np.dtype("<u8"),
    "t": np.dtype("<u8"),
    "w": np.dtype("<f4"),
    "ts": np.dtype("<i8"),
}
TARGET = {**OUT, "w": np.dtype("<u4"), "r": np.dtype("<i8"), "u": np.dtype("<i8")}
TARGET.update({c: np.dtype("<i8") for c in ("e", "t", "ts")})
DELTAS: dict[str, tuple[int, ...]] = {"r": (DELTA, MDELTA), "m": (), "ci": (), "w": ()}
DELTAS.update({c: (DELTA,) for c in ("u", "e", "t", "ts")})


def is_columnar(payload: bytes | memoryview) -> bool:
    """Whether an unsealed history payload is in this encoding, version 2 or 3 (its
    first byte)."""
    return len(payload) > 0 and payload[0] in (VERSION, VERSION_2)
