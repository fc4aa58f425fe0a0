"""The columnar encoding of a history batch (version 2): each integer column in the
narrowest byte width its values, or their deltas, need, the whole compressed with
LZ4 (its block format, fast mode).

Payload (the value under a ``CONTRIBUTION_BATCH`` key is ``seal(key, payload)``)::

    offset  size  field
    0       1     version, 0x02 (a version 1 payload is a msgpack map: 0x80-0x8F, 0xDE, 0xDF)
    1       1     codec of the body: 0x00 stored as it is, 0x01 one LZ4 block, 0x02
                  one LZ4 block written by compact() (decoded as 0x01)
    2       4     n, the number of records (u32 LE)
    6       4     the body's length before compression (u32 LE)
    10      ...   the body

Body, uncompressed::

    4        u32 LE  h, the header's length
    h        msgpack [cohort names (sorted), contexts or nil]  (contexts: record index
                     -> the signal context's msgpack bytes)
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
the others plain, ``ci`` as wide as the number of names needs, ``w`` in 4 bytes). The codec is 0 when LZ4 does not make the body shorter.
Must not do I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, cast

import lz4.block
import msgpack
import numpy as np

__all__ = [
    "CODEC_LZ4",
    "CODEC_LZ4_COMPACTED",
    "CODEC_NONE",
    "COLUMNS",
    "LEVEL_COMPACT",
    "LEVEL_WRITE",
    "VERSION",
    "Parsed",
    "decode_columns",
    "decode_v2",
    "encode_v2",
    "is_v2",
    "parse_v2",
]

VERSION = 2
CODEC_NONE = 0
CODEC_LZ4 = 1
CODEC_LZ4_COMPACTED = 2  # an LZ4 block too, written by compact() (decoded alike)
LEVEL_WRITE = 0  # a ledger shard's writes: transforms fixed, LZ4's fast mode
LEVEL_COMPACT = 1  # compact()'s rewrites: transforms searched, LZ4's fast mode
COLUMNS = ("m", "ci", "r", "u", "e", "t", "w", "ts")

_HEAD = struct.Struct("<BBII")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_PLAIN, _DELTA, _MDELTA = 0, 1, 2
_WIDTHS = (1, 2, 4, 8)
_UDT = {w: np.dtype(f"<u{w}") for w in _WIDTHS}
_SDT = {w: np.dtype(f"<i{w}") for w in _WIDTHS}
_OUT: dict[str, np.dtype[Any]] = {
    "m": np.dtype("<u1"),
    "ci": np.dtype("<u4"),
    "r": np.dtype("<i8"),
    "u": np.dtype("<u8"),
    "e": np.dtype("<u8"),
    "t": np.dtype("<u8"),
    "w": np.dtype("<f4"),
    "ts": np.dtype("<i8"),
}
_TARGET = {**_OUT, "w": np.dtype("<u4"), "r": np.dtype("<i8"), "u": np.dtype("<i8")}
_TARGET.update({c: np.dtype("<i8") for c in ("e", "t", "ts")})
_DELTAS: dict[str, tuple[int, ...]] = {"r": (_DELTA, _MDELTA), "m": (), "ci": (), "w": ()}
_DELTAS.update({c: (_DELTA,) for c in ("u", "e", "t", "ts")})


def is_v2(payload: bytes | memoryview) -> bool:
    """Whether an unsealed history payload is in this encoding (its first byte)."""
    return len(payload) > 0 and payload[0] == VERSION


def _uwidth(top: int) -> int:
    """Bytes an unsigned value ``top`` needs (0 for 0)."""
    if top == 0:
        return 0
    for w in _WIDTHS:
        if top < 1 << (8 * w):
            return w
    raise AssertionError(top)


def _swidth(lo: int, hi: int) -> int:
    """Bytes a two's complement integer needs to hold every value in ``[lo, hi]``."""
    if lo == hi == 0:
        return 0
    for w in _WIDTHS:
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
        if kind == _PLAIN:
            items, w = v, _uwidth(int(v.max())) if len(v) else 0
        else:
            assert kind == _DELTA or m is not None
            items = _deltas(v) if kind == _DELTA else _mdeltas(v, cast(np.ndarray, m))
            w = _swidth(int(items.min()), int(items.max()))
        if best is None or w < best[0]:
            best = (w, kind, items)
    assert best is not None
    width, kind, items = best
    base = int(v[:1].view(np.int64)[0]) if kind != _PLAIN else 0
    data = b""
    if width:
        data = items.astype((_UDT if kind == _PLAIN else _SDT)[width]).tobytes()
    out.append(((kind << 4) | width, base, data))


