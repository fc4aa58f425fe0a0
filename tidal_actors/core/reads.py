"""Domain core: reading a shard's aggregates (decayed scores, windows, top-k).

The read side of `Aggregates` (see its theory of operation): a point read of one key
(`decay_score`, `window`), and reads of many keys (`top`, `rows`) that compute the
same numbers, bit for bit, on columns. No threads, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_state import RENORMALIZE_AT, KeyState

__all__ = ["Reads", "pow2"]

_EXACT = 2**53  # int64 -> float64 is exact below this


def pow2(xs: Sequence[float]) -> list[float]:
    """``2.0 ** x`` for each x, with Python's float power (as the one-key reads use)."""
    return list(map(pow, repeat(2.0), xs))


class Reads(KeyState):
    """Reads of decayed scores and windows."""

    __slots__ = ()

    def _past_terms(self, k: int, t_lo: int, at: int, h: int) -> list[float]:
        """``w * 2 ** (-(at - t) / h)`` of key ``k``'s contributions with
        ``t_lo <= t <= at`` (``t_lo`` a bucket's start): held rows one by one; a
        settled bucket inside the range as its sum; a settled bucket the read time
        falls inside, from the durable history (`settled_detail`) or, in an
        ephemeral database, which keeps no detail of settled records, not at all
        (a contribution stamped after the read time is never counted; the settled
        ones of that bucket stamped before it are then left out too)."""
        dk = self.view("row_key")
        dt = self.view("row_ts")
        idx = np.flatnonzero((dk == k) & (dt >= t_lo) & (dt <= at))
        terms = [
            w * 2.0 ** (-(at - t) / h)
            for t, w in zip(dt[idx].tolist(), self.view("row_weight")[idx].tolist())
        ]
        del dk, dt
        width = self._width
        if t_lo > 0:  # one bucket: the read time's
            e = self.settled.get(k, t_lo // width)
            entries = [e] if e is not None else []
        else:
            entries = self.settled.of_keys([k]).get(k, [])
        for bb, _n, _sw, sf, lo, hi in entries:
            start = bb * width
            if start < t_lo or lo > at:
                continue
            if hi <= at:
                terms.append(sf * 2.0 ** (-(at - hi) / h))
            elif self.settled_detail is not None:
                terms.extend(
                    w * 2.0 ** (-(at - t) / h) for t, w in self.settled_detail(k, start, at)
                )
        return terms

    def _score(self, k: int, at: int) -> float:
        h = int(self.key_half_life[k])
        landmark = int(self.landmark[k])
        if at >= self.t_max[k]:
            s = float(self.fd_sum[k]) * 2.0 ** (-(at - landmark) / h)
            return s if s > 0.0 else 0.0
        if (landmark - at) / h > RENORMALIZE_AT:
            # read far before a landmark that has moved on: the sums scaled to it have
            # lost the old contributions' precision (and 2 ** x would overflow), so
            # sum them row by row
            s = math.fsum(self._past_terms(k, 0, at, h))
            return s if s > 0.0 else 0.0
        bat = at // self._width
        parts = []
        partial = False
        for b, _n, _w, fd, tm in self._buckets(k):
            if b < bat or (b == bat and tm <= at):
                parts.append(fd)
            elif b == bat:
                partial = True
        s = math.fsum(parts) * 2.0 ** (-(at - landmark) / h) if parts else 0.0
        if partial:
            s += math.fsum(self._past_terms(k, bat * self._width, at, h))
        return s if s > 0.0 else 0.0

    def _window(self, k: int, at: int) -> tuple[int, float]:
        hi = at // self._width
        lo = hi - self._n + 1
        count = 0
        ws = []
        for b, n, w, _fd, _tm in self._buckets(k):
            if lo <= b <= hi:
                count += n
                ws.append(w)
        w = math.fsum(ws)
        return count, (w if w > 0.0 else 0.0)

    def decay_score(self, cohort: str, entity: int, stype: int, at: int) -> float:
        """Decayed score of a key at ``at`` (ns); 0.0 for a key with no contribution."""
        k = self.key_id(cohort, entity, stype)
        return 0.0 if k is None else self._score(k, at)

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float]:
        """``(count, weight_sum)`` over buckets ``b(at)-n+1 .. b(at)``."""
        k = self.key_id(cohort, entity, stype)
        return (0, 0.0) if k is None else self._window(k, at)

    def _scores(self, ks: npt.NDArray[np.int64], at: int) -> list[float]:
        """`_score` of many keys: the ones read after their latest contribution (the
        common case) with the same arithmetic, on columns; the others one by one."""
        if not len(ks):
            return []
        diff = at - self.landmark[ks]
        easy = (self.t_max[ks] <= at) & (diff < _EXACT) & (self.key_half_life[ks] < _EXACT)
        x = np.where(easy, -diff / self.key_half_life[ks], 0.0)  # <= 0, and exact: ints below 2**53
        scores = (self.fd_sum[ks] * np.array(pow2(x.tolist()))).tolist()
        out = [s if s > 0.0 else 0.0 for s in scores]
        if not easy.all():
            for i in np.flatnonzero(~easy).tolist():
                out[i] = self._score(int(ks[i]), at)
        return out

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]]:
        """The ``k`` entities of ``stype`` with the highest score > 0 at ``at``.

        Sorted by score descending, ties by entity_id ascending.
        """
        cid = self._cid.get(cohort)
        if cid is None or cohort not in self.cohorts:
            return []
        n = self._nkeys
        ks = np.flatnonzero(
            (self.key_cohort[:n] == cid) & (self.key_type[:n] == stype) & (self.live[:n] != 0)
        )
        scores = self._scores(ks, at)
        entities = self.key_entity[ks].tolist()
        best = heapq.nsmallest(k, ((-s, e) for s, e in zip(scores, entities) if s > 0.0))
        return [(e, -neg) for neg, e in best]

    def rows(self, at: int) -> Iterable[tuple[str, int, int, float, int, float]]:
        """Every key: ``(cohort, entity, type, decay_score, window_count, window_weight)``."""
        n = self._nkeys
        ks = np.flatnonzero(self.live[:n])
        scores = self._scores(ks, at)
        hi = at // self._width
        cb = self.latest_b[ks]
        inside = (cb >= hi - self._n + 1) & (cb <= hi) & (self.latest_count[ks] > 0)
        counts = np.where(inside, self.latest_count[ks], 0).tolist()
        cw = self.latest_wsum[ks]
        weights = np.where(inside & (cw > 0.0), cw, 0.0).tolist()
        has_older = self.older.have(ks).tolist()
        names = self.cohort_names
        for i, (k, c_id, entity, stype) in enumerate(
            zip(
                ks.tolist(),
                self.key_cohort[ks].tolist(),
                self.key_entity[ks].tolist(),
                self.key_type[ks].tolist(),
            )
        ):
            if has_older[i]:
                c, w = self._window(k, at)
            else:
                c, w = counts[i], weights[i]
            yield names[c_id], entity, stype, scores[i], c, w

    def key_counts(self, at: int) -> dict[str, int]:
        """Per cohort name: how many keys hold an unretracted contribution stamped at
        or before ``at`` (those with none left out). A key whose latest contribution is
        at or before ``at`` counts at once; another counts when it has a bucket before
        ``at``'s, or a contribution of ``at``'s bucket stamped at or before ``at``,
        found as `_score` finds it (`_past_terms`: held rows, settled sums, the durable
        history of a settled bucket the read time falls inside)."""
        n = self._nkeys
        ks = np.flatnonzero(self.live[:n])
        cids = self.key_cohort[ks]
        past = self.t_max[ks] <= at
        counted = cids[past].tolist()
        counted += [
            c
            for k, c in zip(ks[~past].tolist(), cids[~past].tolist())
            if self._holds_at_or_before(k, at)
        ]
        names = self.cohort_names
        out: dict[str, int] = {}
        for c in counted:
            out[names[c]] = out.get(names[c], 0) + 1
        return out

    def _holds_at_or_before(self, k: int, at: int) -> bool:
        """Whether key ``k`` holds a contribution stamped at or before ``at``."""
        bat = at // self._width
        in_bat = False
        for b, count, _w, _fd, tm in self._buckets(k):
            if count and (b < bat or (b == bat and tm <= at)):
                return True
            in_bat = in_bat or (b == bat and count > 0)
        h = int(self.key_half_life[k])
        return in_bat and bool(self._past_terms(k, bat * self._width, at, h))
