"""Domain core: retracting contributions from a shard's aggregates (a purge's apply).

Retraction is the exact inverse of an add (forward decay: every contribution's term
is independent of the others and of time), done column-wise; a key whose remaining
sums may carry amplified rounding is summed again from its detail rows (`_refold`).
No threads, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import sub, truediv

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets
from tidal_actors.core.key_state import DEAD, KeyState
from tidal_actors.core.reads import pow2

__all__ = ["REFOLD_AT", "Retraction"]

# a key whose worst bucket's rounding error may exceed 2**(REFOLD_AT - 53) of its value
# (4.7e-10 at 22) is summed again from its detail rows (`Aggregates.retract_rows`)
REFOLD_AT = 22.0


def _gain(
    before: npt.NDArray[np.float64], after: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """log2(before / after) of subtractions on non-negative sums: how much each
    amplified the relative rounding error; inf when ``after`` is 0 or less and
    ``before`` was not (total cancellation), 0 when nothing was there."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.log2(before / after)
    g = np.where(after > 0.0, g, np.inf)
    return np.where(before > 0.0, np.maximum(g, 0.0), 0.0)


def _gain1(before: float, after: float) -> float:
    """`_gain` of one subtraction."""
    if before <= 0.0:
        return 0.0
    return math.log2(before / after) if after > 0.0 else math.inf


