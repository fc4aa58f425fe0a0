"""History batches: the contribution records a ledger shard persists, as columns.

One batch is stored under ``batch_key(ledger shard, seq)`` (history keyspace), its
value ``seal(key, payload)`` (`keys.seal`). The payload's first byte says its
encoding:

* ``0x03``: version 3, columnar and compressed behind an index of the cohort names,
  the least timestamp and a filter of the user ids (`columns`): what is written.
* ``0x02``: version 2, the same without the index: read only (stores written
  before version 3; ``compact()`` rewrites them).
* a msgpack map (``0x80``-``0x8F``, ``0xDE``, ``0xDF``): version 1, read only (stores
  written before version 2; ``compact()`` rewrites them). The map's entries, in this
  order (little-endian arrays, one item per record)::

    "c"   array of str   the batch's cohort names, sorted
    "ci"  bytes          u8 index into "c" per record (u32 when the batch has 256+ names)
    "m"   bytes          u8  membership shard
    "r"   bytes          i64 rseq (record sequence within its membership shard)
    "u"   bytes          u64 user id
    "e"   bytes          u64 entity id
    "t"   bytes          u64 signal type
    "w"   bytes          f32 weight
    "ts"  bytes          i64 timestamp (nanoseconds)
    "x"   map, optional  record index -> its signal context's msgpack bytes (a bin;
                         stores written before contexts were packed at the call hold
                         the mapping itself)

Any other first byte is a `StorageError` naming the key (a store written by a
later version of tidal_actors: open it with that version). Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgpack
import numpy as np

from tidal_actors._errors import StorageError
from tidal_actors.storage.format.columns import (
    CODEC_LZ4_COMPACTED,
    CODEC_NONE_COMPACTED,
    COLUMNS,
    LEVEL_COMPACT,
    LEVEL_WRITE,
    OUT,
    VERSION,
    is_columnar,
)
from tidal_actors.storage.format.columns_decode import (
    Index,
    Parsed,
    decode_columns,
    parse_columnar,
    read_index,
)
from tidal_actors.storage.format.columns_encode import encode_columnar
from tidal_actors.storage.format.keys import Keyspace, Op, batch_key, seal, undecodable, unseal

__all__ = [
    "HistoryBatch",
    "Index",
    "batch_index",
    "batch_op",
    "decode_batch",
    "decode_batches",
    "decode_context",
    "encode_history_columns",
    "merged_payload",
    "rewrite_batch_op",
    "rewrite_level",
    "written_compacted",
]

HistoryColumns = Sequence[Any]
"""``(m, r, u, cohort, e, t, w, ts)``: sequences or numpy arrays of one length
(``m`` may be one int for every record)."""


def encode_history_columns(
    cols: HistoryColumns,
    contexts: dict[int, Any] | None,
    level: int = LEVEL_WRITE,
    version: int = VERSION,
) -> bytes:
    """One history batch's payload, version 3 (`columns`), from record columns
    ``(m, r, u, cohort, e, t, w, ts)``; ``contexts``: record index -> context bytes;
    ``level``: 0 for a write, 1 for ``compact()``'s rewrites; ``version``: 3, or 2
    for tests and benchmarks (`columns_encode.encode_columnar`)."""
    ms, rs, us, cs, es, ts_, ws, tss = cols
    names = sorted(set(cs))
    pos = {c: i for i, c in enumerate(names)}
    ci = np.fromiter(map(pos.__getitem__, cs), dtype=np.int64, count=len(cs))
    return encode_columnar(
        names,
        ci,
        {"m": ms, "r": rs, "u": us, "e": es, "t": ts_, "w": ws, "ts": tss},
        contexts,
        level,
        one_shard=isinstance(ms, int),
        version=version,
    )


def batch_op(shard: int, seq: int, cols: HistoryColumns, contexts: dict[int, Any] | None) -> Op:
    """The write of ledger ``shard``'s history batch ``seq`` (sealed with its key)."""
    key = batch_key(shard, seq)
    return (Keyspace.HISTORY.value, key, seal(key, encode_history_columns(cols, contexts)))


@dataclass
class HistoryBatch:
    """One durable batch of contribution records, as columns (numpy arrays of one
    length; ``ci`` indexes ``cohorts``)."""

    shard: int
    seq: int
    cohorts: list[str]
    ci: np.ndarray
    m: np.ndarray
    r: np.ndarray
    u: np.ndarray
    e: np.ndarray
    t: np.ndarray
    w: np.ndarray
    ts: np.ndarray
    # record index -> its signal context's msgpack bytes (`decode_context` reads one)
    contexts: dict[int, Any] | None = None


def rewrite_batch_op(key: bytes, b: HistoryBatch, keep: np.ndarray, level: int = LEVEL_WRITE) -> Op:
    """The write replacing batch ``b`` (stored at ``key``) by its records at positions
    ``keep`` (a delete when none is kept); contexts follow their records."""
    if not len(keep):
        return (Keyspace.HISTORY.value, key, None)
    return (Keyspace.HISTORY.value, key, seal(key, merged_payload([(b, keep)], level)))


