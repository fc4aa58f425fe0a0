"""Rewrites of the durable history that take records out: a purge's erasure
(`erase_history_ops`) and retention by age (`retention_ops`).

Both run for the persistence actor (retention on its thread, where every group
commit waits behind it; an erasure, under the pykka host, on a thread of its own,
`actors.erasure`), so each reads first the index of a version 3 batch (`format.batch_index`:
its cohort names, its least timestamp and a filter of its user ids, read without
decompressing) and decodes only the batches that can hold a record it drops:

* an erasure skips a batch without the purged cohort or whose user filter holds no
  covered user (`format.user_filter`: a Bloom filter may let through a batch that
  holds none, never leave out one that holds one), decodes the others' ``ci``,
  ``u`` and ``r`` (and ``m``, which ``r``'s transform may need), and decodes in full
  only the ones it rewrites;
* a retention pass skips a batch whose least timestamp is at or past the cutoff
  (exact: every other batch holds a record it drops).

A version 1 or 2 batch has no index: it is decoded. A rewrite of a block written at
compaction's settings is written at those settings again (`format.rewrite_level`),
so that the next ``compact()`` leaves it as it is unless it merges it with the
batches next to it; a rewrite of a batch as a ledger wrote it stays at a write's
settings (``compact()`` merges it anyway).

No threads, no I/O: the caller reads the history and commits the ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from tidal_actors.core import sets
from tidal_actors.storage.format import (
    HistoryBatch,
    Index,
    Op,
    batch_index,
    batch_key_shard_seq,
    decode_batches,
    rewrite_batch_op,
    rewrite_level,
)
from tidal_actors.storage.format.user_filter import UserProbe

__all__ = ["DECODE_CHUNK", "erase_history_ops", "retention_ops"]

DECODE_CHUNK = 256  # history batches decoded together by a rewrite
_ERASE_COLUMNS = ("ci", "u", "r")  # what an erasure's decision reads

_Item = tuple[int, int, bytes, bytes | None]


def _candidates(
    batches: Iterable[tuple[bytes, bytes]], may_hold: Callable[[Index], bool]
) -> Iterable[list[_Item]]:
    """Chunks of up to ``DECODE_CHUNK`` items ``(shard, seq, value, key)`` of the
    stored ``batches`` whose index ``may_hold`` passes, or that have no index."""
    chunk: list[_Item] = []
    for key, raw in batches:
        index = batch_index(raw, key)
        if index is not None and not may_hold(index):
            continue
        shard, seq = batch_key_shard_seq(key)
        chunk.append((shard, seq, bytes(raw), key))
        if len(chunk) >= DECODE_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _rewrite(item: _Item, b: HistoryBatch, drop: np.ndarray) -> Op:
    _, _, raw, key = item
    assert key is not None
    return rewrite_batch_op(key, b, np.flatnonzero(~drop), rewrite_level(raw, key))


def erase_history_ops(
    batches: Iterable[tuple[bytes, bytes]], cohort: str, covered: dict[int, int]
) -> tuple[list[Op], int]:
    """Ops rewriting history batches without ``cohort``'s records covered by a purge
    (module doc: which batches are decoded).

    Args:
        batches: ``(key, stored value)`` of every history batch.
        cohort: the purged cohort.
        covered: user id -> rseq bound (records of that user with a lower rseq go).

    Returns the ops and the number of records erased.

    Raises:
        StorageError: a batch (or its index) does not decode.
    """
    ops: list[Op] = []
    erased = 0
    if not covered:
        return ops, erased
    probe = UserProbe(covered)
    users = probe.users
    bounds = np.array([covered[u] for u in users.tolist()], dtype=np.int64)

    def may_hold(index: Index) -> bool:
        # the filter first: it needs no unpacking, and most batches stop there
        return probe.may_hold(index.user_kind, index.users) and cohort in index.names

    for chunk in _candidates(batches, may_hold):
        for item, b in zip(chunk, decode_batches(chunk, _ERASE_COLUMNS)):
            if cohort not in b.cohorts:
                continue
            mask = (b.ci == b.cohorts.index(cohort)) & sets.isin(b.u, users)
            if not mask.any():
                continue
            rows = np.flatnonzero(mask)
            below = b.r[rows] < bounds[np.searchsorted(users, b.u[rows])]
            if not below.any():
                continue
            drop = np.zeros(len(b.u), dtype=bool)
            drop[rows[below]] = True
            erased += int(below.sum())
            ops.append(_rewrite(item, decode_batches([item])[0], drop))
    return ops, erased


def retention_ops(batches: Iterable[tuple[bytes, bytes]], cutoff_ns: int) -> list[Op]:
    """Ops dropping history records stamped before ``cutoff_ns`` (nanoseconds;
    retention by age). Aggregates keep them; only the durable history (what
    re-materialization reads) forgets them.

    Raises:
        StorageError: a batch (or its index) does not decode.
    """
    ops: list[Op] = []

    def may_hold(index: Index) -> bool:
        return index.ts_min < cutoff_ns

    for chunk in _candidates(batches, may_hold):
        for item, b in zip(chunk, decode_batches(chunk)):
            old = b.ts < cutoff_ns
            if old.any():
                ops.append(_rewrite(item, b, old))
    return ops
