"""Domain core: adding contributions record by record, and the bucket moves.

The sequential definition of an add (`_add_one`: a key's forward-decayed sum, its
latest bucket or an older one, a landmark move when it falls ``RENORMALIZE_AT``
half-lives behind, `_renormalize`), used for what `Adds.add_columns`'s vectorized
path leaves and by the per-record path of small batches
(`record_adds.RecordAdds`); the bulk move of keys to a newer bucket
(`_add_newer`); a key made for one record (`_new_key`). Equal to `Adds.add_columns`
on the same records (the property tests of ``tests/test_columnar_ledger.py``). No
threads, no I/O.
"""

from __future__ import annotations

import math

import numpy as np

from tidal_actors.core import sets
from tidal_actors.core.key_state import RENORMALIZE_AT, KeyCode, KeyState

__all__ = ["BucketAdds"]


class BucketAdds(KeyState):
    """Adding one record at a time, and bucket moves in bulk."""

    __slots__ = ()

    def _new_key(self, code: KeyCode, cohort: str, entity: int, stype: int, ts: int) -> int:
        """A new key's id (``code`` its `key_code`), its columns set as of its first
        contribution at ``ts``."""
        k = self._nkeys
        self._nkeys = k + 1
        self.index[code] = k
        self._reserve(k + 1)
        c = self.items  # the columns' ``array`` objects (Python numbers in and out)
        c["key_cohort"][k] = self._cohort_id(cohort)
        self.cohorts[cohort] = self.cohorts.get(cohort, 0) + 1
        c["key_entity"][k] = entity
        c["key_type"][k] = stype
        c["key_half_life"][k] = self.half_life(stype)
        c["landmark"][k] = ts
        c["t_max"][k] = ts
        c["latest_t_max"][k] = ts
        c["latest_b"][k] = ts // self._width
        c["live"][k] = 1
        return k

    def _add_newer(
        self,
        k: np.ndarray,
        b: np.ndarray,
        x: np.ndarray,
        w: np.ndarray,
        wf: np.ndarray,
        ts: np.ndarray,
        cand: np.ndarray,
    ) -> np.ndarray:
        """Add, in bulk, the records among ``cand`` (a mask) that open a key's newer
        bucket: each such key's latest bucket moves to ``older`` once, the newest
        bucket its records reach in this batch becomes its latest, and the records
        in that bucket are added to it. Returns the mask of the records added; the
        others (an earlier bucket, a landmark move) are `_add_one`'s.

        Equal to adding them one by one, in order: a key's moves in between (a batch
        crossing two buckets of it) leave the same older buckets, filled by
        `_add_one` with the records of the buckets in between."""
        newer: np.ndarray = cand & (x <= RENORMALIZE_AT) & (b > self.latest_b[k])
        if not newer.any():
            return newer
        kn, bn = k[newer], b[newer]
        keys, at = sets.unique(kn, inverse=True)
        top = np.full(len(keys), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(top, at, bn)
        counts = self.latest_count[keys]
        moving = np.flatnonzero(counts)
        if len(moving):
            mk = keys[moving]
            self.older.push_newest(
                mk,
                self.latest_b[mk],
                counts[moving],
                self.latest_wsum[mk],
                self.latest_fd[mk],
                self.latest_t_max[mk],
            )
        self.latest_b[keys] = top
        self.latest_count[keys] = 0
        self.latest_wsum[keys] = 0.0
        self.latest_fd[keys] = 0.0
        self.latest_t_max[keys] = np.iinfo(np.int64).min
        added: np.ndarray = newer.copy()
        added[newer] = bn == top[at]
        ka = k[added]
        np.add.at(self.fd_sum, ka, wf[added])
        np.add.at(self.latest_count, ka, 1)
        np.add.at(self.latest_wsum, ka, w[added])
        np.add.at(self.latest_fd, ka, wf[added])
        np.maximum.at(self.latest_t_max, ka, ts[added])
        return added

    def _add_one(self, k: int, ts: int, w: float) -> None:
        """Add one contribution to key ``k`` (a newer or older bucket, or a landmark
        move): ``ts`` an int (ns), ``w`` a float (float32-valued). Plain Python on the
        columns' ``array`` objects (`KeyState.items`: Python numbers; each sum is the
        same IEEE addition as on numpy scalars)."""
        c = self.items
        h = c["key_half_life"][k]
        x = (ts - c["landmark"][k]) / h
        if x > RENORMALIZE_AT:
            self._renormalize(k, ts, h)
            x = 0.0
        wf = w * 2.0**x
        c["fd_sum"][k] = c["fd_sum"][k] + wf
        if ts > c["t_max"][k]:
            c["t_max"][k] = ts
        b = ts // self._width
        cb = c["latest_b"][k]
        if b == cb:
            c["latest_count"][k] = c["latest_count"][k] + 1
            c["latest_wsum"][k] = c["latest_wsum"][k] + w
            c["latest_fd"][k] = c["latest_fd"][k] + wf
            if ts > c["latest_t_max"][k]:
                c["latest_t_max"][k] = ts
        elif b > cb:  # the latest bucket moves to ``older``; the new one is the latest
            cn = c["latest_count"][k]
            if cn:
                self.older.push_one(
                    k,
                    cb,
                    cn,
                    c["latest_wsum"][k],
                    c["latest_fd"][k],
                    c["latest_t_max"][k],
                )
            c["latest_b"][k] = b
            c["latest_count"][k] = 1
            c["latest_wsum"][k] = w
            c["latest_fd"][k] = wf
            c["latest_t_max"][k] = ts
        else:
            self.older.add_record(k, b, w, wf, ts)

    def _renormalize(self, k: int, new_landmark: int, h: int) -> None:
        """Move key ``k``'s landmark to ``new_landmark`` (ns), rescaling its sums.

        The rescaled sums carry the rounding of the exponent, ``d = (landmark - new) / h``:
        a contribution retracted later, computed against the new landmark, differs
        from its rescaled self by up to ``|d| * ln 2`` units in the last place, so
        ``rounding_amp`` grows by ``log2(1 + |d| ln 2)`` (see `retract_rows`)."""
        d = (int(self.landmark[k]) - new_landmark) / h
        self.rounding_amp[k] += math.log2(1.0 + abs(d) * math.log(2.0))
        factor = 2.0**d
        self.fd_sum[k] *= factor
        self.latest_fd[k] *= factor
        self.older.scale_fd(k, factor)
        self.landmark[k] = new_landmark