def merged_payload(
    parts: Sequence[tuple[HistoryBatch, np.ndarray | None]], level: int = LEVEL_WRITE
) -> bytes:
    """One version 3 payload holding, in order, the records of each ``(batch, keep)``
    of ``parts`` at positions ``keep`` (None: all of them); contexts follow their
    records, cohort names are the union of the ones kept."""
    used = sorted({c for b, keep in parts for c in _names_used(b, keep)})
    at = {c: i for i, c in enumerate(used)}
    cols: dict[str, list[np.ndarray]] = {c: [] for c in COLUMNS}
    contexts: dict[int, Any] = {}
    n = 0
    for b, keep in parts:
        sel = slice(None) if keep is None else keep
        lut = np.array([at.get(c, 0) for c in b.cohorts], dtype=np.int64)
        cols["ci"].append(lut[b.ci[sel]])
        for c in ("m", "r", "u", "e", "t", "w", "ts"):
            cols[c].append(getattr(b, c)[sel])
        if b.contexts:
            old = range(len(b.r)) if keep is None else keep.tolist()
            contexts.update(
                {n + new: b.contexts[o] for new, o in enumerate(old) if o in b.contexts}
            )
        n += len(cols["r"][-1])
    joined = {c: np.concatenate(v) if v else np.zeros(0) for c, v in cols.items()}
    ci = joined.pop("ci")
    return encode_columnar(used, ci, joined, contexts or None, level)


def _names_used(b: HistoryBatch, keep: np.ndarray | None) -> list[str]:
    ci = b.ci if keep is None else b.ci[keep]
    return [b.cohorts[i] for i in np.unique(ci).tolist()]


def decode_context(raw: Any) -> Any:
    """A stored signal context as the mapping it was: msgpack bytes (a context is
    packed at the call), or the mapping itself in stores written before that. A
    tuple key comes back as a tuple (msgpack stores it as an array)."""
    if not isinstance(raw, bytes):
        return raw
    return msgpack.unpackb(raw, strict_map_key=False, object_pairs_hook=_pairs, use_list=True)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_hashable(k): v for k, v in pairs}


def decode_batch(shard: int, seq: int, raw: bytes, key: bytes | None = None) -> HistoryBatch:
    """A history batch's columns from its stored (sealed) value, either version.

    ``key`` (default: the key of ``shard`` and ``seq``) names the batch in errors.

    Raises:
        StorageError: the value is corrupt (its CRC-32, its encoding, or columns whose
            lengths disagree) or of an unknown version, naming the keyspace and the
            key in hex.
    """
    return decode_batches([(shard, seq, raw, key)])[0]


def decode_batches(
    items: Sequence[tuple[int, int, bytes, bytes | None]], columns: tuple[str, ...] = COLUMNS
) -> list[HistoryBatch]:
    """The batches of ``items`` (``(ledger shard, seq, stored value, key or None)``),
    decoded, in order. The columnar ones are decoded together
    (`columns_decode.decode_columns`), so a batch costs a few Python steps: the
    columns of the batches returned are views into arrays shared between them.
    ``columns``: the columns wanted (``ci`` always, ``m`` with ``r``); in a columnar
    batch the others are left empty (zero items).

    Raises:
        StorageError: as `decode_batch`, for the first batch that does not decode.
    """
    out: list[HistoryBatch | None] = [None] * len(items)
    columnar: list[tuple[int, Parsed]] = []
    for i, (shard, seq, raw, key) in enumerate(items):
        k = batch_key(shard, seq) if key is None else key
        try:
            payload = unseal(raw, Keyspace.HISTORY.value, k)
            if is_columnar(payload):
                columnar.append((i, parse_columnar(payload)))
            elif payload and (0x80 <= payload[0] <= 0x8F or payload[0] in (0xDE, 0xDF)):
                out[i] = _decode_v1(shard, seq, payload)
            else:
                raise StorageError(
                    f"cannot decode history key {bytes(k).hex()}: history batch encoding "
                    f"version {payload[0] if payload else 'missing'} is unknown to this "
                    "version of tidal_actors (a store written by a later version: open it "
                    "with that version)"
                )
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a corrupt value makes msgpack, zstd or numpy raise
            raise undecodable(Keyspace.HISTORY, k, exc) from exc
    if columnar:
        _split_columnar(items, columnar, out, columns)
    return cast(list[HistoryBatch], out)


_EMPTY = {c: np.zeros(0, dtype=d) for c, d in OUT.items()}


