"""Re-materialization after a purge: the rebuild of one cohort, without I/O.

Owns the rule of the purge spec's hand-off (retroactive-purge "Summary": "schedule
deterministic re-materialization"): a cohort's aggregates are rebuilt on its ledger
shard from every contribution ever attributed there, leaving out each purged pair's
records that the purge covered (``rseq`` below the purging shard's record count when
the purge was taken).

`Rebuild` is the plan: a scratch `Aggregates` that folds two disjoint parts handed
to it, the records the shard has settled (`Aggregates.settle`), read back from the
durable history by the caller (`fold_settled`, one decoded batch at a time), and
the held detail rows (`step_held`, ``CHUNK_ROWS`` a step, then those of the signals
that arrive while it runs, the last few at `finish`). Signals to the cohort that arrive meanwhile are
added live and folded into the rebuilt state before it is swapped in, so none is
lost or counted twice. A rebuild equal to the live state (relative 1e-9) is not
swapped in, so a reopen after it still reads bit-for-bit what was read before.

Without a durable history (an ephemeral database) there is no history to rebuild
from: a purge retracted the covered records the log held (exactly: `retract_rows`),
and those the log had evicted stay in the aggregates, as the spec says of evicted
entries ("unretractable"; retroactive-purge FR-1), whether or not their detail rows
happen to be held still (`Aggregates.settle` is lazy): the rule does not depend on
timing. The rebuild then only counts the cohort's records.

The job that reads the history and steps a rebuild is `storage.rematerialize`.
No threads, no I/O.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog
from tidal_actors.core.key_state import DEAD

__all__ = [
    "CATCH_UPS",
    "CHUNK_ROWS",
    "FINISH_ROWS",
    "BatchColumns",
    "Rebuild",
    "RematConfig",
    "settled_mask",
]

CHUNK_ROWS = 25_000  # held detail rows folded a step (about 10 ms at full size)
# the held rows that arrived while a rebuild ran are folded in steps too, in up to
# CATCH_UPS rounds, until at most FINISH_ROWS are left for its last step (`finish`)
CATCH_UPS = 2
FINISH_ROWS = 4_096


class RematConfig(Protocol):
    """The settings a rebuild's scratch aggregates take (``Config`` has them)."""

    @property
    def window_width_ns(self) -> int: ...
    @property
    def window_buckets(self) -> int: ...
    def half_life_for(self, signal_type: int) -> int: ...


class BatchColumns(Protocol):
    """One decoded history batch (``storage.format.HistoryBatch``): numpy columns of
    one length, ``ci`` indexing ``cohorts``."""

    shard: int
    cohorts: list[str]
    ci: np.ndarray
    m: np.ndarray
    r: np.ndarray
    u: np.ndarray
    e: np.ndarray
    t: np.ndarray
    w: np.ndarray
    ts: np.ndarray


def settled_mask(b: BatchColumns, settled_upto: dict[int, int]) -> np.ndarray:
    """Which of batch ``b``'s records the shard has settled: rseq below
    ``settled_upto[membership shard]``."""
    bound = np.zeros(len(b.r), dtype=np.int64)
    for m, top in settled_upto.items():
        bound[b.m == m] = top
    out: np.ndarray = b.r < bound
    return out


