"""Domain core: adding contributions to a shard's aggregates (forward decay, buckets).

Adding is the write side of `Aggregates` (see its theory of operation): a batch of
contributions is added to each key's forward-decayed sum and latest bucket with a few
vectorized operations, the rest (a newer or earlier bucket, a landmark move) one by
one; a landmark moves when it falls ``RENORMALIZE_AT`` half-lives behind. No threads,
no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from operator import is_
from typing import Any

import numpy as np

from tidal_actors.core import sets
from tidal_actors.core.key_codes import narrow_codes
from tidal_actors.core.key_state import RENORMALIZE_AT, KeyCode, key_codes
from tidal_actors.core.record_adds import RecordAdds

__all__ = ["Adds", "Record"]

Record = tuple[int, int, int, str, int, int, float, int]  # LogRecord-shaped


def _plain(x: Sequence[Any] | np.ndarray) -> list[Any]:
    """A column as a list of Python numbers (a list as it is: it is only read)."""
    if type(x) is list:
        return x
    return x.tolist() if isinstance(x, np.ndarray) else list(x)


class Adds(RecordAdds):
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
        if n <= self.small_batch:
            return self._add_small(
                ms if isinstance(ms, int) else _plain(ms),
                _plain(rs),
                _plain(us),
                cs,
                _plain(es),
                _plain(types),
                _plain(ws),
                _plain(tss),
            )
        cids = self.cohort_ids_of(cs)
        c = np.array(cids, dtype=np.int64)
        e = np.asarray(es, dtype=np.uint64)
        t = np.asarray(types, dtype=np.uint64)
        ts = np.asarray(tss, dtype=np.int64)
        codes, narrow = narrow_codes(c, e, t)
        if narrow.all():  # the usual case: every code an int, looked up and filed by numpy
            k = self.index.find(codes)
            miss = k < 0
            if miss.any():
                self._new_narrow_keys(k, miss, codes, c, e, t, ts)
        else:
            k = self.index.find_keys(c, e, t)
            if (k < 0).any():
                kids: list[int | None] = [None if x < 0 else x for x in k.tolist()]
                self._new_keys(kids, key_codes(c, e, t), cids, es, types, tss)
                k = np.array(kids, dtype=np.int64)
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
        ue, einv = sets.unique(es, inverse=True)
        ut, tinv = sets.unique(types, inverse=True)
        if len(names) * len(ut) * len(ue) < 2**62:
            code = (cids * len(ut) + tinv) * len(ue) + einv
            _, first, inv = sets.unique(code, index=True, inverse=True)
        else:
            _, first, inv = np.unique(
                np.stack([cids, tinv, einv], axis=1),
                axis=0,
                return_index=True,
                return_inverse=True,
            )
        inv = inv.reshape(-1)
        g = len(first)
        by_first = np.argsort(first, kind="stable")
        rank = np.empty(g, dtype=np.int64)
        rank[by_first] = np.arange(g, dtype=np.int64)
        kid = rank[inv]
        fk = first[by_first]  # each key id's first record
        kc, ke, kt = cids[fk], np.asarray(es)[fk], np.asarray(types)[fk]
        per_cohort = np.bincount(kc, minlength=len(names))
        lut = np.zeros(len(names), dtype=np.int32)
        uc, ufirst = sets.unique(kc, index=True)
        for c in uc[np.argsort(ufirst)].tolist():  # ids in order of first key, as adds give
            lut[c] = self._cohort_id(names[c])
            self.cohorts[names[c]] = self.cohorts.get(names[c], 0) + int(per_cohort[c])
        self.index.update_keys(lut[kc], ke, kt, np.arange(g, dtype=np.int64))
        self._nkeys = g
        self._reserve(g)
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
            self.older.load_sorted(
                ko[starts],
                {"b": bo[starts], "count": counts, "wsum": wsum, "fd": fsum, "tmax": tmax},
            )
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

    def _new_narrow_keys(
        self,
        k: np.ndarray,
        miss: np.ndarray,
        codes: np.ndarray,
        c: np.ndarray,
        e: np.ndarray,
        t: np.ndarray,
        ts: np.ndarray,
    ) -> None:
        """`_new_keys` of a batch whose codes are all narrow, with numpy: ``k`` (int64
        key ids, -1 where ``miss``) gets the new ids in place. The ids, the columns and
        the cohorts' key counts are those `_new_keys` gives (ids in order of first
        appearance; a key's columns from its first contribution)."""
        where = np.flatnonzero(miss)
        distinct, first_pos, inv = sets.unique(codes[where], index=True, inverse=True)
        by_first = np.argsort(first_pos, kind="stable")
        g = len(distinct)
        rank = np.empty(g, dtype=np.int64)
        rank[by_first] = np.arange(g, dtype=np.int64)
        first = self._nkeys
        last = first + g
        k[where] = first + rank[inv]
        at = where[first_pos[by_first]]  # each new key's first contribution, in id order
        self.index.update_narrow(distinct[by_first], np.arange(first, last, dtype=np.int64), True)
        self._nkeys = last
        self._reserve(last)
        new_c = c[at]
        per_cid, cid_first, per = sets.unique(new_c, index=True, counts=True)
        names = self.cohort_names
        for i in np.argsort(cid_first, kind="stable").tolist():  # in order of first key
            name = names[int(per_cid[i])]
            self.cohorts[name] = self.cohorts.get(name, 0) + int(per[i])
        new_t = t[at]
        ut, tinv = sets.unique(new_t, inverse=True)
        hl = np.array([self.half_life(x) for x in ut.tolist()], dtype=np.int64)
        nt = ts[at]
        self.key_cohort[first:last] = new_c
        self.key_entity[first:last] = e[at]
        self.key_type[first:last] = new_t
        self.key_half_life[first:last] = hl[tinv]
        self.landmark[first:last] = nt
        self.t_max[first:last] = nt
        self.latest_t_max[first:last] = nt
        self.latest_b[first:last] = nt // self._width
        self.live[first:last] = 1

    def _new_keys(
        self,
        kids: list[int | None],
        codes: list[KeyCode],
        cids: list[int],
        es: Sequence[int] | np.ndarray,
        types: Sequence[int] | np.ndarray,
        tss: Sequence[int] | np.ndarray,
    ) -> None:
        """Give ids to the keys not seen yet (``None`` in ``kids``; ``codes`` their
        `key_code`), columns set in bulk."""
        index = self.index
        first = self._nkeys
        # all at C speed (or numpy): the missing keys and their positions, each new key once (in
        # order of first appearance) with the position of its first contribution
        missing = list(map(is_, kids, repeat(None)))
        where = list(compress(range(len(kids)), missing))
        absent = list(compress(codes, missing))
        new = list(dict.fromkeys(absent))
        earliest = dict(zip(reversed(absent), reversed(where)))
        at = list(map(earliest.__getitem__, new))  # position of each new key's first contribution
        last = first + len(new)
        index.update_ids(new, first)
        self._nkeys = last
        new_id = dict(zip(new, range(first, last)))
        for i, kid in zip(where, map(new_id.__getitem__, absent)):
            kids[i] = kid
        self._reserve(last)
        new_cids = list(map(cids.__getitem__, at))
        names = self.cohort_names
        for c, m in Counter(new_cids).items():
            name = names[c]
            self.cohorts[name] = self.cohorts.get(name, 0) + m
        pos = np.array(at, dtype=np.int64)
        new_types = np.asarray(types, dtype=np.uint64)[pos]
        nt = np.asarray(tss, dtype=np.int64)[pos]
        self.key_cohort[first:last] = new_cids
        self.key_entity[first:last] = np.asarray(es, dtype=np.uint64)[pos]
        self.key_type[first:last] = new_types
        self.key_half_life[first:last] = list(map(self.half_life, new_types.tolist()))
        self.landmark[first:last] = nt
        self.t_max[first:last] = nt
        self.latest_t_max[first:last] = nt
        self.latest_b[first:last] = nt // self._width
        self.live[first:last] = 1
