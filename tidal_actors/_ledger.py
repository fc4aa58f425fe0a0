"""Domain core: cohort aggregates (forward-decayed scores and bucketed windows).

Owns the arithmetic of one ledger shard's aggregates; no threads, no I/O.

Theory of operation
-------------------
Per key ``(cohort, entity_id, signal_type)`` we keep ``[S, L, t_max, buckets]``:

* ``L`` is the key's landmark (ns) and ``S = sum(w_i * 2 ** ((t_i - L) / h))`` the
  forward-decayed sum (Cormode, Shkapenyuk, Srivastava, Xu, "Forward Decay: A
  Practical Time Decay Model for Streaming Systems", ICDE 2009). Adding and
  retracting a contribution are exact inverses and order-independent, unlike a lazily
  decayed ``(score, last_ns)`` pair. When ``(t - L) / h`` passes ``RENORMALIZE_AT``
  the landmark moves to ``t`` and every stored sum is rescaled, so nothing overflows.
* ``buckets`` maps ``b = t // width`` to ``[count, weight_sum, fd_sum, t_max_b]``,
  kept for every bucket that holds a contribution, so a window read at any time is
  exact and ``S`` is always ``sum(fd_sum)`` (re-derived with ``math.fsum`` after a
  retraction to drop rounding residue).
* Every contribution also gets a *detail row*: three parallel columns (key id,
  timestamp, weight: 16 bytes) that the contribution log points into, so the log
  holds no copy of them, and reads inside a bucket can be exact.

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

__all__ = ["DEAD", "Aggregates"]

RENORMALIZE_AT = 256.0
DEAD = 0xFFFFFFFF  # key id of a retracted detail row

_S, _L, _TMAX, _B, _K = 0, 1, 2, 3, 4


class Aggregates:
    """The decayed scores and windows of every cohort one ledger shard owns.

    Args:
        half_life_for: signal type -> half-life in ns.
        window_width_ns: bucket width in ns.
        window_buckets: number of buckets a window read covers.
    """

    __slots__ = ("_hl", "_n", "_width", "cohorts", "dk", "dt", "dw", "keys")

    def __init__(
        self, half_life_for: Callable[[int], int], window_width_ns: int, window_buckets: int
    ) -> None:
        self._hl = half_life_for
        self._width = window_width_ns
        self._n = window_buckets
        # cohort -> (entity_id, signal_type) -> [S, L, t_max, {bucket: [n, wsum, fd, tmax]}, key_id]
        self.cohorts: dict[str, dict[tuple[int, int], list]] = {}  # type: ignore[type-arg]
        self.keys: list[tuple[str, int, int]] = []  # key id -> (cohort, entity, type)
        self.dk = array("I")  # detail rows: key id (DEAD once retracted)
        self.dt = array("q")  # timestamp ns
        self.dw = array("f")  # float32 weight

    # -- writes ---------------------------------------------------------------------

    def add(self, cohort: str, entity: int, stype: int, w: float, ts: int) -> int:
        """Add one contribution (weight already float32-rounded; ts in ns); returns
        its detail row."""
        keys = self.cohorts.get(cohort)
        if keys is None:
            keys = self.cohorts[cohort] = {}
        key = (entity, stype)
        st = keys.get(key)
        if st is None:
            st = keys[key] = [0.0, ts, ts, {}, len(self.keys)]
            self.keys.append((cohort, entity, stype))
        h = self._hl(stype)
        x = (ts - st[_L]) / h
        if x > RENORMALIZE_AT:
            self._renormalize(st, ts, h)
            x = 0.0
        wf = w * 2.0**x
        st[_S] += wf
        if ts > st[_TMAX]:
            st[_TMAX] = ts
        b = ts // self._width
        bk = st[_B].get(b)
        if bk is None:
            st[_B][b] = [1, w, wf, ts]
        else:
            bk[0] += 1
            bk[1] += w
            bk[2] += wf
            if ts > bk[3]:
                bk[3] = ts
        row = len(self.dk)
        self.dk.append(st[_K])
        self.dt.append(ts)
        self.dw.append(w)
        return row

    def row(self, row: int) -> tuple[str, int, int, float, int]:
        """``(cohort, entity, type, weight, ts)`` of a detail row."""
        cohort, entity, stype = self.keys[self.dk[row]]
        return cohort, entity, stype, float(self.dw[row]), self.dt[row]

    def retract_row(self, row: int) -> bool:
        """Retract the contribution of a detail row (once); False if already retracted."""
        k = self.dk[row]
        if k == DEAD:
            return False
        cohort, entity, stype = self.keys[k]
        self.dk[row] = DEAD
        return self.retract(cohort, entity, stype, float(self.dw[row]), self.dt[row])

    def _detail(self, key_id: int, t_lo: int, t_hi: int) -> list[tuple[int, float]]:
        """``(ts, w)`` of live rows of a key with ``t_lo <= ts <= t_hi``."""
        dk = np.frombuffer(self.dk, dtype=np.uint32)
        dt = np.frombuffer(self.dt, dtype=np.int64)
        idx = np.nonzero((dk == key_id) & (dt >= t_lo) & (dt <= t_hi))[0]
        return [(int(dt[i]), float(self.dw[i])) for i in idx]

    @staticmethod
    def _renormalize(st: list, new_landmark: int, h: int) -> None:  # type: ignore[type-arg]
        factor = 2.0 ** ((st[_L] - new_landmark) / h)
        st[_S] *= factor
        for bk in st[_B].values():
            bk[2] *= factor
        st[_L] = new_landmark

    def retract(self, cohort: str, entity: int, stype: int, w: float, ts: int) -> bool:
        """Subtract one contribution added earlier; returns False if its key/bucket is gone.

        A bucket whose count reaches 0 is dropped, a key with no bucket left is
        dropped, and ``S`` is re-derived from the remaining buckets, so retracting
        everything leaves exactly nothing (never a negative residue).
        """
        keys = self.cohorts.get(cohort)
        if keys is None:
            return False
        key = (entity, stype)
        st = keys.get(key)
        if st is None:
            return False
        b = ts // self._width
        bk = st[_B].get(b)
        if bk is None or bk[0] <= 0:
            return False
        h = self._hl(stype)
        wf = w * 2.0 ** ((ts - st[_L]) / h)
        bk[0] -= 1
        if bk[0] == 0:
            del st[_B][b]
        else:
            bk[1] -= w
            bk[2] -= wf
        if not st[_B]:
            del keys[key]
            if not keys:
                del self.cohorts[cohort]
            return True
        st[_S] = math.fsum(v[2] for v in st[_B].values())
        return True

    def drop_cohort(self, cohort: str) -> dict[tuple[int, int], list] | None:  # type: ignore[type-arg]
        """Remove and return a cohort's whole state (for re-materialization)."""
        return self.cohorts.pop(cohort, None)

    def install_cohort(self, cohort: str, keys: dict[tuple[int, int], list]) -> None:  # type: ignore[type-arg]
        """Install a cohort's state built elsewhere (an ``Aggregates.cohorts`` entry)."""
        if keys:
            self.cohorts[cohort] = keys
        else:
            self.cohorts.pop(cohort, None)

    # -- reads ----------------------------------------------------------------------

    def _score(self, key: tuple[int, int], st: list, at: int) -> float:  # type: ignore[type-arg]
        h = self._hl(key[1])
        if at >= st[_TMAX]:
            s = st[_S] * 2.0 ** (-(at - st[_L]) / h)
            return max(0.0, s)
        bat = at // self._width
        parts = []
        partial = None
        for b, bk in st[_B].items():
            if b < bat or (b == bat and bk[3] <= at):
                parts.append(bk[2])
            elif b == bat:
                partial = bk
        s = math.fsum(parts) * 2.0 ** (-(at - st[_L]) / h) if parts else 0.0
        if partial is not None:
            recs = self._detail(st[_K], bat * self._width, at)
            s += math.fsum(w * 2.0 ** (-(at - t) / h) for t, w in recs)
        return max(0.0, s)

    def decay_score(self, cohort: str, entity: int, stype: int, at: int) -> float:
        """Decayed score of a key at ``at`` (ns); 0.0 for a key with no contribution."""
        keys = self.cohorts.get(cohort)
        if not keys:
            return 0.0
        st = keys.get((entity, stype))
        if st is None:
            return 0.0
        return self._score((entity, stype), st, at)

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float]:
        """``(count, weight_sum)`` over buckets ``b(at)-n+1 .. b(at)``."""
        keys = self.cohorts.get(cohort)
        st = keys.get((entity, stype)) if keys else None
        if st is None:
            return 0, 0.0
        return self._window(st, at)

    def _window(self, st: list, at: int) -> tuple[int, float]:  # type: ignore[type-arg]
        hi = at // self._width
        lo = hi - self._n + 1
        count = 0
        ws = []
        buckets = st[_B]
        if len(buckets) <= self._n:
            for b, bk in buckets.items():
                if lo <= b <= hi:
                    count += bk[0]
                    ws.append(bk[1])
        else:
            for b in range(lo, hi + 1):
                bk = buckets.get(b)
                if bk is not None:
                    count += bk[0]
                    ws.append(bk[1])
        w = math.fsum(ws)
        return count, (max(0.0, w))

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]]:
        """The ``k`` entities of ``stype`` with the highest score > 0 at ``at``.

        Sorted by score descending, ties by entity_id ascending.
        """
        keys = self.cohorts.get(cohort)
        if not keys:
            return []
        scored: Iterator[tuple[float, int]] = (
            (self._score(key, st, at), key[0])
            for key, st in keys.items()
            if key[1] == stype
        )
        best = heapq.nsmallest(k, ((-s, e) for s, e in scored if s > 0.0))
        return [(e, -neg) for neg, e in best]

    def rows(self, at: int) -> Iterable[tuple[str, int, int, float, int, float]]:
        """Every key: ``(cohort, entity, type, decay_score, window_count, window_weight)``."""
        for cohort, keys in self.cohorts.items():
            for key, st in keys.items():
                c, w = self._window(st, at)
                yield cohort, key[0], key[1], self._score(key, st, at), c, w

    def key_count(self) -> int:
        """Number of live keys over all cohorts."""
        return sum(len(k) for k in self.cohorts.values())
