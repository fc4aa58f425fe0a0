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

from tidal_actors._types import PurgeId, PurgeStatus
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.storage.format import Keyspace, Tag, encode_key, seal

__all__ = ["CHUNK_ROWS", "RematJob", "decode_status", "encode_status", "erase_history_ops"]

CHUNK_ROWS = 100_000  # held detail rows folded a step
HISTORY_BATCHES = 32  # history batches folded a step


class RematJob:
    """One re-materialization of ``cohort`` on a ledger shard's state.

    With a durable history (``state.history``) the cohort is rebuilt into a scratch
    `Aggregates` from two disjoint parts, leaving out the covered records: the
    records the shard has settled (`Aggregates.settle`: rseq below its membership
    shard's ``settled_upto``; committed to the history before they were settled),
    read back from the history ``HISTORY_BATCHES`` batches a step, and the held
    detail rows (``CHUNK_ROWS`` a step, then the signals that arrive while it runs).
    The rebuilt state replaces the live one (unless equal), with the settled sums
    of its keys, so settled records that a purge covers are gone too. Nothing
    settled: the history is not read at all. Settled records that
    ``history_retention_ns`` has dropped from the history are not reached: the
    rebuilt cohort no longer holds them, as after a restore from the history.

    Without one (an ephemeral database) there is no history to rebuild from: a
    purge retracted the covered records the log held (exactly: `retract_rows`), and
    those the log had evicted stay in the aggregates, as the spec says of evicted
    entries ("unretractable"; retroactive-purge FR-1), whether or not their detail
    rows happen to be held still (`Aggregates.settle` is lazy): the rule does not
    depend on timing. The job then only counts the cohort's records.

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
        self.scratch = Aggregates(
            config.half_life_for, config.window_width_ns, config.window_buckets
        )
        # covered users (sorted) and their bounds, for a vectorized lookup
        cu = sorted(covered)
        self._cu = np.array(cu, dtype=np.uint64) if cu else None
        self._cb = np.array([covered[u] for u in cu], dtype=np.int64)
        self.excluded_rows: list[int] = []  # held rows to erase
        self.per_user: dict[int, int] = {}  # excluded records not retracted before
        self.read = 0
        agg: Aggregates = state.aggregates
        self.cut = agg.row_end
        self.history = state.history
        self._keys: list[bytes] = []
        self._tombs: dict[int, np.ndarray] = {}
        # settling waits while a job runs (`LedgerShard._settle`): this stays put
        self._settled_upto = dict(agg.settled_upto)
        if self.history is not None and self._settled_upto:
            self._keys = self.history.batch_keys()
            self._tombs = self.history.tombstones()
        self.cursor = agg.row_base
        self.t0 = time.perf_counter()

    def _covered(self, users: np.ndarray, rseqs: np.ndarray) -> np.ndarray:
        """Which of the records a purge covers (rseq below its user's bound)."""
        if self._cu is None:
            return np.zeros(len(users), dtype=bool)
        at = np.minimum(np.searchsorted(self._cu, users), len(self._cu) - 1)
        out: np.ndarray = (self._cu[at] == users) & (rseqs < self._cb[at])
        return out

    def _count(self, users: np.ndarray) -> None:
        for u in users.tolist():
            self.per_user[u] = self.per_user.get(u, 0) + 1

    def _fold_history(self, keys: list[bytes]) -> bool:
        """Fold the settled records of the batches at ``keys``; False once this
        shard's batches have passed every settled record (rseqs grow batch by batch
        within a membership shard, so no later batch of this shard holds one)."""
        assert self.history is not None
        upto = self._settled_upto
        shard = self.history.shard
        go_on = False
        for b in self.history.batches(keys):
            bound = np.zeros(len(b.r), dtype=np.int64)
            for m, top in upto.items():
                bound[b.m == m] = top
            settled = b.r < bound
            if b.shard != shard or settled.any():
                go_on = True
            if self.cohort not in b.cohorts:
                continue
            # records a purge retracted live (tombstoned) are gone already: not read,
            # not counted as excluded (as their held rows, retracted, were not)
            sel = (
                settled
                & (b.ci == b.cohorts.index(self.cohort))
                & self.history.untombstoned(b, self._tombs)
            )
            if not sel.any():
                continue
            self.read += int(sel.sum())
            out = sel & self._covered(b.u, b.r)
            if out.any():
                self._count(b.u[out])
            rows = np.flatnonzero(sel & ~out)
            if len(rows):
                self._add(
                    b.m[rows],
                    b.r[rows],
                    b.u[rows],
                    b.e[rows],
                    b.t[rows],
                    b.w[rows],
                    b.ts[rows],
                    settled=np.ones(len(rows), dtype=bool),
                )
        return go_on

    def _add(
        self, ms: Any, rs: Any, us: Any, es: Any, ts_: Any, ws: Any, tss: Any, settled: np.ndarray
    ) -> None:
        """Fold records into the scratch, keep the sums of those the shard has
        settled, and drop the scratch's rows (only its sums are installed)."""
        sc = self.scratch
        sc.add_columns(
            np.asarray(ms, dtype=np.uint8).tolist(),
            rs.tolist(),
            us.tolist(),
            [self.cohort] * len(rs),
            es.tolist(),
            ts_.tolist(),
            np.asarray(ws, dtype=np.float32).tolist(),
            tss.tolist(),
        )
        sc.settle(sc.row_end, keep=settled)

    def _fold_held(self, lo: int, hi: int) -> None:
        """Held rows ``lo .. hi`` of the cohort (durable only): covered ones to
        erase, the others into the scratch."""
        agg: Aggregates = self.state.aggregates
        lo = max(lo, agg.row_base)
        if hi <= lo:
            return
        cid = agg.cohort_id(self.cohort)
        if cid is None:
            return
        nk = agg.key_total
        is_c = np.zeros(nk + 1, dtype=bool)  # the cohort's key ids (from the key_cohort column)
        is_c[:nk] = agg.key_cohort[:nk] == cid
        base = agg.row_base
        dk = agg.view("row_key")[lo - base : hi - base].astype(np.int64)
        dk[dk == DEAD] = nk  # retracted rows point at the False slot
        sel = np.flatnonzero(is_c[dk])
        if not len(sel):
            return
        self.read += len(sel)
        if self.history is None:  # ephemeral: nothing to rebuild from (see the class)
            return
        rel = sel + (lo - base)
        users = agg.view("row_user")[rel]
        rseqs = agg.view("row_rseq")[rel]
        out = self._covered(users, rseqs)
        if out.any():
            self.excluded_rows.extend((rel[out] + base).tolist())
            self._count(users[out])
        keep = ~out
        if not keep.any():
            return
        r = rel[keep]
        k = dk[sel][keep]
        self._add(
            agg.view("row_mshard")[r],
            rseqs[keep],
            users[keep],
            agg.key_entity[k],
            agg.key_type[k],
            agg.view("row_weight")[r],
            agg.view("row_ts")[r],
            settled=np.zeros(len(r), dtype=bool),
        )

    def step(self) -> bool:
        """Fold the next chunk of what existed at the start; True when all is."""
        if self._keys:
            chunk, self._keys = self._keys[:HISTORY_BATCHES], self._keys[HISTORY_BATCHES:]
            if not self._fold_history(chunk):
                self._keys = [k for k in self._keys if self._other_shard(k)]
            return False
        hi = min(self.cursor + CHUNK_ROWS, self.cut)
        self._fold_held(self.cursor, hi)
        self.cursor = hi
        return self.cursor >= self.cut

    def _other_shard(self, key: bytes) -> bool:
        assert self.history is not None
        shard: int = self.history.key_shard_seq(key)[0]
        return bool(shard != self.history.shard)

    def finish(self) -> tuple[int, int, bool, dict[int, int]]:
        """Fold rows that arrived meanwhile, compare, swap in, erase the left-out rows.

        Returns ``(records_read, records_excluded, matched_live, excluded_per_user)``.
        """
        agg: Aggregates = self.state.aggregates
        self._fold_held(self.cut, agg.row_end)
        rows = sorted(set(self.excluded_rows))
        users = set(self.per_user) | set(
            agg.view("row_user")[np.array(rows, dtype=np.int64) - agg.row_base].tolist()
        )
        if self.history is None:
            matched = True
        else:
            matched = self._install()
            for row in rows:
                agg.erase_row(row)
        log = self.state.log
        for user in users:
            log.drop_retracted(user, self.cohort)
        excluded = sum(self.per_user.values())
        return self.read, excluded, matched, dict(self.per_user)

    def _install(self) -> bool:
        """Swap the scratch in (unless equal) with its settled sums; True if equal."""
        agg: Aggregates = self.state.aggregates
        sc = self.scratch
        oks = sc.cohort_key_ids(self.cohort)
        key_ids: dict[tuple[int, int], int] = {}
        for ok in oks:
            e, t = int(sc.key_entity[ok]), int(sc.key_type[ok])
            # every rebuilt record is in the live state, so its key is too
            key_ids[(e, t)] = agg.index[(self.cohort, e, t)]
        matched = agg.same_cohort(self.cohort, sc)
        if not matched:
            agg.install_cohort(self.cohort, sc, key_ids)
        # the settled sums of the cohort's keys become the rebuild's (without the
        # covered records)
        n = agg.key_total
        agg.settled.drop_keys(
            np.flatnonzero(agg.key_cohort[:n] == agg.cohort_id(self.cohort)).tolist()
        )
        for ok, entries in sc.settled.of_keys(oks).items():
            k = key_ids[(int(sc.key_entity[ok]), int(sc.key_type[ok]))]
            bs, ns, ws, fs, los, his = zip(*entries)
            agg.settled.add(
                [k] * len(bs), bs, ns, ws, fs, los, his, [int(agg.key_half_life[k])] * len(bs)
            )
        return matched


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
    from tidal_actors.storage.stores import decode_batch

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
    from tidal_actors.core.contrib_log import encode_history_columns

    if not len(keep):
        return (Keyspace.HISTORY.value, key, None)
    names = b.cohorts
    cols = (
        b.m[keep].tolist(),
        b.r[keep].tolist(),
        b.u[keep].tolist(),
        list(map(names.__getitem__, b.ci[keep].tolist())),
        b.e[keep].tolist(),
        b.t[keep].tolist(),
        b.w[keep].tolist(),
        b.ts[keep].tolist(),
    )
    ctx = None
    if b.contexts:
        ctx = {
            new: b.contexts[old] for new, old in enumerate(keep.tolist()) if old in b.contexts
        } or None
    return (Keyspace.HISTORY.value, key, seal(key, encode_history_columns(cols, ctx)))


def encode_status(s: PurgeStatus, bound: int) -> tuple[bytes, bytes]:
    """Key and value of a purge status record (items keyspace, Tag.PURGE_STATUS)."""
    key = encode_key(s.user_id, Tag.PURGE_STATUS, s.purge_id.to_bytes16())
    value = msgpack.packb(
        [
            s.purge_id.to_bytes16(),
            s.user_id,
            s.cohort,
            s.retracted_live,
            s.rematerialized,
            s.rematerialized_at_ns,
            s.excluded_by_rematerialization,
            bound,
        ]
    )
    return key, value


def decode_status(raw: bytes) -> tuple[PurgeStatus, int]:
    """Inverse of :func:`encode_status`: the status and the purge's rseq bound."""
    pid, user, cohort, live, done, at, excluded, bound = msgpack.unpackb(raw)
    return PurgeStatus(PurgeId.from_bytes16(pid), user, cohort, live, done, at, excluded), bound


def retention_ops(
    batches: Iterable[tuple[bytes, bytes]], cutoff_ns: int
) -> list[tuple[str, bytes, bytes | None]]:
    """Ops dropping history records stamped before ``cutoff_ns`` (retention by age).

    Aggregates keep them; only the durable history (what re-materialization reads)
    forgets them.
    """
    from tidal_actors.storage.stores import decode_batch

    ops: list[tuple[str, bytes, bytes | None]] = []
    for key, raw in batches:
        b = decode_batch(0, 0, raw, key)
        old = b.ts < cutoff_ns
        if not old.any():
            continue
        ops.append(_rewrite(key, b, np.nonzero(~old)[0]))
    return ops
