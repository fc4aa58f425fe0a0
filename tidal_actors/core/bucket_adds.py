"""Domain core: adding contributions record by record, and the bucket moves.

The sequential definition of an add (`_add_one`: a key's forward-decayed sum, its
latest bucket or an older one, a landmark move when it falls ``RENORMALIZE_AT``
half-lives behind, `_renormalize`), used by `Adds.add_columns` for what its
vectorized path leaves: the bulk move of keys to a newer bucket (`_add_newer`) and
small batches, where numpy's fixed cost a call outweighs a loop (`_add_small`:
``SMALL_BATCH`` records or fewer). Equal to `Adds.add_columns` on the same records
(the property tests of ``tests/test_columnar_ledger.py``). No threads, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tidal_actors.core import sets
from tidal_actors.core.key_state import RENORMALIZE_AT, KeyCode, KeyState, key_code

__all__ = ["SMALL_BATCH", "BucketAdds"]

# batches of at most this many records go one record at a time (`_add_small`): about
# 30 numpy calls a vectorized batch cost more than a loop over so few
SMALL_BATCH = 8


class BucketAdds(KeyState):
    """Adding one record at a time, bucket moves in bulk, and small batches."""

    __slots__ = ()

    def _add_small(
        self,
        ms: int | Sequence[int],
        rs: Sequence[int],
        us: Sequence[int],
        cs: Sequence[str],
        es: Sequence[int],
        types: Sequence[int],
        ws: Sequence[float],
        tss: Sequence[int],
    ) -> range:
        """`Adds.add_columns` of a few records (plain lists), one by one: a new key
        made as `Adds._new_keys` makes it (its landmark and buckets at its first
        record), then `_add_one`."""
        first = self.row_end
        index = self.index
        ks: list[int] = []
        for c, e, t, ts in zip(cs, es, types, tss):
            code = key_code(self._cohort_id(c), e, t)
            k = index.get(code)
            if k is None:
                k = self._new_key(code, c, e, t, ts)
            ks.append(k)
        add = self._add_one
        for k, ts, w in zip(ks, tss, ws):
            add(k, ts, w)
        n = len(ks)
        self.row_key.extend(ks)
        self.row_ts.extend(tss)
        self.row_weight.extend(ws)
        self.row_user.extend(us)
        self.row_mshard.extend([ms] * n if isinstance(ms, int) else ms)
        self.row_rseq.extend(rs)
        return range(first, first + n)

    def _new_key(self, code: KeyCode, cohort: str, entity: int, stype: int, ts: int) -> int:
        """A new key's id (``code`` its `key_code`), its columns set as of its first
        contribution at ``ts``."""
        k = self._nkeys
        self._nkeys = k + 1
        self.index[code] = k
        self._reserve(k + 1)
        self.key_cohort[k] = self._cohort_id(cohort)
        self.cohorts[cohort] = self.cohorts.get(cohort, 0) + 1
        self.key_entity[k] = entity
        self.key_type[k] = stype
        self.key_half_life[k] = self.half_life(stype)
        self.landmark[k] = ts
        self.t_max[k] = ts
        self.latest_t_max[k] = ts
        self.latest_b[k] = ts // self._width
        self.live[k] = 1
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
        """Add one contribution to key ``k`` (a newer or older bucket, or a landmark move)."""
        h = int(self.key_half_life[k])
        x = (ts - int(self.landmark[k])) / h
        if x > RENORMALIZE_AT:
            self._renormalize(k, ts, h)
            x = 0.0
        wf = w * 2.0**x
        self.fd_sum[k] += wf
        if ts > self.t_max[k]:
            self.t_max[k] = ts
        b = ts // self._width
        cb = int(self.latest_b[k])
        if b == cb:
            self.latest_count[k] += 1
            self.latest_wsum[k] += w
            self.latest_fd[k] += wf
            if ts > self.latest_t_max[k]:
                self.latest_t_max[k] = ts
        elif b > cb:  # the latest bucket moves to ``older``; the new one is the latest
            cn = int(self.latest_count[k])
            if cn:
                self.older.put(
                    k,
                    cb,
                    (
                        cn,
                        float(self.latest_wsum[k]),
                        float(self.latest_fd[k]),
                        int(self.latest_t_max[k]),
                    ),
                )
            self.latest_b[k] = b
            self.latest_count[k] = 1
            self.latest_wsum[k] = w
            self.latest_fd[k] = wf
            self.latest_t_max[k] = ts
        else:
            bk = self.older.get(k, b)
            if bk is None:
                self.older.put(k, b, (1, w, wf, ts))
            else:
                self.older.put(
                    k, b, (bk[0] + 1, bk[1] + w, bk[2] + wf, ts if ts > bk[3] else bk[3])
                )

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
