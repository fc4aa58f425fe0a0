"""Domain core: the contribution log of one ledger shard.

Owns the in-memory record of which contributions can still be retracted
(retroactive-purge FR-1), its eviction bookkeeping and its (user, cohort) index. No
threads, no I/O.

Layout: a column of *detail rows* (`log_rows.LogRows`: segments of consecutive
rows, 16 bytes a segment, one segment while records arrive without gaps): the record's
fields (user, cohort, entity, type, weight, timestamp, membership shard, ``rseq``)
live once, in the shard's `Aggregates` detail columns. Positions are absolute
(append count); the column holds positions ``base ..``. The (user, cohort) index
into it and the holds of purges in flight are in `pair_index`.

Eviction (FR-1, "FIFO ring-buffer semantics") is decided per membership shard by the
purge coordinator from ``rseq``: a record is live while its rseq is at or above its
membership shard's watermark (terms: the glossary in `tidal_actors.core`). The log
trims its head lazily once records are surely evicted (below a floor) or drained
(their row retracted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np

from tidal_actors._types import ContributionRecord
from tidal_actors.core import pair_runs as pr
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.log_rows import LogRows
from tidal_actors.core.pair_index import PairIndex
from tidal_actors.core.pair_runs import GONE

__all__ = ["EMPTY", "ContributionLog", "LogRecord", "Prepared"]

_COMPACT_MIN = 1 << 16


class LogRecord(NamedTuple):
    """One record as it enters the log (and the durable history)."""

    mshard: int
    rseq: int
    user: int
    cohort: str
    entity: int
    stype: int
    weight: float
    ts: int


class Prepared(NamedTuple):
    """What a purge would retract: positions, detail rows and records (in log order;
    the manifest's entries as they are), how many of the pair's records had already
    been evicted, the watermark used, and the records' membership shards and rseqs
    (their tombstones), and the purge's bound (its membership shard's record count
    when it was taken)."""

    positions: list[int]
    rows: list[int]
    records: list[ContributionRecord]
    evicted: int
    watermark: int
    mshards: list[int]
    rseqs: list[int]
    bound: int = 0


EMPTY = Prepared([], [], [], 0, 0, [], [])


class ContributionLog(PairIndex):
    """Index-backed contribution log of one ledger shard (rows into `Aggregates`)."""

    def __init__(self, aggregates: Aggregates) -> None:
        super().__init__(aggregates)
        self.base = 0
        self.head = 0
        self.d = LogRows()
        self.floor: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.d)

    def append_columns(
        self,
        users: Sequence[int] | np.ndarray,
        cohorts: Sequence[str] | np.ndarray,
        rows: Iterable[int],
    ) -> None:
        """Append records, given as columns: their users (uint64 values), their
        cohorts (names, or the aggregates' cohort ids as an integer array) and their
        detail rows (in order), and index them by (user, cohort) (`pair_index`: in
        batches, sorted with numpy)."""
        d = self.d
        n0 = len(d)
        d.extend(rows)
        n = len(d) - n0
        if n:
            self._pend(users, cohorts, n)

    def load_columns(
        self,
        users: np.ndarray,
        cids: np.ndarray,
        names: Sequence[str],
        rows: np.ndarray,
        live: np.ndarray,
        rseqs: np.ndarray,
        reported: Mapping[tuple[int, str], int],
    ) -> None:
        """Rebuild the log of an empty shard from its replayed history, in bulk.

        Args:
            users: uint64, the records' users, in history order.
            cids: integer, each record's cohort as an index into ``names``.
            names: cohort names.
            rows: int64, each record's detail row in the aggregates.
            live: bool, whether the record is above its membership shard's eviction
                watermark (a live record goes in the log; an evicted one only counts).
            rseqs: int64, the records' rseq.
            reported: ``(user, cohort) -> bound`` of the pairs' committed purges: an
                evicted record with ``rseq < bound`` was reported by that purge's
                manifest and is not counted again.

        The result equals appending the live records one by one and adding each pair's
        unreported evicted records to its item 0 (what the next purge reports).

        Raises:
            ValueError: the log is not empty.
        """
        if len(self.d) or not self.empty():
            raise ValueError("load_columns needs an empty log")
        n = len(users)
        if not n:
            return
        users = np.asarray(users, dtype=np.uint64)
        live = np.asarray(live, dtype=bool)
        rseqs = np.asarray(rseqs, dtype=np.int64)
        self.d.extend(np.asarray(rows, dtype=np.int64)[live])
        lut = np.array([self.agg.cohort_id_for(c) for c in names], dtype=np.int64)
        acids = lut[np.asarray(cids, dtype=np.int64)]
        # each record's reported bound (-1: none), matched by pair key
        bound = np.full(n, -1, dtype=np.int64)
        rep = [(u, c, b) for (u, c), b in reported.items() if self.agg.cohort_id(c) is not None]
        wide = not pr.fits(users, acids)
        if rep:
            ru = np.array([u for u, _, _ in rep], dtype=np.uint64)
            rc = np.array([self.agg.cohort_id_for(c) for _, c, _ in rep], dtype=np.int64)
            wide = wide or not pr.fits(ru, rc)
            at = pr.match(pr.encode(ru, rc, wide), pr.encode(users, acids, wide))
            hit = at >= 0
            bound[hit] = np.array([b for _, _, b in rep], dtype=np.int64)[at[hit]]
        counted = ~live & (rseqs >= bound)
        self.load_entries(
            users,
            acids,
            counted.astype(np.int64),
            np.flatnonzero(live),
            np.arange(self.base, self.base + int(live.sum()), dtype=np.int64),
        )

    def set_floor(self, mshard: int, floor: int) -> None:
        """Records of ``mshard`` with ``rseq < floor`` are surely evicted; trim them."""
        if floor > self.floor.get(mshard, 0):
            self.floor[mshard] = floor
        self.trim()

    def _gone(self, row: int) -> bool:
        agg = self.agg
        i = row - agg.phys_base
        return agg.row_key[i] == DEAD or agg.row_rseq[i] < self.floor.get(agg.row_mshard[i], 0)

    def trim(self) -> None:
        """Drop surely-evicted or drained records from the head; compact when worth it."""
        d = self.d
        off = self.base
        i, n = self.head, off + len(d)
        gone = self._gone
        step = 1  # the head's row first, then blocks of rows read at once, growing
        while i < n:
            m = min(step, n - i)
            rows = [d[i - off]] if m == 1 else d.take(np.arange(i - off, i - off + m)).tolist()
            for row in rows:
                if not gone(row):
                    n = i  # the first record still live ends the loop
                    break
                i += 1
            step = min(step * 16, 4096)
        self.head = i
        dead = i - off
        if dead and ((dead >= _COMPACT_MIN and dead * 2 >= len(d)) or dead == len(d)):
            self._compact(dead)

    def _compact(self, head: int) -> None:
        self._flush()
        if self.holds:
            self._keep_held_rows(head)
        self.d.drop_head(head)
        self.base += head
        self._trim_runs()  # trimmed positions become counts: item 0

    def prepare(self, user: int, cohort: str, watermark: int, bound: int) -> Prepared:
        """What purging (user, cohort) retracts, without changing anything.

        ``watermark`` is the eviction watermark of the user's membership shard:
        records with a lower rseq count as evicted. ``bound`` is that shard's record
        count when the purge was taken: records from then on were submitted after
        the purge and are left alone.
        """
        entry = self.entry(user, cohort)
        held = self.held_rows.get((user, cohort))
        if entry is None and held is None:
            return EMPTY._replace(watermark=watermark, bound=bound)
        # item 0 was folded before the purge's marker: all below its bound
        evicted, pos = entry if entry is not None else (0, np.zeros(0, dtype=np.int64))
        base = self.base
        gone = pos < base  # trimmed away: evicted
        evicted += int(np.count_nonzero(gone))
        pos = pos[~gone]
        agg = self.agg
        rows = self.d.take(pos - base)
        if held is not None:  # trimmed since the marker: older than the rest, no position
            pos = np.concatenate([np.full(len(held), -1, dtype=np.int64), pos])
            rows = np.concatenate([held, rows])
        rel = rows - agg.row_base
        k = agg.view("row_key")[rel]
        alive = k != DEAD
        pos, rows, rel, k = pos[alive], rows[alive], rel[alive], k[alive]
        rseq = agg.view("row_rseq")[rel]
        old = rseq < watermark
        evicted += int(np.count_nonzero(old))
        take = ~old & (rseq < bound)
        pos, rows, rel, k = pos[take], rows[take], rel[take], k[take]
        # one object per record (the manifest's entry): each GC-tracked allocation
        # brings the next cyclic-GC pass nearer
        records = list(
            map(
                ContributionRecord,
                agg.view("row_user")[rel].tolist(),
                repeat(cohort, len(rows)),
                agg.key_entity[k].tolist(),
                agg.key_type[k].tolist(),
                agg.view("row_weight")[rel].tolist(),
                agg.view("row_ts")[rel].tolist(),
            )
        )
        return Prepared(
            pos.tolist(),
            rows.tolist(),
            records,
            evicted,
            watermark,
            agg.view("row_mshard")[rel].tolist(),
            rseq[take].tolist(),
            bound,
        )

    def apply(self, user: int, cohort: str, prepared: Prepared) -> None:
        """Forget the pair's drained and evicted records from the index (the caller
        has retracted the prepared rows); records submitted after the purge stay.

        Every record of the pair below the purge's bound is in its manifest (as an
        entry or counted as evicted); the pair's trimmed records at or above the
        bound (submitted after the purge, then evicted, before or after it was
        prepared) stay counted for its next purge.
        """
        pair = (user, cohort)
        bounds = self.holds.pop(pair, [])
        if prepared.bound in bounds:
            bounds.remove(prepared.bound)  # this purge's; another with the same bound stays
        # purges run one at a time: those with a lower bound are over (a leftover hold)
        later = [b for b in bounds if b >= prepared.bound]
        rows = self.held_rows.get(pair)
        if later:
            self.holds[pair] = later
            if rows is not None:  # the next purge reads those at or after this one's bound
                keep = rows[self.agg.view("row_rseq")[rows - self.agg.row_base] >= prepared.bound]
                if keep.size:
                    self.held_rows[pair] = keep
                else:
                    del self.held_rows[pair]
            carried = 0
        else:  # trimmed records after this purge's bound: evicted, not reported yet
            carried = self._fold_held(pair, prepared.bound)
        self._keep_live(user, cohort, prepared.watermark, carried)

    def _keep_live(self, user: int, cohort: str, watermark: int, carried: int) -> None:
        """Set the pair's item 0 to ``carried`` and keep only its positions whose rows
        are not retracted and have an rseq >= ``watermark``; then trim. Nothing if
        the pair has no entry."""
        cid = self.agg.cohort_id(cohort)
        if cid is None:
            return
        slices = self._slices(user, cid)
        raw = self._raw(slices)
        count = self.counts.get(user, cid)
        if not count and (user, cid) not in self._kept and not (raw != GONE).any():
            return
        self._kept.discard((user, cid))
        agg, base = self.agg, self.base
        valid = raw >= base  # tombstones are below any base
        rows = self.d.take(raw[valid] - base) - agg.row_base
        keep = np.zeros(len(raw), dtype=bool)
        keep[valid] = (agg.view("row_key")[rows] != DEAD) & (
            agg.view("row_rseq")[rows] >= watermark
        )
        self._remove(slices, (raw != GONE) & ~keep)
        if count != carried:
            self.counts.set(user, cid, carried)
        self.trim()

    def drop_retracted(self, user: int, cohort: str) -> None:
        """Drop the pair's positions whose rows were retracted (re-materialization)."""
        entry = self.entry(user, cohort)
        if entry is not None:
            self._keep_live(user, cohort, -1, entry[0])

    def live_count(self) -> int:
        """Records in the column whose row is not retracted (evicted ones included until trimmed)."""
        if not len(self.d):
            return 0
        rows = self.d.tail(self.head - self.base) - self.agg.row_base
        return int(np.count_nonzero(self.agg.view("row_key")[rows] != DEAD))

    def first_row(self) -> int | None:
        """The lowest detail row the log will still read once its head is compacted
        (`compact_head`): the head's, or one held for a purge in flight; None if
        none. Rows before it may be settled (`Aggregates.settle`)."""
        low = [int(r.min()) for r in self.held_rows.values() if len(r)]
        if self.head < self.base + len(self.d):
            low.append(self.d[self.head - self.base])  # rows enter in ascending order
        return min(low) if low else None

    def compact_head(self) -> None:
        """Drop the column's trimmed records now (their positions become their
        pairs' evicted counts, held pairs' rows move to `held_rows`), so that no
        position names a row before `first_row`."""
        if self.head > self.base:
            self._compact(self.head - self.base)

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: ``log_column`` and ``pair_index`` (its runs, counts
        and pending records, `PairIndex.index_bytes`)."""
        return {
            "log_column": self.d.nbytes(),
            "pair_index": self.index_bytes(),
        }

    def nbytes(self) -> int:
        """Approximate bytes held by the column and the index."""
        return self.d.nbytes() + self.index_bytes()