class Retraction(KeyState):
    """Retracting detail rows (`retract_rows`) and re-summing keys (`_refold`)."""

    __slots__ = ()

    def retract_rows(self, rows: Sequence[int]) -> int:
        """Retract the contributions of detail rows (each once), column-wise: a purge's
        apply. Returns the number of rows retracted (not already retracted).

        The latest buckets' counts and sums are decremented with ``np.subtract.at``
        (sequential, in row order), an earlier bucket one by one; a bucket whose count
        reaches 0 is emptied, a key with none left is dropped, and each touched key's
        ``fd_sum`` is re-derived from its remaining buckets (``math.fsum``), so retracting
        everything leaves exactly nothing. The rows are erased.

        Exactness (a purge leaves what a fresh fold of the remaining contributions
        gives, to 1e-9 relative, for any float32 weights). A bucket summed from ``n``
        non-negative terms is within ``n * u`` (``u = 2**-53``) of exact, relative to
        the largest value it held (Higham, "Accuracy and Stability of Numerical
        Algorithms", 2nd ed., section 4.2). A subtraction that leaves ``after`` of
        ``before`` multiplies that relative error by ``before / after``; ``rounding_amp[k]``
        sums the log2 of the largest such factor of each retraction on the key. When
        ``rounding_amp[k] + log2(n)`` of a touched bucket passes ``REFOLD_AT`` (the error could
        pass ``2**(REFOLD_AT - 53)``), or a bucket with contributions left reads 0 or
        less (total cancellation), the key is summed again from its detail rows
        (`_refold`, which resets ``rounding_amp``). Adds amplify nothing, so signals never
        trigger it; a purge of contributions that dwarf the rest does.
        """
        if not len(rows):
            return 0
        r = np.asarray(rows, dtype=np.int64) - self.row_base
        if len(r) and int(r.min()) < 0:
            raise ValueError(
                f"detail row {int(r.min()) + self.row_base} was settled (held from {self.row_base})"
            )
        dk = self.view("row_key")
        k = dk[r].astype(np.int64)
        r, k = r[k != DEAD], k[k != DEAD]
        if not len(r):
            del dk
            return 0
        r, first = sets.unique(r, index=True)  # a row listed twice counts once
        k = k[first]
        order = np.argsort(first, kind="stable")  # back to the rows' order
        r, k = r[order], k[order]
        dt = self.view("row_ts")
        dw = self.view("row_weight")
        ts = dt[r].copy()
        w = dw[r].astype(np.float64)
        dk[r] = DEAD  # erase the rows (as erase_row)
        dt[r] = 0
        dw[r] = 0.0
        self.view("row_user")[r] = 0  # views: ``r`` counts from row_base, not phys_base
        self.view("row_rseq")[r] = -1
        del dk, dt, dw  # no buffer export may outlive the call (the arrays grow)
        done = len(r)
        live = self.live[k] != 0
        k, ts, w = k[live], ts[live], w[live]
        if not len(k):
            return done
        # Python int division, as _add_one (exact below 2**53, then correctly rounded)
        x = list(
            map(
                truediv,
                map(sub, ts.tolist(), self.landmark[k].tolist()),
                self.key_half_life[k].tolist(),
            )
        )
        wf = w * np.array(pow2(x), dtype=np.float64)
        b = ts // self._width
        cur = (b == self.latest_b[k]) & (self.latest_count[k] > 0)
        kc = k[cur]
        uk = np.sort(kc)  # the distinct keys (np.unique would import numpy.ma on first use)
        uk = uk[np.r_[True, uk[1:] != uk[:-1]]] if len(uk) else uk
        before_w, before_fd, before_n = (
            self.latest_wsum[uk],
            self.latest_fd[uk],
            self.latest_count[uk],
        )  # copies
        np.subtract.at(self.latest_count, kc, 1)
        np.subtract.at(self.latest_wsum, kc, w[cur])
        np.subtract.at(self.latest_fd, kc, wf[cur])
        emptied = kc[self.latest_count[kc] == 0]
        self.latest_wsum[emptied] = 0.0
        self.latest_fd[emptied] = 0.0
        left = self.latest_count[uk] > 0
        gain = np.maximum(
            _gain(before_w, self.latest_wsum[uk]), _gain(before_fd, self.latest_fd[uk])
        )
        # per key: (largest amplification, and log2 of the most terms, of its buckets)
        worst: dict[int, tuple[float, float]] = dict(
            zip(
                uk.tolist(),
                zip(np.where(left, gain, 0.0).tolist(), np.log2(np.maximum(before_n, 1)).tolist()),
            )
        )
        old = ~cur
        if old.any():
            for kk, bb, ww, ff in zip(
                k[old].tolist(), b[old].tolist(), w[old].tolist(), wf[old].tolist()
            ):
                bk = self.older.get(kk, bb)
                if bk is None:
                    continue  # nothing to take the row from
                if bk[0] == 1:
                    self.older.remove(kk, bb)
                    g = 0.0
                else:
                    nb = (bk[0] - 1, bk[1] - ww, bk[2] - ff, bk[3])
                    self.older.put(kk, bb, nb)
                    g = max(_gain1(bk[1], nb[1]), _gain1(bk[2], nb[2]))
                g0, n0 = worst.get(kk, (0.0, 0.0))
                worst[kk] = (max(g0, g), max(n0, math.log2(bk[0])))
        refold, empty = [], []
        for kk, (g, logn) in worst.items():
            if not self.latest_count[kk] and kk not in self.older:
                empty.append(kk)
                continue
            amp = float(self.rounding_amp[kk]) + g
            if amp + logn > REFOLD_AT:
                refold.append(kk)
            else:
                self.rounding_amp[kk] = amp
                self.fd_sum[kk] = math.fsum(bk[3] for bk in self._buckets(kk))
        self._drop_keys(empty)
        if refold:
            self._refold(refold)
        return done

    def retract_row(self, row: int) -> bool:
        """`retract_rows` of one row; False if it was retracted already."""
        return self.retract_rows([row]) == 1

    def _refold(self, ks: list[int]) -> None:
        """Sum keys ``ks`` again from their held detail rows and settled buckets: each
        bucket's count, weight and forward-decayed sums with ``math.fsum``
        (correctly rounded over the rows; a settled bucket enters as its sums), ``fd_sum``
        the same over every term, ``t_max`` their latest timestamp; ``rounding_amp`` reset. The
        landmark stays, unless a purged contribution had moved it past every
        remaining one: then it comes back to the latest remaining. A scan of the held
        detail rows, so only for the rare key whose retractions cancelled
        (`retract_rows`)."""
        dk = self.view("row_key")
        rows = np.flatnonzero(sets.isin(dk, np.array(ks, dtype=np.uint32)))
        kr = dk[rows].astype(np.int64)
        ts_all = self.view("row_ts")[rows].tolist()
        w_all = self.view("row_weight")[rows].astype(np.float64).tolist()
        del dk
        by_key: dict[int, list[int]] = {kk: [] for kk in ks}
        for i, kk in enumerate(kr.tolist()):
            by_key[kk].append(i)
        width = self._width
        settled = self.settled.of_keys(ks)
        for kk, idx in by_key.items():
            st = settled.get(kk, [])
            if not idx and not st:
                self._drop_keys([kk])
                continue
            h = int(self.key_half_life[kk])
            # a purged contribution may have moved the landmark past every remaining
            # one: bring it back to the latest remaining (reads at or after the key's
            # latest contribution scale from the landmark, which must not lie after it)
            latest_ts = max([ts_all[i] for i in idx] + [e[5] for e in st])
            landmark = min(int(self.landmark[kk]), latest_ts)
            self.landmark[kk] = landmark
            # bucket -> (count, weights, forward-decayed terms, latest timestamp)
            buckets: dict[int, tuple[int, list[float], list[float], int]] = {}
            every: list[float] = []
            for bb, n, sw, sf, _lo, hi in st:
                f = sf * 2.0 ** ((hi - landmark) / h)
                every.append(f)
                buckets[bb] = (n, [sw], [f], hi)
            for i in idx:
                t, w = ts_all[i], w_all[i]
                wf = w * 2.0 ** ((t - landmark) / h)
                every.append(wf)
                n, ws, fs, tm = buckets.get(t // width, (0, [], [], t))
                ws.append(w)
                fs.append(wf)
                buckets[t // width] = (n + 1, ws, fs, max(tm, t))
            latest = max(buckets)
            older: dict[int, tuple[int, float, float, int]] = {}
            for bb, (n, ws, fs, tm) in sorted(buckets.items()):
                if bb != latest:
                    older[bb] = (n, math.fsum(ws), math.fsum(fs), tm)
            n, ws, fs, tm = buckets[latest]
            (
                self.latest_b[kk],
                self.latest_count[kk],
                self.latest_wsum[kk],
                self.latest_fd[kk],
                self.latest_t_max[kk],
            ) = (
                latest,
                n,
                math.fsum(ws),
                math.fsum(fs),
                tm,
            )
            self.fd_sum[kk] = math.fsum(every)
            self.t_max[kk] = latest_ts
            self.rounding_amp[kk] = 0.0
            self.older.replace(kk, older)
