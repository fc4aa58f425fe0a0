"""The encoder of the columnar history batch: `encode_columnar` (the layout:
`columns`). Must not do I/O."""

from __future__ import annotations

import struct
from typing import Any, cast

import lz4.block
import msgpack
import numpy as np

from tidal_actors.storage.format.columns import (
    CODEC_LZ4,
    CODEC_LZ4_COMPACTED,
    CODEC_NONE,
    CODEC_NONE_COMPACTED,
    DELTA,
    HEAD,
    INDEX_FIXED,
    INDEX_LEN,
    LEVEL_WRITE,
    MDELTA,
    PLAIN,
    SDT,
    TS_NONE,
    U32,
    UDT,
    VERSION,
    VERSION_2,
    WIDTHS,
)
from tidal_actors.storage.format.user_filter import user_filter

__all__ = ["encode_columnar"]


def _uwidth(top: int) -> int:
    """Bytes an unsigned value ``top`` needs (0 for 0)."""
    if top == 0:
        return 0
    for w in WIDTHS:
        if top < 1 << (8 * w):
            return w
    raise AssertionError(top)


def _swidth(lo: int, hi: int) -> int:
    """Bytes a two's complement integer needs to hold every value in ``[lo, hi]``."""
    if lo == hi == 0:
        return 0
    for w in WIDTHS:
        half = 1 << (8 * w - 1)
        if -half <= lo and hi < half:
            return w
    raise AssertionError((lo, hi))


def _deltas(v: np.ndarray) -> np.ndarray:
    """``v[i] - v[i - 1]`` modulo 2**64 as int64 (the first item 0)."""
    d = np.empty_like(v)
    d[:1] = 0
    np.subtract(v[1:], v[:-1], out=d[1:])
    return d.view(np.int64)


