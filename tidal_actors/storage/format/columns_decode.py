"""The decoder of the columnar history batch (versions 3 and 2): `read_index` reads a
version 3 payload's index without decompressing it, `parse_columnar` a payload as
far as its columns' descriptors, `decode_columns` decodes many at once (all their
columns or some), `decode_columnar` one (the layout: `columns`). Must not do I/O."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import lz4.block
import msgpack
import numpy as np

from tidal_actors.storage.format.columns import (
    CODEC_LZ4,
    CODEC_LZ4_COMPACTED,
    CODEC_NONE,
    CODEC_NONE_COMPACTED,
    COLUMNS,
    DELTA,
    DELTAS,
    HEAD,
    INDEX_FIXED,
    INDEX_LEN,
    OUT,
    PLAIN,
    SDT,
    TARGET,
    U32,
    UDT,
    VERSION,
    VERSION_2,
)

__all__ = [
    "Index",
    "Parsed",
    "decode_columnar",
    "decode_columns",
    "parse_columnar",
    "read_index",
]


_INDEX_HEAD = struct.Struct("<I" + INDEX_FIXED.format.lstrip("<"))  # x, ts, kind, f
_FILTER_AT = HEAD.size + _INDEX_HEAD.size  # where the user filter begins


class Index:
    """A version 3 payload's index (`read_index`), read without decompressing.

    ``ts_min``: the least timestamp (ns; ``2**63 - 1`` when the batch holds no
    record); ``user_kind``, ``users``: the filter of its user ids (`user_filter`);
    ``names``: the cohort names (sorted), unpacked when first asked for; ``start``:
    where the body begins in the payload."""

    __slots__ = ("_names", "_raw", "start", "ts_min", "user_kind", "users")

    def __init__(
        self, ts_min: int, user_kind: int, users: memoryview, raw_names: memoryview, start: int
    ) -> None:
        self.ts_min = ts_min
        self.user_kind = user_kind
        self.users = users
        self.start = start
        self._raw = raw_names
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """The cohort names (sorted).

        Raises:
            ValueError: they do not unpack to a list of strings.
        """
        if self._names is None:
            names = msgpack.unpackb(self._raw)
            if not (isinstance(names, list) and all(isinstance(c, str) for c in names)):
                raise ValueError("the cohort names are not a list of strings")
            self._names = names
        return self._names


def read_index(payload: bytes | memoryview) -> Index | None:
    """The index of a columnar payload: None for version 2 (which has none).

    Raises:
        ValueError: an unknown version, or an index cut short.
    """
    version = payload[0] if len(payload) else None
    if version == VERSION_2:
        return None
    if version != VERSION or len(payload) < _FILTER_AT:
        raise ValueError(f"not a columnar history batch (version byte {version})")
    x, ts_min, kind, f = _INDEX_HEAD.unpack_from(payload, HEAD.size)
    start = HEAD.size + INDEX_LEN.size + x
    at = _FILTER_AT + f
    if start > len(payload) or at > start:
        raise ValueError(f"an index of {x} bytes, a user filter of {f}, past their ends")
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    return Index(ts_min, kind, view[_FILTER_AT:at], view[at:start], start)


@dataclass
class Parsed:
    """A columnar payload read as far as its columns' descriptors (`parse_columnar`):
    per column ``(transform, width, base, items)`` (``items`` a memoryview of the body)."""

    n: int
    names: list[str]
    contexts: dict[int, Any] | None
    cols: list[tuple[int, int, int, memoryview]]


def parse_columnar(payload: bytes | memoryview, index: Index | None = None) -> Parsed:
    """Decompress a columnar payload (version 3 or 2) and read its header and column
    descriptors; ``index``: its `read_index`, when read already.

    Raises:
        ValueError: an unknown version, codec, transform or width, or lengths that do
            not add up.
    """
    version, codec, n, size = HEAD.unpack_from(payload)
    if version == VERSION and index is None:
        index = read_index(payload)
    elif version != VERSION_2 and version != VERSION:
        raise ValueError(f"not a columnar history batch (version byte {version})")
    rest = memoryview(payload)[HEAD.size if index is None else index.start :]
    if codec in (CODEC_LZ4, CODEC_LZ4_COMPACTED):
        body = memoryview(lz4.block.decompress(rest, uncompressed_size=size))
    elif codec == CODEC_NONE or (codec == CODEC_NONE_COMPACTED and index is not None):
        body = rest
    else:
        raise ValueError(f"unknown history batch codec {codec}")
    if len(body) != size:
        raise ValueError(f"the body is {len(body)} bytes, its header says {size}")
    (h,) = U32.unpack_from(body)
    try:
        head = msgpack.unpackb(body[4 : 4 + h], strict_map_key=False)
    except TypeError:  # a context mapping with a tuple key (an array in msgpack)
        head = msgpack.unpackb(body[4 : 4 + h], strict_map_key=False, object_pairs_hook=_pairs)
    if index is None:
        names, contexts = head
    else:
        names, contexts = index.names, head
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
        cols.append((kind, width, bases.pop(0) if kind != PLAIN else 0, body[pos:end]))
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
        if width and width not in UDT:
            raise ValueError(f"column {name}: width {width}")
        if kind != PLAIN and kind not in DELTAS[name]:
            raise ValueError(f"column {name}: transform {kind}")
        if kind == PLAIN and width > OUT[name].itemsize:
            raise ValueError(f"column {name}: width {width}")
    got = (kinds, widths, sum(k != PLAIN for k in kinds))
    if len(_SHAPES) < 4096:
        _SHAPES[descs] = got
    return got


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_hashable(k): v for k, v in pairs}


def decode_columns(parsed: list[Parsed], names: tuple[str, ...] = COLUMNS) -> dict[str, np.ndarray]:
    """The columns ``names`` (of ``COLUMNS``; ``r`` brings ``m``, which its transform
    2 needs) of the batches ``parsed``, joined in their order, by name: ``ci``
    indexes into each batch's own names (u8 when every batch has fewer than 256
    names, else u32), the others in the types `encode_columnar` takes. Done per
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
    wanted = set(names) | ({"m"} if "r" in names else set())
    for j, name in enumerate(COLUMNS):
        if name not in wanted:
            continue
        target = TARGET[name] if name != "ci" or wide_ci else np.dtype(np.uint8)
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
        out[name] = res.view(OUT[name]) if name in ("w", "r", "u", "e", "t", "ts") else res
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
    if kind == PLAIN:
        if not width:
            return np.zeros(count, dtype=target)
        if width > target.itemsize:
            raise ValueError(f"column {COLUMNS[j]}: width {width} for {target} values")
        raw = b"".join([parsed[i].cols[j][3] for i in idx])
        if width == target.itemsize:
            return np.frombuffer(raw, dtype=target)
        return np.frombuffer(raw, dtype=UDT[width]).astype(target)
    if width:
        d = np.frombuffer(b"".join([parsed[i].cols[j][3] for i in idx]), dtype=SDT[width])
        v = np.cumsum(d, dtype=np.int64) if kind == DELTA else d.astype(np.int64)
    else:
        v = np.zeros(count, dtype=np.int64)
    bases = [parsed[i].cols[j][2] for i in idx]
    if kind == DELTA:
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


def decode_columnar(
    payload: bytes | memoryview,
) -> tuple[list[str], dict[int, Any] | None, dict[str, np.ndarray]]:
    """``(cohort names, contexts or None, columns)`` of one columnar payload; the
    columns by name (``COLUMNS``) as numpy arrays (``ci`` u8, or u32 from 256 names;
    the others in the types `encode_columnar` takes).

    Raises:
        ValueError: the payload does not decode (see `parse_columnar`), or a cohort index
            is past the names.
    """
    p = parse_columnar(payload)
    cols = decode_columns([p])
    ci = cols["ci"]
    if p.n and int(ci.max()) >= len(p.names):
        raise ValueError(f"a cohort index past the batch's {len(p.names)} cohort names")
    cols["ci"] = ci.astype(np.uint8 if len(p.names) < 256 else np.uint32)
    return p.names, p.contexts, cols
