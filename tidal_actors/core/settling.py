"""Domain core: settling detail rows into per-(key, bucket) sums (bounded memory).

A shard keeps one detail row per contribution only while a purge may still name it;
`Settling.settle` drops the rows before a given row and keeps what later reads and
re-sums need of them in the settled layer (`SettledBuckets`). No threads, no I/O.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets
from tidal_actors.core.key_state import DEAD, DETAIL_COLUMNS, KeyState

__all__ = ["Settling"]


class Settling(KeyState):
    """Settling detail rows (`settle`)."""

    __slots__ = ()

    def settle(self, upto: int, keep: npt.NDArray[np.bool_] | None = None) -> int:
        """Drop the detail rows before row ``upto``, keeping their sums (bounded memory).

        Their contributions stay in the keys' state; what a later exact re-sum
        (`_refold`) or a read inside one of their buckets (`_past_terms`) needs of
        them is kept per (key, bucket) in `settled`: count, weight sum,
        sum decayed to its latest timestamp, first and last timestamp.
        The caller settles only rows no purge can name any more (out of the
        contribution log, not held, durable in the history when there is one).
        ``keep`` (one bool per row dropped) says whose sums to keep, default every
        unretracted row's (a re-materialization's scratch keeps those its shard has
        settled). Returns how many rows were dropped.
        """
        cut = min(upto, self.row_end) - self.row_base
        if cut <= 0:
            return 0
        dk = self.view("row_key")[:cut].astype(np.int64)
        dm = self.view("row_mshard")[:cut]
        dr = self.view("row_rseq")[:cut]
        alive = dk != DEAD
        upto_m = self.settled_upto
        for m in sets.unique(dm[alive]).tolist():
            next_rseq = int(dr[alive & (dm == m)].max()) + 1
            if next_rseq > upto_m.get(m, 0):
                upto_m[m] = next_rseq
        if keep is not None:
            alive &= keep[:cut]
        k = dk[alive]
        live = self.live[k] != 0
        k = k[live]
        if len(k):
            t = self.view("row_ts")[:cut][alive][live]
            w = self.view("row_weight")[:cut][alive][live].astype(np.float64)
            b = t // self._width
            order = np.lexsort((b, k))
            k, b, t, w = k[order], b[order], t[order], w[order]
            starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (b[1:] != b[:-1])])
            counts = np.diff(np.r_[starts, len(k)])
            hi = np.maximum.reduceat(t, starts)
            h = self.key_half_life[k[starts]]
            # decayed to the group's latest timestamp: every factor <= 1, no overflow
            fd = w * np.exp2((t - np.repeat(hi, counts)) / np.repeat(h, counts))
            self.settled.add(
                k[starts].tolist(),
                b[starts].tolist(),
                counts.tolist(),
                np.add.reduceat(w, starts).tolist(),
                np.add.reduceat(fd, starts).tolist(),
                np.minimum.reduceat(t, starts).tolist(),
                hi.tolist(),
                h.tolist(),
            )
        del dk, dm, dr
        self.row_base += cut
        dead = self.row_base - self.phys_base
        if dead * 2 >= len(self.row_key):  # cut the settled front once it is half
            for name in DETAIL_COLUMNS:
                del getattr(self, name)[:dead]
            self.phys_base = self.row_base
        return cut