def _mdeltas(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``v[i]`` minus the last earlier value of the same ``m`` (``v[0]`` for the first
    of each ``m``), modulo 2**64, as int64."""
    d = np.empty_like(v)
    for shard in np.unique(m).tolist():
        sel = np.flatnonzero(m == shard)
        g = v[sel]
        d[sel[:1]] = g[:1] - v[:1]  # slices: arrays wrap modulo 2**64 without a warning
        d[sel[1:]] = g[1:] - g[:-1]
    return d.view(np.int64)


def _column(
    v: np.ndarray, kinds: tuple[int, ...], m: np.ndarray | None, out: list[tuple[int, int, bytes]]
) -> None:
    """Append column ``v`` (u64) to ``out`` as ``(descriptor, base, items)``, in the
    transform of ``kinds`` whose items are narrowest (the first on a tie)."""
    best: tuple[int, int, np.ndarray] | None = None
    for kind in kinds:
        if kind == PLAIN:
            items, w = v, _uwidth(int(v.max())) if len(v) else 0
        else:
            assert kind == DELTA or m is not None
            items = _deltas(v) if kind == DELTA else _mdeltas(v, cast(np.ndarray, m))
            w = _swidth(int(items.min()), int(items.max()))
        if best is None or w < best[0]:
            best = (w, kind, items)
    assert best is not None
    width, kind, items = best
    base = int(v[:1].view(np.int64)[0]) if kind != PLAIN else 0
    data = b""
    if width:
        data = items.astype((UDT if kind == PLAIN else SDT)[width]).tobytes()
    out.append(((kind << 4) | width, base, data))


def _u64(a: Any, dtype: str) -> np.ndarray:
    out: np.ndarray = np.asarray(a, dtype=dtype).view(np.uint64)  # 8-byte items: any layout
    return out


def encode_columnar(
    names: list[str],
    ci: np.ndarray,
    cols: dict[str, Any],
    contexts: dict[int, Any] | None,
    level: int = LEVEL_WRITE,
    one_shard: bool = False,
    version: int = VERSION,
) -> bytes:
    """A version 3 payload (`columns`), or version 2 (tests and benchmarks: what
    stores written before version 3 hold).

    Args:
        names: the batch's cohort names, sorted; ``ci`` (ints, one per record)
            indexes them.
        cols: ``m`` (u8, or one int for every record), ``r`` (i64), ``u``, ``e``, ``t`` (u64), ``w`` (float32),
            ``ts`` (i64, ns): array-likes of one length, that of ``ci``.
        contexts: record index -> context bytes, or None.
        level: 0 (``LEVEL_WRITE``): each column's transform fixed, LZ4's fast mode,
            codec 1 (0 stored); 1 (``LEVEL_COMPACT``): each column's narrowest
            transform, LZ4's fast mode, codec 2 (3 stored); 2-12: the same in LZ4's high-compression mode at
            that level.
        one_shard: every record has the same ``m`` (the caller knows it).
        version: 3 (``VERSION``), or 2 (``VERSION_2``).
    """
    n = len(ci)
    u = _u64(cols["u"], "<u8")
    if version == VERSION:
        ts = np.asarray(cols["ts"], dtype="<i8")
        kind, users = user_filter(u)
        index = b"".join(
            [
                INDEX_FIXED.pack(int(ts.min()) if n else TS_NONE, kind, len(users)),
                users,
                msgpack.packb(names),
            ]
        )
        head = msgpack.packb(contexts or None)
    elif version == VERSION_2:
        head = msgpack.packb([names, contexts or None])
    else:
        raise ValueError(f"no columnar version {version}")
    out: list[tuple[int, int, bytes]] = []
    search = level > 0
    plain, delta = (PLAIN,), ((PLAIN, DELTA) if search else (DELTA,))
    if n < 2:
        delta = plain
    shard = cols["m"]
    if isinstance(shard, int):  # one membership shard for every record
        width = _uwidth(shard) if n else 0
        out.append((width, 0, bytes((shard,)) * n if width else b""))
        m = None
        varied = False
    else:
        m = np.asarray(shard, dtype="<u1").astype(np.uint64)
        varied = n > 1 and not one_shard and m.max() != m.min()
        _column(m, plain, m, out)
    if search:
        _column(np.asarray(ci, dtype=np.uint64), plain, None, out)
    else:  # the width the names need: no pass over the indexes
        width = _uwidth(len(names) - 1) if n else 0
        out.append((width, 0, np.asarray(ci).astype(UDT[width]).tobytes() if width else b""))
    _column(_u64(cols["r"], "<i8"), delta + ((MDELTA,) if varied else ()), m, out)
    for c in ("u", "e", "t"):
        _column(u if c == "u" else _u64(cols[c], "<u8"), delta if search else plain, m, out)
    w = np.ascontiguousarray(np.asarray(cols["w"], dtype="<f4"))
    if search:
        _column(w.view("<u4").astype(np.uint64), plain, None, out)
    else:  # the float32 bits as they are
        out.append((4 if n else 0, 0, w.tobytes()))
    _column(_u64(cols["ts"], "<i8"), delta, m, out)
    bases = [b for d, b, _ in out if d >> 4 != PLAIN]
    body = b"".join(
        [
            U32.pack(len(head)),
            head,
            bytes(d for d, _, _ in out),
            struct.pack(f"<{len(bases)}q", *bases),
            *(data for _, _, data in out),
        ]
    )
    if level > 1:
        packed: bytes = lz4.block.compress(
            body, mode="high_compression", compression=level, store_size=False
        )
    else:
        packed = lz4.block.compress(body, store_size=False)
    codec = CODEC_LZ4_COMPACTED if search else CODEC_LZ4
    if len(packed) >= len(body):
        codec, packed = (CODEC_NONE_COMPACTED if search else CODEC_NONE), body
    head_ = HEAD.pack(version, codec, n, len(body))
    if version == VERSION:
        return b"".join([head_, INDEX_LEN.pack(len(index)), index, packed])
    return head_ + packed
