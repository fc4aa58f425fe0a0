"""Re-materialization after purge, and erasure of purged records from the history.

Owns the two halves of the purge spec's hand-off (retroactive-purge "Summary":
"schedule deterministic re-materialization"):

* `RematJob` rebuilds one cohort's aggregates on its ledger shard from the shard's
  detail rows (every contribution ever attributed there, with its user and rseq),
  leaving out each purged pair's records that the purge covered (``rseq`` below the
  purging shard's record count when the purge was taken). It runs in chunks of
  ``CHUNK_ROWS`` rows, one message each, so other cohorts' signals interleave;
  signals to the cohort that arrive meanwhile are added live and folded into the
  rebuilt state before it is swapped in, so none is lost or counted twice. A rebuild
  equal to the live state (relative 1e-9) is not swapped in, so a reopen after it
  still reads bit-for-bit what was read before.
* `erase_history_ops` rewrites the durable history batches without those records.

No threads, no I/O: the ledger and persistence behaviours drive them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

from ._codec import Keyspace, Tag, encode_key, seal
from ._ledger import DEAD, Aggregates
from ._types import PurgeId, PurgeStatus

__all__ = ["CHUNK_ROWS", "RematJob", "decode_status", "encode_status", "erase_history_ops"]

CHUNK_ROWS = 100_000


class RematJob:
    """One re-materialization of ``cohort`` on a ledger shard's state.

    Args:
        state: the shard's ``LedgerState``.
        cohort: the cohort to rebuild.
        covered: user -> rseq bound; that user's records with a lower rseq are left out.
        config: for the half-lives and window width.
    """

    def __init__(self, state: Any, cohort: str, covered: dict[int, int], config: Any) -> None:
        self.state = state
        self.cohort = cohort
        self.covered = covered
        self.scratch = Aggregates(config.half_life_for, config.window_width_ns, config.window_buckets)
        self.key_ids: dict[tuple[int, int], int] = {}
        # covered users (sorted) and their bounds, for a vectorized lookup
        cu = sorted(covered)
        self._cu = np.array(cu, dtype=np.uint64) if cu else None
        self._cb = np.array([covered[u] for u in cu], dtype=np.int64)
        self.excluded_rows: list[int] = []
        self.read = 0
        self.cursor = 0
        self.cut = len(state.aggregates.dk)
        self.t0 = time.perf_counter()

    def _fold(self, lo: int, hi: int) -> None:
        agg: Aggregates = self.state.aggregates
        if hi <= lo:
            return
        cid = agg.cohort_id(self.cohort)
        if cid is None:
            return
        nk = agg.key_total
        is_c = np.zeros(nk + 1, dtype=bool)  # the cohort's key ids (from the KC column)
        is_c[:nk] = agg.KC[:nk] == cid
        dk = np.frombuffer(agg.dk, dtype=np.uint32)[lo:hi].astype(np.int64)
        dk[dk == DEAD] = nk  # retracted rows point at the False slot
        sel = np.flatnonzero(is_c[dk])
        if not len(sel):
            return
        rows = sel + lo
        k = dk[sel]
        users = np.frombuffer(agg.du, dtype=np.uint64)[rows]
        rseqs = np.frombuffer(agg.dr, dtype=np.int64)[rows]
        self.read += len(rows)
        if self._cu is not None:  # leave out the covered records: rseq below their user's bound
            at = np.minimum(np.searchsorted(self._cu, users), len(self._cu) - 1)
            out = (self._cu[at] == users) & (rseqs < self._cb[at])
            if out.any():
                self.excluded_rows.extend(rows[out].tolist())
                keep = ~out
                rows, k, users, rseqs = rows[keep], k[keep], users[keep], rseqs[keep]
        if not len(rows):
            return
        uk = np.unique(k)  # the rebuilt keys keep their live key ids
        for kk, e, t in zip(uk.tolist(), agg.KE[uk].tolist(), agg.KT[uk].tolist()):
            self.key_ids[(e, t)] = kk
        self.scratch.add_columns(
            np.frombuffer(agg.dm, dtype=np.uint8)[rows].tolist(), rseqs.tolist(), users.tolist(),
            [self.cohort] * len(rows), agg.KE[k].tolist(), agg.KT[k].tolist(),
            np.frombuffer(agg.dw, dtype=np.float32)[rows].tolist(),
            np.frombuffer(agg.dt, dtype=np.int64)[rows].tolist(),
        )

    def step(self) -> bool:
        """Fold the next chunk of the rows that existed at the start; True when all are."""
        hi = min(self.cursor + CHUNK_ROWS, self.cut)
        self._fold(self.cursor, hi)
        self.cursor = hi
        return self.cursor >= self.cut

    def finish(self) -> tuple[int, int, bool, dict[int, int]]:
        """Fold rows that arrived meanwhile, compare, swap in, erase the left-out rows.

        Returns ``(records_read, records_excluded, matched_live, excluded_per_user)``.
        """
        agg: Aggregates = self.state.aggregates
        self._fold(self.cut, len(agg.dk))
        matched = agg.same_cohort(self.cohort, self.scratch)
        if not matched:  # an equal rebuild is not swapped in: the live bits stay as they were
            agg.install_cohort(self.cohort, self.scratch, self.key_ids)
        per_user: dict[int, int] = {}
        for row in self.excluded_rows:
            per_user[agg.du[row]] = per_user.get(agg.du[row], 0) + 1
            agg.erase_row(row)
        log = self.state.log
        for user in per_user:
            log.drop_retracted(user, self.cohort)
        return self.read, len(self.excluded_rows), matched, per_user


def erase_history_ops(
    batches: Iterable[tuple[bytes, bytes]], cohort: str, covered: dict[int, int]
) -> tuple[list[tuple[str, bytes, bytes | None]], int]:
    """Ops rewriting history batches without ``cohort``'s records covered by a purge.

    Args:
        batches: ``(key, value)`` of every history batch.
        cohort: the purged cohort.
        covered: user -> rseq bound (records of that user with a lower rseq go).

    Returns the ops and the number of records erased.
    """
    from ._store import decode_batch

    ops: list[tuple[str, bytes, bytes | None]] = []
    erased = 0
    if not covered:
        return ops, erased
    users = np.array(sorted(covered), dtype=np.uint64)
    # a batch holding a covered user's record holds its id as 8 little-endian bytes
    # (the ``u`` column): a substring test skips the others without decoding them
    patterns = [int(u).to_bytes(8, "little") for u in users.tolist()]
    for key, raw in batches:
        if not any(p in raw for p in patterns):
            continue
        b = decode_batch(0, 0, raw, key)
        if cohort not in b.cohorts:
            continue
        ci = b.cohorts.index(cohort)
        mask = (b.ci == ci) & np.isin(b.u, users)
        if not mask.any():
            continue
        bounds = np.array([covered.get(int(u), -1) for u in b.u[mask]], dtype=np.int64)
        drop = np.zeros(len(b.r), dtype=bool)
        drop[np.nonzero(mask)[0][b.r[mask] < bounds]] = True
        n = int(drop.sum())
        if not n:
            continue
        erased += n
        ops.append(_rewrite(key, b, np.nonzero(~drop)[0]))
    return ops, erased


def _rewrite(key: bytes, b: Any, keep: np.ndarray) -> tuple[str, bytes, bytes | None]:
    """The op that replaces a history batch by its records at positions ``keep``
    (deletes it when none is kept); contexts follow their records."""
    from ._contrib_log import encode_history_columns

    if not len(keep):
        return (Keyspace.HISTORY.value, key, None)
    names = b.cohorts
    cols = (
        b.m[keep].tolist(), b.r[keep].tolist(), b.u[keep].tolist(),
        list(map(names.__getitem__, b.ci[keep].tolist())), b.e[keep].tolist(), b.t[keep].tolist(),
        b.w[keep].tolist(), b.ts[keep].tolist(),
    )
    ctx = None
    if b.contexts:
        ctx = {new: b.contexts[old] for new, old in enumerate(keep.tolist()) if old in b.contexts} or None
    return (Keyspace.HISTORY.value, key, seal(key, encode_history_columns(cols, ctx)))


def encode_status(s: PurgeStatus, bound: int) -> tuple[bytes, bytes]:
    """Key and value of a purge status record (items keyspace, Tag.PURGE_STATUS)."""
    key = encode_key(s.user_id, Tag.PURGE_STATUS, s.purge_id.to_bytes16())
    value = msgpack.packb(
        [s.purge_id.to_bytes16(), s.user_id, s.cohort, s.retracted_live, s.rematerialized,
         s.rematerialized_at_ns, s.excluded_by_rematerialization, bound]
    )
    return key, value


def decode_status(raw: bytes) -> tuple[PurgeStatus, int]:
    """Inverse of :func:`encode_status`: the status and the purge's rseq bound."""
    pid, user, cohort, live, done, at, excluded, bound = msgpack.unpackb(raw)
    return PurgeStatus(PurgeId.from_bytes16(pid), user, cohort, live, done, at, excluded), bound


def retention_ops(batches: Iterable[tuple[bytes, bytes]], cutoff_ns: int) -> list[tuple[str, bytes, bytes | None]]:
    """Ops dropping history records stamped before ``cutoff_ns`` (retention by age).

    Aggregates keep them; only the durable history (what re-materialization reads)
    forgets them.
    """
    from ._store import decode_batch

    ops: list[tuple[str, bytes, bytes | None]] = []
    for key, raw in batches:
        b = decode_batch(0, 0, raw, key)
        old = b.ts < cutoff_ns
        if not old.any():
            continue
        ops.append(_rewrite(key, b, np.nonzero(~old)[0]))
    return ops
