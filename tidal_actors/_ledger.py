"""Domain core: cohort aggregates (forward-decayed scores and bucketed windows).

Owns the arithmetic of one ledger shard's aggregates; no threads, no I/O.

Theory of operation
-------------------
Per key ``(cohort, entity_id, signal_type)`` one flat list (the *state*)::

    [S, L, t_max, key_id, cb, cn, cw, cfd, ctm, older]

* ``L`` is the key's landmark (ns) and ``S = sum(w_i * 2 ** ((t_i - L) / h))`` the
  forward-decayed sum (Cormode, Shkapenyuk, Srivastava, Xu, "Forward Decay: A
  Practical Time Decay Model for Streaming Systems", ICDE 2009). Adding and
  retracting a contribution are exact inverses and order-independent, unlike a lazily
  decayed ``(score, last_ns)`` pair. When ``(t - L) / h`` passes ``RENORMALIZE_AT``
  the landmark moves to ``t`` and every stored sum is rescaled, so nothing overflows.
* Buckets ``b = t // width`` each hold ``count, weight_sum, fd_sum, t_max_b``. The
  latest bucket sits inline (``cb, cn, cw, cfd, ctm``: most contributions land
  there, and a key needs no dict until a second bucket appears); earlier ones are in
  ``older`` (a dict ``b -> [count, wsum, fd, tmax]``, or None). Every bucket that
  holds a contribution is kept, so a window read at any time is exact and ``S`` is
  always the sum of the buckets' ``fd`` (re-derived with ``math.fsum`` after a
  retraction to drop rounding residue).
* Every contribution also gets a *detail row* in parallel columns: key id (u32),
  timestamp (i64), weight (f32), user (u64), membership shard (u8) and record
  sequence number ``rseq`` (i64): 33 bytes. The contribution log points into them
  (it holds no copy), reads inside a bucket are exact from them, and
  re-materialization rebuilds a cohort from them. A retracted row has key id
  ``DEAD`` and its other fields zeroed (erasure in memory).

Reads (issue 2, rules 3 and 4): ``score(at) = sum(w_i * 2 ** (-(at - t_i) / h))`` over
contributions with ``t_i <= at``. If ``at >= t_max`` this is ``S * 2 ** (-(at-L)/h)``.
Otherwise buckets after ``b(at)`` are left out, and the bucket ``b(at)`` itself, when
some of it lies after ``at``, is summed row by row from the detail columns. A
contribution stamped after the read time is never counted, so none ever weighs more
than its weight. The window at ``at`` covers buckets ``b(at)-n+1 .. b(at)`` whole.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterable, Iterator

import numpy as np

__all__ = ["DEAD", "Aggregates", "iter_buckets"]

RENORMALIZE_AT = 256.0
DEAD = 0xFFFFFFFF  # key id of a retracted detail row

Record = tuple[int, int, int, str, int, int, float, int]  # LogRecord-shaped


def iter_buckets(st: list) -> Iterator[tuple[int, int, float, float, int]]:  # type: ignore[type-arg]
    """Every non-empty bucket of a state: ``(b, count, weight_sum, fd_sum, t_max_b)``."""
    if st[5]:
        yield st[4], st[5], st[6], st[7], st[8]
    if st[9]:
        for b, bk in st[9].items():
            yield b, bk[0], bk[1], bk[2], bk[3]


class Aggregates:
    """The decayed scores and windows of every cohort one ledger shard owns.

    Args:
        half_life_for: signal type -> half-life in ns.
        window_width_ns: bucket width in ns.
        window_buckets: number of buckets a window read covers.
    """

    __slots__ = ("_hl", "_hl_cache", "_n", "_width", "cohorts", "dk", "dm", "dr", "dt", "du", "dw", "keys")

    def __init__(
        self, half_life_for: Callable[[int], int], window_width_ns: int, window_buckets: int
    ) -> None:
        self._hl = half_life_for
        self._hl_cache: dict[int, int] = {}
        self._width = window_width_ns
        self._n = window_buckets
        # cohort -> (entity_id, signal_type) -> state (see the module docstring)
        self.cohorts: dict[str, dict[tuple[int, int], list]] = {}  # type: ignore[type-arg]
        self.keys: list[tuple[str, int, int]] = []  # key id -> (cohort, entity, type)
        self.dk = array("I")  # detail rows: key id (DEAD once retracted)
        self.dt = array("q")  # timestamp ns
        self.dw = array("f")  # float32 weight
        self.du = array("Q")  # user id
        self.dm = array("B")  # membership shard
        self.dr = array("q")  # rseq (record sequence number in its membership shard)

    def half_life(self, stype: int) -> int:
        h = self._hl_cache.get(stype)
        if h is None:
            h = self._hl_cache[stype] = self._hl(stype)
        return h

    # -- writes ---------------------------------------------------------------------

    def add_many(self, records: list[Record]) -> range:
        """Add contributions (``LogRecord``-shaped tuples; weights already float32;
        ts in ns); returns their detail rows. The hot path: lookups bound once."""
        cohorts = self.cohorts
        hl_cache = self._hl_cache
        width = self._width
        keys_table = self.keys
        dk, dt, dw = self.dk.append, self.dt.append, self.dw.append
        du, dm, dr = self.du.append, self.dm.append, self.dr.append
        first = len(self.dk)
        for rec in records:
            cohort = rec[3]
            stype = rec[5]
            w = rec[6]
            ts = rec[7]
            keys = cohorts.get(cohort)
            if keys is None:
                keys = cohorts[cohort] = {}
            key = (rec[4], stype)
            b = ts // width
            st = keys.get(key)
            if st is None:
                keys[key] = st = [0.0, ts, ts, len(keys_table), b, 0, 0.0, 0.0, ts, None]
                keys_table.append((cohort, rec[4], stype))
            h = hl_cache.get(stype)
            if h is None:
                h = hl_cache[stype] = self._hl(stype)
            x = (ts - st[1]) / h
            if x > RENORMALIZE_AT:
                self._renormalize(st, ts, h)
                x = 0.0
            wf = w * 2.0**x
            st[0] += wf
            if ts > st[2]:
                st[2] = ts
            if b == st[4]:
                st[5] += 1
                st[6] += w
                st[7] += wf
                if ts > st[8]:
                    st[8] = ts
            else:
                self._add_other_bucket(st, b, w, wf, ts)
            dk(st[3])
            dt(ts)
            dw(w)
            du(rec[2])
            dm(rec[0])
            dr(rec[1])
        return range(first, len(self.dk))

    @staticmethod
    def _add_other_bucket(st: list, b: int, w: float, wf: float, ts: int) -> None:  # type: ignore[type-arg]
        older = st[9]
        if b > st[4]:
            if st[5]:  # the inline bucket moves to ``older``; the new one is inline
                if older is None:
                    older = st[9] = {}
                older[st[4]] = [st[5], st[6], st[7], st[8]]
            st[4], st[5], st[6], st[7], st[8] = b, 1, w, wf, ts
            return
        if older is None:
            older = st[9] = {}
        bk = older.get(b)
        if bk is None:
            older[b] = [1, w, wf, ts]
        else:
            bk[0] += 1
            bk[1] += w
            bk[2] += wf
            if ts > bk[3]:
                bk[3] = ts

    @staticmethod
    def _renormalize(st: list, new_landmark: int, h: int) -> None:  # type: ignore[type-arg]
        factor = 2.0 ** ((st[1] - new_landmark) / h)
        st[0] *= factor
        st[7] *= factor
        if st[9]:
            for bk in st[9].values():
                bk[2] *= factor
        st[1] = new_landmark

    def install_cohort(self, cohort: str, keys: dict[tuple[int, int], list]) -> None:  # type: ignore[type-arg]
        """Replace a cohort's key states (re-materialization); empty removes it."""
        if keys:
            self.cohorts[cohort] = keys
        else:
            self.cohorts.pop(cohort, None)

    def row(self, row: int) -> tuple[str, int, int, float, int]:
        """``(cohort, entity, type, weight, ts)`` of a detail row."""
        cohort, entity, stype = self.keys[self.dk[row]]
        return cohort, entity, stype, float(self.dw[row]), self.dt[row]

    def erase_row(self, row: int) -> None:
        """Mark a row retracted and zero its fields (the aggregates are not touched)."""
        self.dk[row] = DEAD
        self.dt[row] = 0
        self.dw[row] = 0.0
        self.du[row] = 0
        self.dr[row] = -1

    def retract_row(self, row: int) -> bool:
        """Retract the contribution of a detail row (once); False if already retracted.

        A bucket whose count reaches 0 is emptied, a key with no contribution left
        is dropped, and ``S`` is re-derived from the remaining buckets, so
        retracting everything leaves exactly nothing (never a negative residue).
        The row is erased.
        """
        k = self.dk[row]
        if k == DEAD:
            return False
        cohort, entity, stype = self.keys[k]
        w, ts = float(self.dw[row]), self.dt[row]
        self.erase_row(row)
        keys = self.cohorts.get(cohort)
        st = keys.get((entity, stype)) if keys else None
        if st is None:
            return False
        wf = w * 2.0 ** ((ts - st[1]) / self.half_life(stype))
        b = ts // self._width
        if b == st[4] and st[5]:
            st[5] -= 1
            if st[5] == 0:
                st[6] = st[7] = 0.0
            else:
                st[6] -= w
                st[7] -= wf
        else:
            older = st[9]
            bk = older.get(b) if older else None
            if bk is None:
                return False
            bk[0] -= 1
            if bk[0] == 0:
                del older[b]
            else:
                bk[1] -= w
                bk[2] -= wf
        if not st[5] and not st[9]:
            del keys[(entity, stype)]  # type: ignore[index]
            if not keys:
                del self.cohorts[cohort]
            return True
        st[0] = math.fsum(bk[3] for bk in iter_buckets(st))
        return True

    def _detail(self, key_id: int, t_lo: int, t_hi: int) -> list[tuple[int, float]]:
        """``(ts, w)`` of live rows of a key with ``t_lo <= ts <= t_hi``."""
        dk = np.frombuffer(self.dk, dtype=np.uint32)
        dt = np.frombuffer(self.dt, dtype=np.int64)
        idx = np.nonzero((dk == key_id) & (dt >= t_lo) & (dt <= t_hi))[0]
        return [(int(dt[i]), float(self.dw[i])) for i in idx]

    # -- reads ----------------------------------------------------------------------

    def _score(self, stype: int, st: list, at: int) -> float:  # type: ignore[type-arg]
        h = self.half_life(stype)
        if at >= st[2]:
            s = st[0] * 2.0 ** (-(at - st[1]) / h)
            return s if s > 0.0 else 0.0
        bat = at // self._width
        parts = []
        partial = False
        for b, _n, _w, fd, tm in iter_buckets(st):
            if b < bat or (b == bat and tm <= at):
                parts.append(fd)
            elif b == bat:
                partial = True
        s = math.fsum(parts) * 2.0 ** (-(at - st[1]) / h) if parts else 0.0
        if partial:
            recs = self._detail(st[3], bat * self._width, at)
            s += math.fsum(w * 2.0 ** (-(at - t) / h) for t, w in recs)
        return s if s > 0.0 else 0.0

    def decay_score(self, cohort: str, entity: int, stype: int, at: int) -> float:
        """Decayed score of a key at ``at`` (ns); 0.0 for a key with no contribution."""
        keys = self.cohorts.get(cohort)
        st = keys.get((entity, stype)) if keys else None
        return 0.0 if st is None else self._score(stype, st, at)

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float]:
        """``(count, weight_sum)`` over buckets ``b(at)-n+1 .. b(at)``."""
        keys = self.cohorts.get(cohort)
        st = keys.get((entity, stype)) if keys else None
        return (0, 0.0) if st is None else self._window(st, at)

    def _window(self, st: list, at: int) -> tuple[int, float]:  # type: ignore[type-arg]
        hi = at // self._width
        lo = hi - self._n + 1
        count = 0
        ws = []
        for b, n, w, _fd, _tm in iter_buckets(st):
            if lo <= b <= hi:
                count += n
                ws.append(w)
        w = math.fsum(ws)
        return count, (w if w > 0.0 else 0.0)

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]]:
        """The ``k`` entities of ``stype`` with the highest score > 0 at ``at``.

        Sorted by score descending, ties by entity_id ascending.
        """
        keys = self.cohorts.get(cohort)
        if not keys:
            return []
        scored = ((self._score(stype, st, at), key[0]) for key, st in keys.items() if key[1] == stype)
        best = heapq.nsmallest(k, ((-s, e) for s, e in scored if s > 0.0))
        return [(e, -neg) for neg, e in best]

    def rows(self, at: int) -> Iterable[tuple[str, int, int, float, int, float]]:
        """Every key: ``(cohort, entity, type, decay_score, window_count, window_weight)``."""
        for cohort, keys in self.cohorts.items():
            for key, st in keys.items():
                c, w = self._window(st, at)
                yield cohort, key[0], key[1], self._score(key[1], st, at), c, w

    def key_count(self) -> int:
        """Number of live keys over all cohorts."""
        return sum(len(k) for k in self.cohorts.values())
