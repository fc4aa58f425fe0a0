"""History batches: the contribution records a ledger shard persists, as columns.

One batch is stored under ``batch_key(ledger shard, seq)`` (history keyspace), its
value ``seal(key, payload)`` (`keys.seal`), the payload a msgpack map of columns in
this order (little-endian arrays, one item per record)::

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

Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgpack
import numpy as np

from tidal_actors._errors import StorageError
from tidal_actors.storage.format.keys import Keyspace, Op, batch_key, seal, undecodable, unseal

__all__ = [
    "HistoryBatch",
    "batch_op",
    "decode_batch",
    "decode_context",
    "encode_history_columns",
    "rewrite_batch_op",
    "user_bytes",
]

HistoryColumns = Sequence[Any]
"""``(m, r, u, cohort, e, t, w, ts)``: sequences or numpy arrays of one length
(``m`` may be one int for every record)."""


def encode_history_columns(cols: HistoryColumns, contexts: dict[int, Any] | None) -> bytes:
    """One history batch's payload (see the module doc) from record columns
    ``(m, r, u, cohort, e, t, w, ts)``; ``contexts``: record index -> context bytes."""
    ms, rs, us, cs, es, ts_, ws, tss = cols
    names = sorted(set(cs))
    pos = {c: i for i, c in enumerate(names)}
    ci = np.fromiter(map(pos.__getitem__, cs), dtype="<u1" if len(names) < 256 else "<u4")
    payload: dict[str, Any] = {
        "c": names,
        "ci": ci.tobytes(),
        "m": bytes([ms]) * len(cs) if isinstance(ms, int) else np.asarray(ms, "<u1").tobytes(),
        "r": np.asarray(rs, dtype="<i8").tobytes(),
        "u": np.asarray(us, dtype="<u8").tobytes(),
        "e": np.asarray(es, dtype="<u8").tobytes(),
        "t": np.asarray(ts_, dtype="<u8").tobytes(),
        "w": np.asarray(ws, dtype="<f4").tobytes(),
        "ts": np.asarray(tss, dtype="<i8").tobytes(),
    }
    if contexts:
        payload["x"] = contexts
    return cast(bytes, msgpack.packb(payload))


def user_bytes(user: int) -> bytes:
    """The 8 bytes the ``u`` column holds for ``user`` (u64 LE): a stored batch whose
    value does not contain them holds no record of that user."""
    return user.to_bytes(8, "little")


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


def rewrite_batch_op(key: bytes, b: HistoryBatch, keep: np.ndarray) -> Op:
    """The write replacing batch ``b`` (stored at ``key``) by its records at positions
    ``keep`` (a delete when none is kept); contexts follow their records."""
    if not len(keep):
        return (Keyspace.HISTORY.value, key, None)
    names = b.cohorts
    cols = (
        b.m[keep],
        b.r[keep],
        b.u[keep],
        list(map(names.__getitem__, b.ci[keep].tolist())),
        b.e[keep],
        b.t[keep],
        b.w[keep],
        b.ts[keep],
    )
    ctx = None
    if b.contexts:
        ctx = {
            new: b.contexts[old] for new, old in enumerate(keep.tolist()) if old in b.contexts
        } or None
    return (Keyspace.HISTORY.value, key, seal(key, encode_history_columns(cols, ctx)))


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
    """A history batch's columns from its stored (sealed) value.

    ``key`` (default: the key of ``shard`` and ``seq``) names the batch in errors.

    Raises:
        StorageError: the value is corrupt (its CRC-32, its msgpack, or columns whose
            lengths disagree), naming the keyspace and the key in hex.
    """
    if key is None:
        key = batch_key(shard, seq)
    try:
        return _decode_batch(shard, seq, unseal(raw, Keyspace.HISTORY.value, key))
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a corrupt value makes msgpack or numpy raise
        raise undecodable(Keyspace.HISTORY, key, exc) from exc


def _decode_batch(shard: int, seq: int, raw: bytes | memoryview) -> HistoryBatch:
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
