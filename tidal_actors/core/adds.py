"""Domain core: adding contributions to a shard's aggregates (forward decay, buckets).

Adding is the write side of `Aggregates` (see its theory of operation): a batch of
contributions is added to each key's forward-decayed sum and latest bucket with a few
vectorized operations, the rest (a newer or earlier bucket, a landmark move) one by
one; a landmark moves when it falls ``RENORMALIZE_AT`` half-lives behind. No threads,
no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import is_

import numpy as np

from tidal_actors.core.key_state import RENORMALIZE_AT, KeyState

__all__ = ["Adds", "Record"]

Record = tuple[int, int, int, str, int, int, float, int]  # LogRecord-shaped


class Adds(KeyState):
    """Adding contributions (`add_columns`, `add_many`, `load_columns`)."""

    __slots__ = ()

    def add_many(self, records: list[Record]) -> range:
        """Add contributions (``LogRecord``-shaped tuples; weights already float32;
        ts in ns); returns their detail rows."""
        if not records:
            return range(self.row_end, self.row_end)
        return self.add_columns(*zip(*records))

    def add_columns(
        self,
        ms: int | Sequence[int],
        rs: Sequence[int] | np.ndarray,
        us: Sequence[int] | np.ndarray,
        cs: Sequence[str],
        es: Sequence[int] | np.ndarray,
        types: Sequence[int] | np.ndarray,
        ws: Sequence[float] | np.ndarray,
        tss: Sequence[int] | np.ndarray,
    ) -> range:
        """`add_many` on columns (the ledger's hot path: a membership shard's batch).

        Args:
            ms: the records' membership shard, one int for all or one per record.
            rs, us: rseqs and users (kept in the detail rows).
            cs: cohort names. es, types: entity and signal type (uint64).
            ws: weights, float32 values. tss: timestamps, int64 ns.
            Each a sequence or a numpy array, all of one length.

        Returns the new records' detail rows.
        """
        n = len(cs)
        first = self.row_end
        if not n:
            return range(first, first)
        index = self.index
        es_l = es.tolist() if isinstance(es, np.ndarray) else es
        types_l = types.tolist() if isinstance(types, np.ndarray) else types
        kids: list[int | None] = list(map(index.get, zip(cs, es_l, types_l)))
        if None in kids:
            self._new_keys(kids, cs, es_l, types_l, tss)
        k = np.array(kids, dtype=np.int64)
        ts = np.asarray(tss, dtype=np.int64)
        w = np.asarray(ws, dtype=np.float64)
        b = ts // self._width
        x = (ts - self.landmark[k]) / self.key_half_life[k]
        fast = (b == self.latest_b[k]) & (x <= RENORMALIZE_AT)
        wf = w * np.exp2(np.minimum(x, RENORMALIZE_AT))  # the others are added one by one
        every = bool(fast.all())
        if not every:
            kf, wff, wfa, tf = k[fast], wf[fast], w[fast], ts[fast]
        else:
            kf, wff, wfa, tf = k, wf, w, ts
        np.add.at(self.fd_sum, kf, wff)
        np.add.at(self.latest_count, kf, 1)
        np.add.at(self.latest_wsum, kf, wfa)
        np.add.at(self.latest_fd, kf, wff)
        np.maximum.at(self.latest_t_max, kf, tf)
        np.maximum.at(self.t_max, k, ts)
        if not every:
            rest = ~fast & ~self._add_newer(k, b, x, w, wf, ts, ~fast)
            slow = self._add_one
            for i in np.flatnonzero(rest).tolist():
                slow(int(k[i]), int(ts[i]), float(w[i]))
        self.row_key.frombytes(k.astype(np.uint32).tobytes())
        self.row_ts.frombytes(ts.tobytes())
        self.row_weight.frombytes(w.astype(np.float32).tobytes())
        self.row_user.frombytes(np.asarray(us, dtype=np.uint64).tobytes())
        self.row_mshard.frombytes(
            bytes([ms]) * n if isinstance(ms, int) else np.asarray(ms, dtype=np.uint8).tobytes()
        )
        self.row_rseq.frombytes(np.asarray(rs, dtype=np.int64).tobytes())
        return range(first, first + n)

    def load_columns(
        self,
        ms: np.ndarray,
        rs: np.ndarray,
        us: np.ndarray,
        cids: np.ndarray,
        names: Sequence[str],
        es: np.ndarray,
        types: np.ndarray,
        ws: np.ndarray,
        tss: np.ndarray,
    ) -> None:
        """Rebuild empty aggregates from a replayed history, in bulk (restore).

        Args:
            ms, rs, us: the records' membership shard (uint8), rseq (int64) and user
                (uint64), kept in the detail rows.
            cids: integer, each record's cohort as an index into ``names``.
            es, types: uint64 entity and signal type.
            ws: float32 weights.
            tss: int64 timestamps, ns.

        The records are in history order; detail row i is record i. The state equals
        `add_columns` of the same records (the same sums, each key's in the same
        order: np.bincount adds in input order), computed per key and per (key,
        bucket) with numpy instead of per record; only records that move a key's
        landmark (more than ``RENORMALIZE_AT`` half-lives after it) go one by one.

        Raises:
            ValueError: the aggregates are not empty.
        """
        if len(self.row_key) or self._nkeys:
            raise ValueError("load_columns needs empty aggregates")
        n = len(tss)
        if not n:
            return
        ts = np.asarray(tss, dtype=np.int64)
        w32 = np.asarray(ws, dtype=np.float32)
        w = w32.astype(np.float64)
        cids = np.asarray(cids, dtype=np.int64)
        # keys: (cohort, type, entity) factorized, ids in order of first appearance
        ue, einv = np.unique(es, return_inverse=True)
        ut, tinv = np.unique(types, return_inverse=True)
        if len(names) * len(ut) * len(ue) < 2**62:
            code = (cids * len(ut) + tinv) * len(ue) + einv
            _, first, inv = np.unique(code, return_index=True, return_inverse=True)
        else:
            _, first, inv = np.unique(
                np.stack([cids, tinv, einv], axis=1), axis=0, return_index=True, return_inverse=True
            )
        inv = inv.reshape(-1)
        g = len(first)
        by_first = np.argsort(first, kind="stable")
        rank = np.empty(g, dtype=np.int64)
        rank[by_first] = np.arange(g, dtype=np.int64)
        kid = rank[inv]
        fk = first[by_first]  # each key id's first record
        kc, ke, kt = cids[fk], np.asarray(es)[fk], np.asarray(types)[fk]
        keys = list(zip(map(names.__getitem__, kc.tolist()), ke.tolist(), kt.tolist()))
        self.index.update(zip(keys, range(g)))
        del keys
        self._nkeys = g
        self._reserve(g)
        per_cohort = np.bincount(kc, minlength=len(names))
        lut = np.zeros(len(names), dtype=np.int32)
        for c in np.flatnonzero(per_cohort).tolist():
            lut[c] = self._cohort_id(names[c])
            self.cohorts[names[c]] = self.cohorts.get(names[c], 0) + int(per_cohort[c])
        hl_of_type = np.array([self.half_life(t) for t in ut.tolist()], dtype=np.int64)
        self.key_cohort[:g] = lut[kc]
        self.key_entity[:g] = ke
        self.key_type[:g] = kt
        self.key_half_life[:g] = hl_of_type[tinv[fk]]
        self.landmark[:g] = ts[fk]
        self.live[:g] = 1
        # records within RENORMALIZE_AT half-lives of their key's landmark: in bulk
        x = (ts - self.landmark[kid]) / self.key_half_life[kid]
        fast = x <= RENORMALIZE_AT
        every = bool(fast.all())
        kf, tf, wa = (kid, ts, w) if every else (kid[fast], ts[fast], w[fast])
        wf = wa * np.exp2(x if every else x[fast])
        self.fd_sum[:g] = np.bincount(kf, weights=wf, minlength=g)
        tm = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(tm, kf, tf)
        self.t_max[:g] = tm
        b = tf // self._width
        cb = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(cb, kf, b)
        self.latest_b[:g] = cb
        cur = b == cb[kf]
        self.latest_count[:g] = np.bincount(kf[cur], minlength=g)
        self.latest_wsum[:g] = np.bincount(kf[cur], weights=wa[cur], minlength=g)
        self.latest_fd[:g] = np.bincount(kf[cur], weights=wf[cur], minlength=g)
        ctm = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ctm, kf[cur], tf[cur])
        self.latest_t_max[:g] = ctm
        # earlier buckets: one (n, w, fd, tmax) per (key, bucket), summed in order
        old = ~cur
        if old.any():
            ko, bo, wo, fo, to = kf[old], b[old], wa[old], wf[old], tf[old]
            order = np.lexsort((bo, ko))
            ko, bo, wo, fo, to = ko[order], bo[order], wo[order], fo[order], to[order]
            starts = np.flatnonzero(np.r_[True, (ko[1:] != ko[:-1]) | (bo[1:] != bo[:-1])])
            counts = np.diff(np.r_[starts, len(ko)])
            wsum = np.add.reduceat(wo, starts)
            fsum = np.add.reduceat(fo, starts)
            tmax = np.maximum.reduceat(to, starts)
            older = self.older
            for k, bb, cn, sw, sf, st in zip(
                ko[starts].tolist(),
                bo[starts].tolist(),
                counts.tolist(),
                wsum.tolist(),
                fsum.tolist(),
                tmax.tolist(),
            ):
                older.setdefault(k, {})[bb] = (cn, sw, sf, st)
        if not every:
            slow = self._add_one
            wl = w.tolist()
            for i in np.flatnonzero(~fast).tolist():
                slow(int(kid[i]), int(ts[i]), wl[i])
        self.row_key.frombytes(kid.astype(np.uint32).tobytes())
        self.row_ts.frombytes(ts.tobytes())
        self.row_weight.frombytes(w32.tobytes())
        self.row_user.frombytes(np.asarray(us, dtype=np.uint64).tobytes())
        self.row_mshard.frombytes(np.asarray(ms, dtype=np.uint8).tobytes())
        self.row_rseq.frombytes(np.asarray(rs, dtype=np.int64).tobytes())

    def _new_keys(
        self,
        kids: list[int | None],
        cs: Sequence[str],
        es: Sequence[int],
        types: Sequence[int],
        tss: Sequence[int] | np.ndarray,
    ) -> None:
        """Give ids to the keys not seen yet (``None`` in ``kids``), columns set in bulk."""
        index = self.index
        first = self._nkeys
        # all at C speed: the missing keys and their positions, each new key once (in
        # order of first appearance) with the position of its first contribution
        missing = list(map(is_, kids, repeat(None)))
        where = list(compress(range(len(kids)), missing))
        absent = list(compress(zip(cs, es, types), missing))
        new = list(dict.fromkeys(absent))
        earliest = dict(zip(reversed(absent), reversed(where)))
        at = list(map(earliest.__getitem__, new))  # position of each new key's first contribution
        last = first + len(new)
        index.update(zip(new, range(first, last)))
        self._nkeys = last
        for i, kid in zip(where, map(index.__getitem__, absent)):
            kids[i] = kid
        self._reserve(last)
        new_cohorts = list(map(cs.__getitem__, at))
        new_types = list(map(types.__getitem__, at))
        for c, m in Counter(new_cohorts).items():
            self._cohort_id(c)
            self.cohorts[c] = self.cohorts.get(c, 0) + m
        for t in set(new_types):
            self.half_life(t)
        nt = np.array(list(map(tss.__getitem__, at)), dtype=np.int64)
        self.key_cohort[first:last] = list(map(self._cid.__getitem__, new_cohorts))
        self.key_entity[first:last] = np.array(list(map(es.__getitem__, at)), dtype=np.uint64)
        self.key_type[first:last] = np.array(new_types, dtype=np.uint64)
        self.key_half_life[first:last] = list(map(self._hl_cache.__getitem__, new_types))
        self.landmark[first:last] = nt
        self.t_max[first:last] = nt
        self.latest_t_max[first:last] = nt
        self.latest_b[first:last] = nt // self._width
        self.live[first:last] = 1

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
        keys, at = np.unique(kn, return_inverse=True)
        top = np.full(len(keys), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(top, at, bn)
        counts = self.latest_count[keys]
        moving = np.flatnonzero(counts)
        if len(moving):
            mk = keys[moving]
            older = self.older
            get = older.get
            for key, cb, cn, cw, cf, ct in zip(
                mk.tolist(),
                self.latest_b[mk].tolist(),
                counts[moving].tolist(),
                self.latest_wsum[mk].tolist(),
                self.latest_fd[mk].tolist(),
                self.latest_t_max[mk].tolist(),
            ):
                o = get(key)
                if o is None:
                    older[key] = {cb: (cn, cw, cf, ct)}
                else:
                    o[cb] = (cn, cw, cf, ct)
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
                self.older.setdefault(k, {})[cb] = (
                    cn,
                    float(self.latest_wsum[k]),
                    float(self.latest_fd[k]),
                    int(self.latest_t_max[k]),
                )
            self.latest_b[k] = b
            self.latest_count[k] = 1
            self.latest_wsum[k] = w
            self.latest_fd[k] = wf
            self.latest_t_max[k] = ts
        else:
            older = self.older.setdefault(k, {})
            bk = older.get(b)
            if bk is None:
                older[b] = (1, w, wf, ts)
            else:
                older[b] = (bk[0] + 1, bk[1] + w, bk[2] + wf, ts if ts > bk[3] else bk[3])

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
        older = self.older.get(k)
        if older:
            for b, bk in older.items():
                older[b] = (bk[0], bk[1], bk[2] * factor, bk[3])
        self.landmark[k] = new_landmark
