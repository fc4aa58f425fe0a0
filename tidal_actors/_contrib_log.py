"""Domain core: the columnar contribution log of one ledger shard.

Owns the in-memory record of which user contributed what to which cohort
(retroactive-purge FR-1), its eviction bookkeeping and its (user, cohort) index. No
threads, no I/O.

Layout: four parallel ``array`` columns, 25 bytes a record (DESIGN.md "What things
cost here": a tuple per record costs 194 B): membership shard, record sequence
number ``rseq``, user, and the record's *detail row* in the shard's `Aggregates`
(which holds cohort, entity, type, weight and timestamp once for both). Positions
are absolute (append count); the columns hold positions ``base ..``. The index maps
``(user_id, cohort)`` to an ``array('q')`` whose item 0 counts positions already
trimmed away and whose other items are absolute positions, ascending.

Eviction (FR-1, "FIFO ring-buffer semantics") is decided per membership shard by the
purge coordinator from ``rseq``: a record is live while ``rseq >= E[mshard]``. The log
trims its head lazily once records are surely evicted (below a floor), and a drained
(purged) record has its ``rseq`` set to -1.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ._ledger import Aggregates

__all__ = ["DRAINED", "ContributionLog", "LogRecord", "Prepared"]

DRAINED = -1
_COMPACT_MIN = 1 << 16
COLUMNS = ("m", "r", "u", "d")


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
    """What a purge would retract: positions, detail rows and records (in log order),
    how many of the pair's records had already been evicted, and the last position
    looked at."""

    positions: list[int]
    rows: list[int]
    records: list[LogRecord]
    evicted: int
    upto: int


EMPTY = Prepared([], [], [], 0, -1)


class ContributionLog:
    """Columnar, index-backed contribution log of one ledger shard."""

    def __init__(self, aggregates: Aggregates) -> None:
        self.agg = aggregates
        self.base = 0
        self.head = 0
        self.m = array("B")
        self.r = array("q")
        self.u = array("Q")
        self.d = array("q")
        self.index: dict[tuple[int, str], array] = {}  # type: ignore[type-arg]
        self.floor: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.r)

    def append(self, records: Iterable[tuple[int, int, int, str, int, int, float, int]], rows: Iterable[int]) -> None:
        """Append records (``LogRecord``-shaped tuples, in order) whose detail rows
        are ``rows``, and index them by (user, cohort)."""
        pos = self.base + len(self.r)
        index = self.index
        m_, r_, u_, d_ = self.m.append, self.r.append, self.u.append, self.d.append
        for rec, row in zip(records, rows):
            m_(rec[0])
            r_(rec[1])
            u_(rec[2])
            d_(row)
            key = (rec[2], rec[3])
            lst = index.get(key)
            if lst is None:
                index[key] = array("q", (0, pos))
            else:
                lst.append(pos)
            pos += 1

    def set_floor(self, mshard: int, floor: int) -> None:
        """Records of ``mshard`` with ``rseq < floor`` are surely evicted; trim them."""
        if floor > self.floor.get(mshard, 0):
            self.floor[mshard] = floor
        self.trim()

    def trim(self) -> None:
        """Drop surely-evicted or drained records from the head; compact when worth it."""
        r, m, floor = self.r, self.m, self.floor
        off = self.base
        i, n = self.head, off + len(r)
        while i < n:
            rs = r[i - off]
            if rs != DRAINED and rs >= floor.get(m[i - off], 0):
                break
            i += 1
        self.head = i
        dead = i - off
        if dead and ((dead >= _COMPACT_MIN and dead * 2 >= len(r)) or dead == len(r)):
            self._compact(dead)

    def _compact(self, head: int) -> None:
        for name in COLUMNS:
            del getattr(self, name)[:head]
        self.base += head
        base = self.base
        for lst in self.index.values():
            # trimmed positions become a count: item 0, reported by the next purge
            k = bisect_left(lst, base, 1)
            if k > 1:
                lst[0] += k - 1
                del lst[1:k]

    def record_at(self, pos: int) -> LogRecord:
        """The record at absolute position ``pos`` (must be in the columns)."""
        i = pos - self.base
        cohort, entity, stype, w, ts = self.agg.row(self.d[i])
        return LogRecord(self.m[i], self.r[i], self.u[i], cohort, entity, stype, w, ts)

    def prepare(self, user: int, cohort: str, live_from: int) -> Prepared:
        """What purging (user, cohort) retracts, without changing anything.

        ``live_from`` is the eviction watermark E of the user's membership shard:
        records with a lower rseq count as evicted.
        """
        lst = self.index.get((user, cohort))
        if lst is None:
            return EMPTY
        evicted = lst[0]
        positions, rows, records = [], [], []
        base = self.base
        for pos in lst[1:]:
            if pos < base:
                evicted += 1
                continue
            rs = self.r[pos - base]
            if rs == DRAINED:
                continue
            if rs < live_from:
                evicted += 1
                continue
            positions.append(pos)
            rows.append(self.d[pos - base])
            records.append(self.record_at(pos))
        return Prepared(positions, rows, records, evicted, lst[-1] if len(lst) > 1 else -1)

    def apply(self, user: int, cohort: str, prepared: Prepared) -> None:
        """Drain the prepared records and forget the pair's evicted ones from the index.

        Records of the pair appended after ``prepare`` stay (they were submitted after
        the purge).
        """
        lst = self.index.get((user, cohort))
        if lst is None:
            return
        base = self.base
        for pos in prepared.positions:
            if pos >= base:
                self.r[pos - base] = DRAINED
        # positions up to prepared.upto were looked at by prepare(): drained now or
        # evicted (and counted in the manifest); later ones arrived after the purge.
        keep = array("q", (0,))
        keep.extend(p for p in lst[1:] if p > prepared.upto)
        if len(keep) > 1:
            self.index[(user, cohort)] = keep
        else:
            del self.index[(user, cohort)]
        self.trim()

    def live_count(self) -> int:
        """Records in the columns not drained (evicted ones included until trimmed)."""
        if not len(self.r):
            return 0
        return int(np.count_nonzero(np.frombuffer(self.r, dtype=np.int64) != DRAINED))

    def nbytes(self) -> int:
        """Approximate bytes held by the columns and the index."""
        cols = sum(getattr(self, n).buffer_info()[1] * getattr(self, n).itemsize for n in COLUMNS)
        idx = sum(a.buffer_info()[1] * 8 + 80 for a in self.index.values()) + 120 * len(self.index)
        return cols + idx
