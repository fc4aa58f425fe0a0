"""Domain core: the columnar contribution log of one ledger shard.

Owns the in-memory record of which user contributed what to which cohort
(retroactive-purge FR-1), its eviction bookkeeping and its (user, cohort) index. No
threads, no I/O.

Layout: parallel ``array`` columns (36 bytes a record, DESIGN.md "What things cost
here": a tuple per record costs 194 B). Positions are absolute (append count); the
columns hold positions ``base ..``. The index maps ``(user_id, cohort_idx)`` to an
``array('q')`` whose item 0 counts positions already trimmed away and whose other
items are absolute positions, ascending.

Eviction (FR-1, "FIFO ring-buffer semantics") is decided per membership shard by the
purge coordinator from record sequence numbers (``rseq``): a record is live while
``rseq >= E[mshard]``. The log trims its head lazily once records are surely evicted
(below a floor the coordinator publishes), and a drained (purged) record has its
``rseq`` set to -1.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

__all__ = ["ContributionLog", "LogRecord", "Prepared"]

DRAINED = -1
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
    """What a purge would retract: positions and records (in log order), and how many
    of the pair's records had already been evicted."""

    positions: list[int]
    records: list[LogRecord]
    evicted: int
    upto: int


class ContributionLog:
    """Columnar, index-backed contribution log of one ledger shard."""

    def __init__(self) -> None:
        self.base = 0
        self.head = 0
        self.m = array("B")
        self.r = array("q")
        self.u = array("Q")
        self.c = array("I")
        self.e = array("Q")
        self.t = array("Q")
        self.w = array("f")
        self.ts = array("q")
        self.index: dict[tuple[int, int], array] = {}  # type: ignore[type-arg]
        self.cohort_names: list[str] = []
        self.cohort_idx: dict[str, int] = {}
        self.floor: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.r)

    def intern(self, cohort: str) -> int:
        """Local integer id of a cohort name."""
        ci = self.cohort_idx.get(cohort)
        if ci is None:
            ci = self.cohort_idx[cohort] = len(self.cohort_names)
            self.cohort_names.append(cohort)
        return ci

    def append(self, records: Iterable[tuple[int, int, int, str, int, int, float, int]]) -> int:
        """Append records (``LogRecord``-shaped tuples, in order) and index them by
        (user, cohort); returns the column offset of the first one."""
        start = len(self.r)
        pos = self.base + len(self.r)
        index = self.index
        intern = self.intern
        m_, r_, u_, c_, e_, t_, w_, ts_ = (
            self.m.append, self.r.append, self.u.append, self.c.append,
            self.e.append, self.t.append, self.w.append, self.ts.append,
        )
        for mshard, rseq, user, cohort, entity, stype, weight, ts in records:
            ci = intern(cohort)
            m_(mshard)
            r_(rseq)
            u_(user)
            c_(ci)
            e_(entity)
            t_(stype)
            w_(weight)
            ts_(ts)
            key = (user, ci)
            lst = index.get(key)
            if lst is None:
                index[key] = array("q", (0, pos))
            else:
                lst.append(pos)
            pos += 1
        return start

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
        for name in ("m", "r", "u", "c", "e", "t", "w", "ts"):
            col = getattr(self, name)
            del col[:head]
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
        return LogRecord(
            self.m[i], self.r[i], self.u[i], self.cohort_names[self.c[i]],
            self.e[i], self.t[i], float(self.w[i]), self.ts[i],
        )

    def prepare(self, user: int, cohort: str, live_from: int) -> Prepared:
        """What purging (user, cohort) retracts, without changing anything.

        ``live_from`` is the eviction watermark E of the user's membership shard:
        records with a lower rseq count as evicted.
        """
        ci = self.cohort_idx.get(cohort)
        lst = self.index.get((user, ci)) if ci is not None else None
        if lst is None:
            return Prepared([], [], 0, -1)
        evicted = lst[0]
        positions, records = [], []
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
            records.append(self.record_at(pos))
        return Prepared(positions, records, evicted, lst[-1] if len(lst) > 1 else -1)

    def apply(self, user: int, cohort: str, prepared: Prepared) -> None:
        """Drain the prepared records and forget the pair's evicted ones from the index.

        Records of the pair appended after ``prepare`` stay (they were submitted after
        the purge).
        """
        ci = self.cohort_idx.get(cohort)
        if ci is None:
            return
        lst = self.index.get((user, ci))
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
            self.index[(user, ci)] = keep
        else:
            del self.index[(user, ci)]
        self.trim()

    def lookup(self, cohort: str, entity: int, stype: int, t_lo: int, t_hi: int) -> list[tuple[int, float]]:
        """``(ts, weight)`` of present, undrained records of a key with ``t_lo <= ts <= t_hi``."""
        ci = self.cohort_idx.get(cohort)
        if ci is None or not len(self.r):
            return []
        c = np.frombuffer(self.c, dtype=np.uint32)
        e = np.frombuffer(self.e, dtype=np.uint64)
        t = np.frombuffer(self.t, dtype=np.uint64)
        ts = np.frombuffer(self.ts, dtype=np.int64)
        r = np.frombuffer(self.r, dtype=np.int64)
        w = np.frombuffer(self.w, dtype=np.float32)
        mask = (c == ci) & (e == np.uint64(entity)) & (t == np.uint64(stype))
        mask &= (ts >= t_lo) & (ts <= t_hi) & (r != DRAINED)
        idx = np.nonzero(mask)[0]
        return [(int(ts[i]), float(w[i])) for i in idx]

    def live_count(self) -> int:
        """Records present in the columns and not drained (evicted ones included until trimmed)."""
        if not len(self.r):
            return 0
        return int(np.count_nonzero(np.frombuffer(self.r, dtype=np.int64) != DRAINED))

    def nbytes(self) -> int:
        """Approximate bytes held by columns and index."""
        cols = sum(
            getattr(self, n).buffer_info()[1] * getattr(self, n).itemsize
            for n in ("m", "r", "u", "c", "e", "t", "w", "ts")
        )
        idx = sum(a.buffer_info()[1] * 8 + 64 for a in self.index.values()) + 100 * len(self.index)
        return cols + idx