def _split_columnar(
    items: Sequence[tuple[int, int, bytes, bytes | None]],
    columnar: list[tuple[int, Parsed]],
    out: list[HistoryBatch | None],
    columns: tuple[str, ...],
) -> None:
    """Decode the columnar batches ``columnar`` (index into ``items``, parsed) together
    and put each one's views into ``out`` (the columns not in ``columns`` empty)."""
    cols = decode_columns([p for _, p in columnar], tuple({"ci", *columns}))
    ns = np.array([p.n for _, p in columnar], dtype=np.int64)
    full = np.flatnonzero(ns).tolist()
    if full:  # every cohort index within its batch's names: one reduction for all
        tops = np.maximum.reduceat(cols["ci"], (np.cumsum(ns) - ns)[full])
        bad = np.flatnonzero(tops >= np.array([len(columnar[k][1].names) for k in full]))
        if len(bad):
            shard, seq, _, key = items[columnar[full[int(bad[0])]][0]]
            exc = ValueError("a cohort index past the batch's cohort names")
            raise undecodable(Keyspace.HISTORY, key or batch_key(shard, seq), exc)
    at = 0
    for i, p in columnar:
        sl = slice(at, at + p.n)
        at += p.n
        ci = cols["ci"][sl]
        got = {c: cols[c][sl] if c in cols else _EMPTY[c] for c in ("m", "r", "u", "e", "t", "w")}
        out[i] = HistoryBatch(
            items[i][0],
            items[i][1],
            p.names,
            ci if ci.dtype == np.uint8 or len(p.names) >= 256 else ci.astype(np.uint8),
            **got,
            ts=cols["ts"][sl] if "ts" in cols else _EMPTY["ts"],
            contexts=p.contexts,
        )


_HISTORY = Keyspace.HISTORY.value


def batch_index(raw: bytes, key: bytes) -> Index | None:
    """The index of the stored (sealed) history batch ``raw`` at ``key``, read without
    decompressing it (`columns`: its cohort names, least timestamp, user filter);
    None for a batch of version 1 or 2, which has none (decode it to know).

    Raises:
        StorageError: the value is corrupt (its CRC-32, or an index that does not
            read), naming the key.
    """
    payload = unseal(raw, _HISTORY, key)
    if not payload or payload[0] != VERSION:
        return None
    try:
        return read_index(payload)
    except Exception as exc:  # noqa: BLE001 - whatever a corrupt index makes msgpack raise
        raise undecodable(Keyspace.HISTORY, key, exc) from exc


def written_compacted(raw: bytes, key: bytes) -> bool:
    """Whether the stored (sealed) history batch ``raw`` at ``key`` is of version 3
    and was written at compaction's settings (codec 2 or 3: `columns`).

    Raises:
        StorageError: its CRC-32 does not match.
    """
    payload = unseal(raw, Keyspace.HISTORY.value, key)
    return (
        len(payload) > 1
        and payload[0] == VERSION
        and payload[1] in (CODEC_LZ4_COMPACTED, CODEC_NONE_COMPACTED)
    )


def rewrite_level(raw: bytes, key: bytes) -> int:
    """The level at which a rewrite of the stored batch ``raw`` at ``key`` (an
    erasure, a retention pass) encodes it: ``LEVEL_COMPACT`` for a block written at
    compaction's settings, so that it stays one (`written_compacted`), else
    ``LEVEL_WRITE``."""
    return LEVEL_COMPACT if written_compacted(raw, key) else LEVEL_WRITE


def _decode_v1(shard: int, seq: int, raw: bytes | memoryview) -> HistoryBatch:
    try:
        d = msgpack.unpackb(raw, strict_map_key=False)
    except TypeError:
        # a signal context with a tuple key (msgpack packs it as an array, which comes
        # back as an unhashable list): rebuild such keys as tuples, so that one stored
        # context can never make the store impossible to reopen
        d = msgpack.unpackb(raw, strict_map_key=False, object_pairs_hook=_pairs)
    n = len(d["r"]) // 8
    ci_raw = d["ci"]
    ci = np.frombuffer(ci_raw, dtype="<u1" if len(ci_raw) == n else "<u4")
    b = HistoryBatch(
        shard,
        seq,
        d["c"],
        ci,
        np.frombuffer(d["m"], dtype=np.uint8),
        np.frombuffer(d["r"], dtype="<i8"),
        np.frombuffer(d["u"], dtype="<u8"),
        np.frombuffer(d["e"], dtype="<u8"),
        np.frombuffer(d["t"], dtype="<u8"),
        np.frombuffer(d["w"], dtype="<f4"),
        np.frombuffer(d["ts"], dtype="<i8"),
        d.get("x"),
    )
    # a legacy (unsealed) value can be corrupt and still decode: check its shape
    if not (isinstance(b.cohorts, list) and all(isinstance(c, str) for c in b.cohorts)):
        raise ValueError("the cohort names are not a list of strings")
    if any(len(col) != n for col in (ci, b.m, b.u, b.e, b.t, b.w, b.ts)):
        raise ValueError(f"columns of unequal lengths for {n} records")
    if n and int(ci.max()) >= len(b.cohorts):
        raise ValueError(f"a cohort index past the batch's {len(b.cohorts)} cohort names")
    if b.contexts is not None and not isinstance(b.contexts, dict):
        raise ValueError("the signal contexts are not a map")
    return b