class Rebuild:
    """The rebuild of ``cohort`` on a ledger shard's ``aggregates`` (see module doc).

    Args:
        aggregates: the shard's live aggregates (read; swapped into at `finish`).
        cohort: the cohort to rebuild.
        covered: user -> rseq bound; that user's records with a lower rseq are left out.
        config: the half-lives and window of the scratch aggregates.
        durable: whether a durable history holds the settled records (False: only count).
    """

    def __init__(
        self,
        aggregates: Aggregates,
        cohort: str,
        covered: dict[int, int],
        config: RematConfig,
        durable: bool,
    ) -> None:
        self.aggregates = aggregates
        self.cohort = cohort
        self.covered = covered
        self.durable = durable
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
        self.cut = aggregates.row_end
        self.cursor = aggregates.row_base
        self._catch_ups = 0
        # settling waits while a rebuild runs (`LedgerShard._settle`): this stays put
        self.settled_upto = dict(aggregates.settled_upto)

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

    def fold_settled(self, b: BatchColumns, settled: np.ndarray, kept: np.ndarray) -> None:
        """Fold batch ``b``'s records of the cohort that are ``settled`` (a mask, from
        `settled_mask`) and ``kept`` (a mask: no purge retracted them live, so they
        are not gone already and not counted as excluded)."""
        if self.cohort not in b.cohorts:
            return
        sel = settled & (b.ci == b.cohorts.index(self.cohort)) & kept
        if not sel.any():
            return
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

    def _add(
        self,
        ms: np.ndarray,
        rs: np.ndarray,
        us: np.ndarray,
        es: np.ndarray,
        ts_: np.ndarray,
        ws: np.ndarray,
        tss: np.ndarray,
        settled: np.ndarray,
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
        agg = self.aggregates
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
        if not self.durable:  # ephemeral: nothing to rebuild from (see the module doc)
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

    def step_held(self) -> bool:
        """Fold the next ``CHUNK_ROWS`` held rows: those that existed at the start,
        then, in up to ``CATCH_UPS`` more rounds, those that arrived meanwhile;
        True once at most ``FINISH_ROWS`` (or a last round's arrivals) are left to
        `finish`, which the handler that swaps the rebuild in folds."""
        hi = min(self.cursor + CHUNK_ROWS, self.cut)
        self._fold_held(self.cursor, hi)
        self.cursor = hi
        if self.cursor < self.cut:
            return False
        end = self.aggregates.row_end
        if end - self.cursor <= FINISH_ROWS or self._catch_ups >= CATCH_UPS:
            return True
        self.cut = end
        self._catch_ups += 1
        return False

    def finish(self, log: ContributionLog) -> tuple[int, int, bool, dict[int, int]]:
        """Fold rows that arrived meanwhile, compare, swap in, erase the left-out rows
        (and drop the retracted pairs of ``log``, the shard's contribution log).

        Returns ``(records_read, records_excluded, matched_live, excluded_per_user)``.
        """
        agg = self.aggregates
        self._fold_held(self.cursor, agg.row_end)
        rows = sorted(set(self.excluded_rows))
        users = set(self.per_user) | set(
            agg.view("row_user")[np.array(rows, dtype=np.int64) - agg.row_base].tolist()
        )
        if not self.durable:
            matched = True
        else:
            matched = self._install()
            for row in rows:
                agg.erase_row(row)
        for user in users:
            log.drop_retracted(user, self.cohort)
        excluded = sum(self.per_user.values())
        return self.read, excluded, matched, dict(self.per_user)

    def _install(self) -> bool:
        """Swap the scratch in (unless equal) with its settled sums; True if equal.
        On columns: a few numpy operations whatever the cohort's keys (the
        handler that runs it holds the shard, `actors.ledger_remat`)."""
        agg = self.aggregates
        sc = self.scratch
        # every rebuilt record is in the live state, so its key is too
        oks, ks = agg.live_key_ids(self.cohort, sc)
        matched = agg.same_cohort(self.cohort, sc)
        if not matched:
            agg.install_cohort(self.cohort, sc, ks)
        # the settled sums of the cohort's keys become the rebuild's (without the
        # covered records)
        n = agg.key_total
        agg.settled.drop_keys(np.flatnonzero(agg.key_cohort[:n] == agg.cohort_id(self.cohort)))
        rows = sc.settled.rows_of_keys(oks)
        if len(rows):
            c = sc.settled.cols
            # scratch key id -> live key id, for the scratch's keys of the cohort
            live = np.full(sc.key_total, -1, dtype=np.int64)
            live[oks] = ks
            k = live[c["k"][rows]]
            agg.settled.add(
                k,
                c["b"][rows],
                c["n"][rows],
                c["w"][rows],
                c["f"][rows],
                c["lo"][rows],
                c["hi"][rows],
                agg.key_half_life[k],
            )
        return matched