def _u64(a: Any, dtype: str) -> np.ndarray:
    out: np.ndarray = np.asarray(a, dtype=dtype).view(np.uint64)  # 8-byte items: any layout
    return out


def encode_v2(
    names: list[str],
    ci: np.ndarray,
    cols: dict[str, Any],
    contexts: dict[int, Any] | None,
    level: int = LEVEL_WRITE,
    one_shard: bool = False,
) -> bytes:
    """A version 2 payload (module doc).

    Args:
        names: the batch's cohort names, sorted; ``ci`` (ints, one per record)
            indexes them.
        cols: ``m`` (u8, or one int for every record), ``r`` (i64), ``u``, ``e``, ``t`` (u64), ``w`` (float32),
            ``ts`` (i64, ns): array-likes of one length, that of ``ci``.
        contexts: record index -> context bytes, or None.
        level: 0 (``LEVEL_WRITE``): each column's transform fixed, LZ4's fast mode,
            codec 1; 1 (``LEVEL_COMPACT``): each column's narrowest transform, LZ4's
            fast mode, codec 2; 2-12: the same in LZ4's high-compression mode at
            that level.
        one_shard: every record has the same ``m`` (the caller knows it).
    """
    n = len(ci)
    head = msgpack.packb([names, contexts or None])
    out: list[tuple[int, int, bytes]] = []
    search = level > 0
    plain, delta = (_PLAIN,), ((_PLAIN, _DELTA) if search else (_DELTA,))
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
        out.append((width, 0, np.asarray(ci).astype(_UDT[width]).tobytes() if width else b""))
    _column(_u64(cols["r"], "<i8"), delta + ((_MDELTA,) if varied else ()), m, out)
    for c in ("u", "e", "t"):
        _column(_u64(cols[c], "<u8"), delta if search else plain, m, out)
    w = np.ascontiguousarray(np.asarray(cols["w"], dtype="<f4"))
    if search:
        _column(w.view("<u4").astype(np.uint64), plain, None, out)
    else:  # the float32 bits as they are
        out.append((4 if n else 0, 0, w.tobytes()))
    _column(_u64(cols["ts"], "<i8"), delta, m, out)
    bases = [b for d, b, _ in out if d >> 4 != _PLAIN]
    body = b"".join(
        [
            _U32.pack(len(head)),
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
    if len(packed) < len(body):
        return (
            _HEAD.pack(VERSION, CODEC_LZ4_COMPACTED if search else CODEC_LZ4, n, len(body)) + packed
        )
    return _HEAD.pack(VERSION, CODEC_NONE, n, len(body)) + body


@dataclass
class Parsed:
    """A version 2 payload read as far as its columns' descriptors (`parse_v2`):
    per column ``(transform, width, base, items)`` (``items`` a memoryview of the body)."""

    n: int
    names: list[str]
    contexts: dict[int, Any] | None
    cols: list[tuple[int, int, int, memoryview]]


def parse_v2(payload: bytes | memoryview) -> Parsed:
    """Decompress a version 2 payload and read its header and column descriptors.

    Raises:
        ValueError: an unknown version, codec, transform or width, or lengths that do
            not add up.
    """
    version, codec, n, size = _HEAD.unpack_from(payload)
    if version != VERSION:
        raise ValueError(f"not a version 2 history batch (version byte {version})")
    rest = memoryview(payload)[_HEAD.size :]
    if codec in (CODEC_LZ4, CODEC_LZ4_COMPACTED):
        body = memoryview(lz4.block.decompress(rest, uncompressed_size=size))
    elif codec == CODEC_NONE:
        body = rest
    else:
        raise ValueError(f"unknown history batch codec {codec}")
    if len(body) != size:
        raise ValueError(f"the body is {len(body)} bytes, its header says {size}")
    (h,) = _U32.unpack_from(body)
    try:
        names, contexts = msgpack.unpackb(body[4 : 4 + h], strict_map_key=False)
    except TypeError:  # a context mapping with a tuple key (an array in msgpack)
        names, contexts = msgpack.unpackb(
            body[4 : 4 + h], strict_map_key=False, object_pairs_hook=_pairs
        )
    if not (isinstance(names, list) and all(isinstance(c, str) for c in names)):
        raise ValueError("the cohort names are not a list of strings")
    if contexts is not None and not isinstance(contexts, dict):
        raise ValueError("the signal contexts are not a map")
    pos = 4 + h
    shape = _shape(bytes(body[pos : pos + len(COLUMNS)]))
    pos += len(COLUMNS)
    kinds, widths, nbase = shape
    bases = list(struct.unpack_from(f"<{nbase}q", body, pos)) if nbase else []
    pos += 8 * nbase
    cols = []
    for kind, width in zip(kinds, widths):
        end = pos + n * width
        cols.append((kind, width, bases.pop(0) if kind != _PLAIN else 0, body[pos:end]))
        pos = end
    if pos != len(body):
        raise ValueError(f"the columns take {pos} bytes of a body of {len(body)}")
    return Parsed(n, names, contexts, cols)


_SHAPES: dict[bytes, tuple[tuple[int, ...], tuple[int, ...], int]] = {}


def _shape(descs: bytes) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(transforms, widths, number of bases)`` of the columns' descriptor bytes.

    Raises:
        ValueError: a transform or width a column cannot have.
    """
    got = _SHAPES.get(descs)
    if got is not None:
        return got
    if len(descs) != len(COLUMNS):
        raise ValueError("the column descriptors are cut short")
    kinds = tuple(d >> 4 for d in descs)
    widths = tuple(d & 0x0F for d in descs)
    for name, kind, width in zip(COLUMNS, kinds, widths):
        if width and width not in _UDT:
            raise ValueError(f"column {name}: width {width}")
        if kind != _PLAIN and kind not in _DELTAS[name]:
            raise ValueError(f"column {name}: transform {kind}")
        if kind == _PLAIN and width > _OUT[name].itemsize:
            raise ValueError(f"column {name}: width {width}")
    got = (kinds, widths, sum(k != _PLAIN for k in kinds))
    if len(_SHAPES) < 4096:
        _SHAPES[descs] = got
    return got


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_hashable(k): v for k, v in pairs}


def decode_columns(parsed: list[Parsed]) -> dict[str, np.ndarray]:
    """The columns of the batches ``parsed``, joined in their order: ``COLUMNS`` by
    name, ``ci`` indexes into each batch's own names (u8 when every batch has fewer
    than 256 names, else u32), the others in the types `encode_v2` takes. Done per
    (column, transform, width) over all batches at once, so the cost per batch is a
    few Python steps, not numpy calls; a plain column stored at its full width is
    a read-only view of the joined bytes, as a version 1 batch's columns are.
    """
    ns = np.array([p.n for p in parsed], dtype=np.int64)
    starts = np.zeros(len(parsed), dtype=np.int64)
    np.cumsum(ns[:-1], out=starts[1:])
    total = int(ns.sum())
    wide_ci = any(len(p.names) >= 256 for p in parsed)
    out: dict[str, np.ndarray] = {}
    for j, name in enumerate(COLUMNS):
        target = _TARGET[name] if name != "ci" or wide_ci else np.dtype(np.uint8)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(parsed):
            kind, width = p.cols[j][:2]
            groups.setdefault((kind, width), []).append(i)
        res: np.ndarray | None = None
        for (kind, width), idx in groups.items():
            seg = ns[idx]
            items = _group(parsed, j, kind, width, idx, seg, target, starts, out)
            if len(groups) == 1:
                res = items
            else:
                if res is None:
                    res = np.empty(total, dtype=target)
                pos = np.repeat(starts[idx] - np.r_[0, np.cumsum(seg)[:-1]], seg)
                res[pos + np.arange(len(items))] = items
        if res is None:
            res = np.zeros(total, dtype=target)
        out[name] = res.view(_OUT[name]) if name in ("w", "r", "u", "e", "t", "ts") else res
    return out


def _group(
    parsed: list[Parsed],
    j: int,
    kind: int,
    width: int,
    idx: list[int],
    seg: np.ndarray,
    target: np.dtype[Any],
    starts: np.ndarray,
    out: dict[str, np.ndarray],
) -> np.ndarray:
    """Column ``j`` of the batches ``idx`` (all of one transform and width), joined,
    as ``target``."""
    count = int(seg.sum())
    if kind == _PLAIN:
        if not width:
            return np.zeros(count, dtype=target)
        if width > target.itemsize:
            raise ValueError(f"column {COLUMNS[j]}: width {width} for {target} values")
        raw = b"".join([parsed[i].cols[j][3] for i in idx])
        if width == target.itemsize:
            return np.frombuffer(raw, dtype=target)
        return np.frombuffer(raw, dtype=_UDT[width]).astype(target)
    if width:
        d = np.frombuffer(b"".join([parsed[i].cols[j][3] for i in idx]), dtype=_SDT[width])
        v = np.cumsum(d, dtype=np.int64) if kind == _DELTA else d.astype(np.int64)
    else:
        v = np.zeros(count, dtype=np.int64)
    bases = [parsed[i].cols[j][2] for i in idx]
    if kind == _DELTA:
        if len(idx) == 1:
            v += bases[0]
        elif count:
            first = np.zeros(len(idx), dtype=np.int64)
            np.cumsum(seg[:-1], out=first[1:])
            before = np.zeros(len(idx), dtype=np.int64)
            inner = first > 0
            before[inner] = v[first[inner] - 1]
            v += np.repeat(np.array(bases, dtype=np.int64) - before, seg)
        return v
    # transform 2 (r only): the cumulative sums restart at each batch and each shard
    m, at = out["m"], 0
    for i, k, base in zip(idx, seg.tolist(), bases):
        ms, part = m[starts[i] : starts[i] + k], v[at : at + k]
        for shard in np.unique(ms).tolist():
            sel = np.flatnonzero(ms == shard)
            part[sel] = np.cumsum(part[sel])
        part += base
        at += k
    return v


def decode_v2(
    payload: bytes | memoryview,
) -> tuple[list[str], dict[int, Any] | None, dict[str, np.ndarray]]:
    """``(cohort names, contexts or None, columns)`` of one version 2 payload; the
    columns by name (``COLUMNS``) as numpy arrays (``ci`` u8, or u32 from 256 names;
    the others in the types `encode_v2` takes).

    Raises:
        ValueError: the payload does not decode (see `parse_v2`), or a cohort index
            is past the names.
    """
    p = parse_v2(payload)
    cols = decode_columns([p])
    ci = cols["ci"]
    if p.n and int(ci.max()) >= len(p.names):
        raise ValueError(f"a cohort index past the batch's {len(p.names)} cohort names")
    cols["ci"] = ci.astype(np.uint8 if len(p.names) < 256 else np.uint32)
    return p.names, p.contexts, cols
