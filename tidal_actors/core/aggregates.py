"""Domain core: cohort aggregates (forward-decayed scores and bucketed windows).

Owns the arithmetic of one ledger shard's aggregates; no threads, no I/O.

Theory of operation
-------------------
Every key ``(cohort, entity_id, signal_type)`` gets a *key id* ``k`` (ids are never
reused; `key(k)` names the key from the KC, KE, KT columns, ``index`` maps a live key
to its id). A key's state lives in numpy columns indexed by ``k`` (`KEY_COLUMNS`), not
in a Python object per key: a million keys cost ~93 MB of columns instead of a
million GC-tracked lists, and a batch of contributions is added with a handful of
vectorized operations.

* ``L[k]`` is the key's landmark (ns) and ``S[k] = sum(w_i * 2 ** ((t_i - L) / h))``
  the forward-decayed sum (Cormode, Shkapenyuk, Srivastava, Xu, "Forward Decay: A
  Practical Time Decay Model for Streaming Systems", ICDE 2009). Adding and
  retracting a contribution are exact inverses and order-independent, unlike a lazily
  decayed ``(score, last_ns)`` pair. When ``(t - L) / h`` passes ``RENORMALIZE_AT``
  the landmark moves to ``t`` and every stored sum is rescaled, so nothing overflows.
  ``TM[k]`` is the latest timestamp added, ``HL[k]`` the half-life of the key's type.
* Buckets ``b = t // width`` each hold ``count, weight_sum, fd_sum, t_max_b``. The
  latest bucket sits in columns (``CB, CN, CW, CFD, CTM``): most contributions land
  there. Earlier buckets are in ``older[k]`` (a dict ``b -> (count, wsum, fd, tmax)``,
  only for keys that have some). Every bucket that holds a contribution is kept, so a
  window read at any time is exact and ``S`` is always the sum of the buckets' ``fd``
  (re-derived with ``math.fsum`` after a retraction to drop rounding residue).
* Adding a batch: keys are looked up at C speed (``map(index.get, zip(...))``), new
  keys are given ids together, then every contribution that falls in its key's
  latest bucket (the common case) is added with ``np.add.at``; the others (a newer
  bucket, a late contribution, a landmark move) go one by one, after, which gives the
  same state as adding all in order.
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
Reads of many keys (``top``, ``rows``) compute the same numbers as a read of one key,
bit for bit.
"""

from __future__ import annotations

import heapq
import math
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import is_, sub, truediv
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core.settled import SettledBuckets

__all__ = ["DEAD", "KEY_COLUMNS", "Aggregates"]

RENORMALIZE_AT = 256.0
DEAD = 0xFFFFFFFF  # key id of a retracted detail row
_EXACT = 2**53  # int64 -> float64 is exact below this

Record = tuple[int, int, int, str, int, int, float, int]  # LogRecord-shaped
Bucket = tuple[int, int, float, float, int]  # (b, count, weight_sum, fd_sum, t_max_b)

KEY_COLUMNS: dict[str, Any] = {
    "S": np.float64,  # forward-decayed sum against L
    "L": np.int64,  # landmark, ns
    "TM": np.int64,  # latest timestamp added
    "CB": np.int64,  # latest bucket: index b
    "CN": np.int64,  # ... count
    "CW": np.float64,  # ... weight sum
    "CFD": np.float64,  # ... forward-decayed sum
    "CTM": np.int64,  # ... latest timestamp
    "HL": np.int64,  # half-life of the key's signal type, ns
    "KC": np.int32,  # cohort id (cohort_names[KC[k]])
    "KE": np.uint64,  # entity id
    "KT": np.uint64,  # signal type
    "LIVE": np.uint8,  # 1 while the key has a contribution
    "AMP": np.float32,  # log2 bound on how much retractions amplified rounding (`retract_rows`)
}
# a key whose worst bucket's rounding error may exceed 2**(REFOLD_AT - 53) of its value
# (4.7e-10 at 22) is summed again from its detail rows (`Aggregates.retract_rows`)
REFOLD_AT = 22.0
_DETAIL = (("dk", "I"), ("dt", "q"), ("dw", "f"), ("du", "Q"), ("dm", "B"), ("dr", "q"))
_DETAIL_DTYPES = {
    "dk": np.uint32,
    "dt": np.int64,
    "dw": np.float32,
    "du": np.uint64,
    "dm": np.uint8,
    "dr": np.int64,
}


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


def _pow2(xs: Sequence[float]) -> list[float]:
    """``2.0 ** x`` for each x, with Python's float power (as the one-key reads use)."""
    return list(map(pow, repeat(2.0), xs))


class Aggregates:
    """The decayed scores and windows of every cohort one ledger shard owns.

    Args:
        half_life_for: signal type -> half-life in ns.
        window_width_ns: bucket width in ns.
        window_buckets: number of buckets a window read covers.
    """

    __slots__ = (
        "_cap",
        "_cid",
        "_hl",
        "_hl_cache",
        "_n",
        "_nkeys",
        "_width",
        "cohort_names",
        "cohorts",
        "index",
        "older",
        "phys_base",
        "row_base",
        "settled",
        "settled_detail",
        "settled_upto",
        *KEY_COLUMNS,
        *(name for name, _ in _DETAIL),
    )

    # the per-key columns (`KEY_COLUMNS`), set in __init__ and grown by _reserve
    S: npt.NDArray[np.float64]
    L: npt.NDArray[np.int64]
    TM: npt.NDArray[np.int64]
    CB: npt.NDArray[np.int64]
    CN: npt.NDArray[np.int64]
    CW: npt.NDArray[np.float64]
    CFD: npt.NDArray[np.float64]
    CTM: npt.NDArray[np.int64]
    HL: npt.NDArray[np.int64]
    KC: npt.NDArray[np.int32]
    KE: npt.NDArray[np.uint64]
    KT: npt.NDArray[np.uint64]
    LIVE: npt.NDArray[np.uint8]
    AMP: npt.NDArray[np.float32]

    def __init__(
        self, half_life_for: Callable[[int], int], window_width_ns: int, window_buckets: int
    ) -> None:
        self._hl = half_life_for
        self._hl_cache: dict[int, int] = {}
        self._width = window_width_ns
        self._n = window_buckets
        self._cap = 0
        for name, dtype in KEY_COLUMNS.items():
            setattr(self, name, np.zeros(0, dtype))
        self._cid: dict[str, int] = {}
        self.cohort_names: list[str] = []  # cohort id -> name
        self.cohorts: dict[str, int] = {}  # cohort -> number of live keys
        self.index: dict[tuple[str, int, int], int] = {}  # live key -> key id
        # key ids allotted so far; a key id's (cohort, entity, type) is in the KC, KE
        # and KT columns (`key`), not in a list of tuples: a list the cyclic GC would
        # walk item by item in every full collection
        self._nkeys = 0
        # key id -> b -> (n, w, fd, tmax): tuples of numbers, so the cyclic GC stops
        # tracking them (and their dicts) and a full collection does not walk them
        self.older: dict[int, dict[int, tuple[int, float, float, int]]] = {}
        self.dk = array("I")  # detail rows: key id (DEAD once retracted)
        self.dt = array("q")  # timestamp ns
        self.dw = array("f")  # float32 weight
        self.du = array("Q")  # user id
        self.dm = array("B")  # membership shard
        self.dr = array("q")  # rseq (record sequence number in its membership shard)
        # detail rows ``row_base ..`` are held (row ids stay absolute); the ones before
        # were settled (`settle`) into per-(key, bucket) sums. The arrays start at
        # row ``phys_base``: settled rows are cut from their front only once they are
        # half of them (one memmove per half, not one per settle)
        self.row_base = 0
        self.phys_base = 0
        self.settled = SettledBuckets()
        # membership shard -> 1 + the highest rseq settled: a shard's rows reach a
        # ledger in rseq order, so its settled records are exactly those below
        self.settled_upto: dict[int, int] = {}
        # (key id, t_lo, t_hi) -> [(ts, w)] of the settled records in that range, read
        # from the durable history; None in an ephemeral database (`_past_terms`)
        self.settled_detail: Callable[[int, int, int], list[tuple[int, float]]] | None = None

    @property
    def row_end(self) -> int:
        """One past the last detail row (rows are numbered from 0, forever)."""
        return self.phys_base + len(self.dk)

    @property
    def held(self) -> int:
        """Detail rows held (not settled)."""
        return self.row_end - self.row_base

    def view(self, name: str) -> npt.NDArray[Any]:
        """A numpy view of the held rows of detail column ``name`` (``dk`` .. ``dr``):
        index it with ``row - row_base``. No view may outlive a call that adds or
        settles rows."""
        return np.frombuffer(getattr(self, name), dtype=_DETAIL_DTYPES[name])[
            self.row_base - self.phys_base :
        ]

    def half_life(self, stype: int) -> int:
        h = self._hl_cache.get(stype)
        if h is None:
            h = self._hl_cache[stype] = self._hl(stype)
        return h

    @property
    def key_total(self) -> int:
        """Key ids allotted so far (live or not)."""
        return self._nkeys

    def key(self, k: int) -> tuple[str, int, int]:
        """``(cohort, entity, type)`` of key id ``k``."""
        return self.cohort_names[self.KC[k]], int(self.KE[k]), int(self.KT[k])

    @property
    def keys(self) -> list[tuple[str, int, int]]:
        """``(cohort, entity, type)`` of every key id allotted so far, in id order."""
        n = self._nkeys
        names = self.cohort_names
        return list(
            zip(
                map(names.__getitem__, self.KC[:n].tolist()),
                self.KE[:n].tolist(),
                self.KT[:n].tolist(),
            )
        )

    def _reserve(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(1024, self._cap)
        while cap < n:
            cap += cap // 2
        for name, dtype in KEY_COLUMNS.items():
            old = getattr(self, name)
            col = np.zeros(cap, dtype)
            col[: len(old)] = old
            setattr(self, name, col)
        self._cap = cap

    def cohort_id(self, cohort: str) -> int | None:
        """The id ``KC`` holds for ``cohort``'s keys, or None if it never had one."""
        return self._cid.get(cohort)

    def cohort_id_for(self, cohort: str) -> int:
        """``cohort``'s id, given one if it has none yet (no key is made)."""
        return self._cohort_id(cohort)

    def _cohort_id(self, cohort: str) -> int:
        cid = self._cid.get(cohort)
        if cid is None:
            cid = self._cid[cohort] = len(self.cohort_names)
            self.cohort_names.append(cohort)
        return cid

    # -- writes ---------------------------------------------------------------------

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
        kids: list[Any] = list(map(index.get, zip(cs, es_l, types_l)))
        if None in kids:
            self._new_keys(kids, cs, es_l, types_l, tss)
        k = np.array(kids, dtype=np.int64)
        ts = np.asarray(tss, dtype=np.int64)
        w = np.asarray(ws, dtype=np.float64)
        b = ts // self._width
        x = (ts - self.L[k]) / self.HL[k]
        fast = (b == self.CB[k]) & (x <= RENORMALIZE_AT)
        wf = w * np.exp2(np.minimum(x, RENORMALIZE_AT))  # the others are added one by one
        every = bool(fast.all())
        if not every:
            kf, wff, wfa, tf = k[fast], wf[fast], w[fast], ts[fast]
        else:
            kf, wff, wfa, tf = k, wf, w, ts
        np.add.at(self.S, kf, wff)
        np.add.at(self.CN, kf, 1)
        np.add.at(self.CW, kf, wfa)
        np.add.at(self.CFD, kf, wff)
        np.maximum.at(self.CTM, kf, tf)
        np.maximum.at(self.TM, k, ts)
        if not every:
            slow = self._add_one
            for i in np.flatnonzero(~fast).tolist():
                slow(kids[i], int(ts[i]), float(w[i]))
        self.dk.frombytes(k.astype(np.uint32).tobytes())
        self.dt.frombytes(ts.tobytes())
        self.dw.frombytes(w.astype(np.float32).tobytes())
        self.du.frombytes(np.asarray(us, dtype=np.uint64).tobytes())
        self.dm.frombytes(
            bytes([ms]) * n if isinstance(ms, int) else np.asarray(ms, dtype=np.uint8).tobytes()
        )
        self.dr.frombytes(np.asarray(rs, dtype=np.int64).tobytes())
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
        if len(self.dk) or self._nkeys:
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
        self.KC[:g] = lut[kc]
        self.KE[:g] = ke
        self.KT[:g] = kt
        self.HL[:g] = hl_of_type[tinv[fk]]
        self.L[:g] = ts[fk]
        self.LIVE[:g] = 1
        # records within RENORMALIZE_AT half-lives of their key's landmark: in bulk
        x = (ts - self.L[kid]) / self.HL[kid]
        fast = x <= RENORMALIZE_AT
        every = bool(fast.all())
        kf, tf, wa = (kid, ts, w) if every else (kid[fast], ts[fast], w[fast])
        wf = wa * np.exp2(x if every else x[fast])
        self.S[:g] = np.bincount(kf, weights=wf, minlength=g)
        tm = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(tm, kf, tf)
        self.TM[:g] = tm
        b = tf // self._width
        cb = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(cb, kf, b)
        self.CB[:g] = cb
        cur = b == cb[kf]
        self.CN[:g] = np.bincount(kf[cur], minlength=g)
        self.CW[:g] = np.bincount(kf[cur], weights=wa[cur], minlength=g)
        self.CFD[:g] = np.bincount(kf[cur], weights=wf[cur], minlength=g)
        ctm = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ctm, kf[cur], tf[cur])
        self.CTM[:g] = ctm
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
        self.dk.frombytes(kid.astype(np.uint32).tobytes())
        self.dt.frombytes(ts.tobytes())
        self.dw.frombytes(w32.tobytes())
        self.du.frombytes(np.asarray(us, dtype=np.uint64).tobytes())
        self.dm.frombytes(np.asarray(ms, dtype=np.uint8).tobytes())
        self.dr.frombytes(np.asarray(rs, dtype=np.int64).tobytes())

    def _new_keys(
        self,
        kids: list[Any],
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
        self.KC[first:last] = list(map(self._cid.__getitem__, new_cohorts))
        self.KE[first:last] = np.array(list(map(es.__getitem__, at)), dtype=np.uint64)
        self.KT[first:last] = np.array(new_types, dtype=np.uint64)
        self.HL[first:last] = list(map(self._hl_cache.__getitem__, new_types))
        self.L[first:last] = nt
        self.TM[first:last] = nt
        self.CTM[first:last] = nt
        self.CB[first:last] = nt // self._width
        self.LIVE[first:last] = 1

    def _add_one(self, k: int, ts: int, w: float) -> None:
        """Add one contribution to key ``k`` (a newer or older bucket, or a landmark move)."""
        h = int(self.HL[k])
        x = (ts - int(self.L[k])) / h
        if x > RENORMALIZE_AT:
            self._renormalize(k, ts, h)
            x = 0.0
        wf = w * 2.0**x
        self.S[k] += wf
        if ts > self.TM[k]:
            self.TM[k] = ts
        b = ts // self._width
        cb = int(self.CB[k])
        if b == cb:
            self.CN[k] += 1
            self.CW[k] += w
            self.CFD[k] += wf
            if ts > self.CTM[k]:
                self.CTM[k] = ts
        elif b > cb:  # the latest bucket moves to ``older``; the new one is the latest
            cn = int(self.CN[k])
            if cn:
                self.older.setdefault(k, {})[cb] = (
                    cn,
                    float(self.CW[k]),
                    float(self.CFD[k]),
                    int(self.CTM[k]),
                )
            self.CB[k] = b
            self.CN[k] = 1
            self.CW[k] = w
            self.CFD[k] = wf
            self.CTM[k] = ts
        else:
            older = self.older.setdefault(k, {})
            bk = older.get(b)
            if bk is None:
                older[b] = (1, w, wf, ts)
            else:
                older[b] = (bk[0] + 1, bk[1] + w, bk[2] + wf, ts if ts > bk[3] else bk[3])

    def _renormalize(self, k: int, new_landmark: int, h: int) -> None:
        """Move key ``k``'s landmark to ``new_landmark`` (ns), rescaling its sums.

        The rescaled sums carry the rounding of the exponent, ``d = (L - new) / h``:
        a contribution retracted later, computed against the new landmark, differs
        from its rescaled self by up to ``|d| * ln 2`` units in the last place, so
        ``AMP`` grows by ``log2(1 + |d| ln 2)`` (see `retract_rows`)."""
        d = (int(self.L[k]) - new_landmark) / h
        self.AMP[k] += math.log2(1.0 + abs(d) * math.log(2.0))
        factor = 2.0**d
        self.S[k] *= factor
        self.CFD[k] *= factor
        older = self.older.get(k)
        if older:
            for b, bk in older.items():
                older[b] = (bk[0], bk[1], bk[2] * factor, bk[3])
        self.L[k] = new_landmark

    def erase_row(self, row: int) -> None:
        """Mark a held row retracted and zero its fields (the aggregates are not touched)."""
        i = row - self.phys_base
        self.dk[i] = DEAD
        self.dt[i] = 0
        self.dw[i] = 0.0
        self.du[i] = 0
        self.dr[i] = -1

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
        dk = self.view("dk")[:cut].astype(np.int64)
        dm = self.view("dm")[:cut]
        dr = self.view("dr")[:cut]
        alive = dk != DEAD
        upto_m = self.settled_upto
        for m in np.unique(dm[alive]).tolist():
            top = int(dr[alive & (dm == m)].max()) + 1
            if top > upto_m.get(m, 0):
                upto_m[m] = top
        if keep is not None:
            alive &= keep[:cut]
        k = dk[alive]
        live = self.LIVE[k] != 0
        k = k[live]
        if len(k):
            t = self.view("dt")[:cut][alive][live]
            w = self.view("dw")[:cut][alive][live].astype(np.float64)
            b = t // self._width
            order = np.lexsort((b, k))
            k, b, t, w = k[order], b[order], t[order], w[order]
            starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (b[1:] != b[:-1])])
            counts = np.diff(np.r_[starts, len(k)])
            hi = np.maximum.reduceat(t, starts)
            h = self.HL[k[starts]]
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
        if dead * 2 >= len(self.dk):  # cut the settled front once it is half
            for name, _ in _DETAIL:
                del getattr(self, name)[:dead]
            self.phys_base = self.row_base
        return cut

    def _drop_keys(self, ks: Sequence[int]) -> None:
        """Forget keys' state (no contribution left); their ids are not reused.

        Every column but the cohort id is zeroed (one vectorized assignment per column
        for all of ``ks``): the entity id, the timestamps and the sums of a key whose
        contributions a purge removed must not outlive it in a snapshot (erasure)."""
        gone = []
        for k in ks:
            if not self.LIVE[k]:
                continue
            key = self.key(k)
            if self.index.pop(key, None) is None:
                continue
            n = self.cohorts[key[0]] - 1
            if n:
                self.cohorts[key[0]] = n
            else:
                del self.cohorts[key[0]]
            self.older.pop(k, None)
            gone.append(k)
        if gone:
            at = np.array(gone, dtype=np.int64)
            for name in KEY_COLUMNS:
                if name != "KC":
                    getattr(self, name)[at] = 0

    def retract_rows(self, rows: Sequence[int]) -> int:
        """Retract the contributions of detail rows (each once), column-wise: a purge's
        apply. Returns the number of rows retracted (not already retracted).

        The latest buckets' counts and sums are decremented with ``np.subtract.at``
        (sequential, in row order), an earlier bucket one by one; a bucket whose count
        reaches 0 is emptied, a key with none left is dropped, and each touched key's
        ``S`` is re-derived from its remaining buckets (``math.fsum``), so retracting
        everything leaves exactly nothing. The rows are erased.

        Exactness (a purge leaves what a fresh fold of the remaining contributions
        gives, to 1e-9 relative, for any float32 weights). A bucket summed from ``n``
        non-negative terms is within ``n * u`` (``u = 2**-53``) of exact, relative to
        the largest value it held (Higham, "Accuracy and Stability of Numerical
        Algorithms", 2nd ed., section 4.2). A subtraction that leaves ``after`` of
        ``before`` multiplies that relative error by ``before / after``; ``AMP[k]``
        sums the log2 of the largest such factor of each retraction on the key. When
        ``AMP[k] + log2(n)`` of a touched bucket passes ``REFOLD_AT`` (the error could
        pass ``2**(REFOLD_AT - 53)``), or a bucket with contributions left reads 0 or
        less (total cancellation), the key is summed again from its detail rows
        (`_refold`, which resets ``AMP``). Adds amplify nothing, so signals never
        trigger it; a purge of contributions that dwarf the rest does.
        """
        if not len(rows):
            return 0
        r = np.asarray(rows, dtype=np.int64) - self.row_base
        if len(r) and int(r.min()) < 0:
            raise ValueError(
                f"detail row {int(r.min()) + self.row_base} was settled (held from {self.row_base})"
            )
        dk = self.view("dk")
        k = dk[r].astype(np.int64)
        r, k = r[k != DEAD], k[k != DEAD]
        if not len(r):
            del dk
            return 0
        r, first = np.unique(r, return_index=True)  # a row listed twice counts once
        k = k[first]
        order = np.argsort(first, kind="stable")  # back to the rows' order
        r, k = r[order], k[order]
        dt = self.view("dt")
        dw = self.view("dw")
        ts = dt[r].copy()
        w = dw[r].astype(np.float64)
        dk[r] = DEAD  # erase the rows (as erase_row)
        dt[r] = 0
        dw[r] = 0.0
        self.view("du")[r] = 0  # views: ``r`` counts from row_base, not phys_base
        self.view("dr")[r] = -1
        del dk, dt, dw  # no buffer export may outlive the call (the arrays grow)
        done = len(r)
        live = self.LIVE[k] != 0
        k, ts, w = k[live], ts[live], w[live]
        if not len(k):
            return done
        # Python int division, as _add_one (exact below 2**53, then correctly rounded)
        x = list(map(truediv, map(sub, ts.tolist(), self.L[k].tolist()), self.HL[k].tolist()))
        wf = w * np.array(_pow2(x), dtype=np.float64)
        b = ts // self._width
        cur = (b == self.CB[k]) & (self.CN[k] > 0)
        kc = k[cur]
        uk = np.sort(kc)  # the distinct keys (np.unique would import numpy.ma on first use)
        uk = uk[np.r_[True, uk[1:] != uk[:-1]]] if len(uk) else uk
        before_w, before_fd, before_n = self.CW[uk], self.CFD[uk], self.CN[uk]  # copies
        np.subtract.at(self.CN, kc, 1)
        np.subtract.at(self.CW, kc, w[cur])
        np.subtract.at(self.CFD, kc, wf[cur])
        emptied = kc[self.CN[kc] == 0]
        self.CW[emptied] = 0.0
        self.CFD[emptied] = 0.0
        left = self.CN[uk] > 0
        gain = np.maximum(_gain(before_w, self.CW[uk]), _gain(before_fd, self.CFD[uk]))
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
                older = self.older.get(kk)
                bk = older.get(bb) if older else None
                if bk is None:
                    continue  # nothing to take the row from
                if bk[0] == 1:
                    del older[bb]  # type: ignore[union-attr]
                    g = 0.0
                else:
                    nb = older[bb] = (bk[0] - 1, bk[1] - ww, bk[2] - ff, bk[3])  # type: ignore[index]
                    g = max(_gain1(bk[1], nb[1]), _gain1(bk[2], nb[2]))
                g0, n0 = worst.get(kk, (0.0, 0.0))
                worst[kk] = (max(g0, g), max(n0, math.log2(bk[0])))
        refold, empty = [], []
        for kk, (g, logn) in worst.items():
            older = self.older.get(kk)
            if not self.CN[kk] and not older:
                empty.append(kk)
                continue
            if older is not None and not older:
                del self.older[kk]
            amp = float(self.AMP[kk]) + g
            if amp + logn > REFOLD_AT:
                refold.append(kk)
            else:
                self.AMP[kk] = amp
                self.S[kk] = math.fsum(bk[3] for bk in self._buckets(kk))
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
        (correctly rounded over the rows; a settled bucket enters as its sums), ``S``
        the same over every term, ``TM`` their latest timestamp; ``AMP`` reset. The
        landmark stays, unless a purged contribution had moved it past every
        remaining one: then it comes back to the latest remaining. A scan of the held
        detail rows, so only for the rare key whose retractions cancelled
        (`retract_rows`)."""
        dk = self.view("dk")
        rows = np.flatnonzero(np.isin(dk, np.array(ks, dtype=np.uint32)))
        kr = dk[rows].astype(np.int64)
        ts_all = self.view("dt")[rows].tolist()
        w_all = self.view("dw")[rows].astype(np.float64).tolist()
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
            h = int(self.HL[kk])
            # a purged contribution may have moved the landmark past every remaining
            # one: bring it back to the latest remaining (reads at or after the key's
            # latest contribution scale from the landmark, which must not lie after it)
            latest_ts = max([ts_all[i] for i in idx] + [e[5] for e in st])
            landmark = min(int(self.L[kk]), latest_ts)
            self.L[kk] = landmark
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
            self.CB[kk], self.CN[kk], self.CW[kk], self.CFD[kk], self.CTM[kk] = (
                latest,
                n,
                math.fsum(ws),
                math.fsum(fs),
                tm,
            )
            self.S[kk] = math.fsum(every)
            self.TM[kk] = latest_ts
            self.AMP[kk] = 0.0
            if older:
                self.older[kk] = older
            else:
                self.older.pop(kk, None)

    def _past_terms(self, k: int, t_lo: int, at: int, h: int) -> list[float]:
        """``w * 2 ** (-(at - t) / h)`` of key ``k``'s contributions with
        ``t_lo <= t <= at`` (``t_lo`` a bucket's start): held rows one by one; a
        settled bucket inside the range as its sum; a settled bucket the read time
        falls inside, from the durable history (`settled_detail`) or, in an
        ephemeral database, which keeps no detail of settled records, not at all
        (a contribution stamped after the read time is never counted; the settled
        ones of that bucket stamped before it are then left out too)."""
        dk = self.view("dk")
        dt = self.view("dt")
        idx = np.flatnonzero((dk == k) & (dt >= t_lo) & (dt <= at))
        terms = [
            w * 2.0 ** (-(at - t) / h)
            for t, w in zip(dt[idx].tolist(), self.view("dw")[idx].tolist())
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

    # -- reads ----------------------------------------------------------------------

    def _buckets(self, k: int) -> list[Bucket]:
        """Every non-empty bucket of key ``k``: ``(b, count, weight_sum, fd_sum, t_max_b)``."""
        out: list[Bucket] = []
        cn = int(self.CN[k])
        if cn:
            out.append(
                (int(self.CB[k]), cn, float(self.CW[k]), float(self.CFD[k]), int(self.CTM[k]))
            )
        older = self.older.get(k)
        if older:
            out.extend((b, bk[0], bk[1], bk[2], bk[3]) for b, bk in older.items())
        return out

    def _score(self, k: int, at: int) -> float:
        h = int(self.HL[k])
        landmark = int(self.L[k])
        if at >= self.TM[k]:
            s = float(self.S[k]) * 2.0 ** (-(at - landmark) / h)
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
        k = self.index.get((cohort, entity, stype))
        return 0.0 if k is None else self._score(k, at)

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float]:
        """``(count, weight_sum)`` over buckets ``b(at)-n+1 .. b(at)``."""
        k = self.index.get((cohort, entity, stype))
        return (0, 0.0) if k is None else self._window(k, at)

    def _scores(self, ks: npt.NDArray[np.int64], at: int) -> list[float]:
        """`_score` of many keys: the ones read after their latest contribution (the
        common case) with the same arithmetic, on columns; the others one by one."""
        if not len(ks):
            return []
        diff = at - self.L[ks]
        easy = (self.TM[ks] <= at) & (diff < _EXACT) & (self.HL[ks] < _EXACT)
        x = np.where(easy, -diff / self.HL[ks], 0.0)  # <= 0, and exact: ints below 2**53
        scores = (self.S[ks] * np.array(_pow2(x.tolist()))).tolist()
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
        ks = np.flatnonzero((self.KC[:n] == cid) & (self.KT[:n] == stype) & (self.LIVE[:n] != 0))
        scores = self._scores(ks, at)
        entities = self.KE[ks].tolist()
        best = heapq.nsmallest(k, ((-s, e) for s, e in zip(scores, entities) if s > 0.0))
        return [(e, -neg) for neg, e in best]

    def rows(self, at: int) -> Iterable[tuple[str, int, int, float, int, float]]:
        """Every key: ``(cohort, entity, type, decay_score, window_count, window_weight)``."""
        n = self._nkeys
        ks = np.flatnonzero(self.LIVE[:n])
        scores = self._scores(ks, at)
        hi = at // self._width
        cb = self.CB[ks]
        inside = (cb >= hi - self._n + 1) & (cb <= hi) & (self.CN[ks] > 0)
        counts = np.where(inside, self.CN[ks], 0).tolist()
        cw = self.CW[ks]
        weights = np.where(inside & (cw > 0.0), cw, 0.0).tolist()
        older = self.older
        names = self.cohort_names
        for i, (k, c_id, entity, stype) in enumerate(
            zip(
                ks.tolist(),
                self.KC[ks].tolist(),
                self.KE[ks].tolist(),
                self.KT[ks].tolist(),
            )
        ):
            if k in older:
                c, w = self._window(k, at)
            else:
                c, w = counts[i], weights[i]
            yield names[c_id], entity, stype, scores[i], c, w

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: ``detail_rows`` (per held contribution),
        ``settled_buckets`` (per key and bucket with settled contributions),
        ``key_columns``, ``key_index`` (the dict, the key table, each key's tuple and
        ints) and ``older_buckets`` (per key with earlier buckets)."""
        detail = sum(
            getattr(self, name).buffer_info()[1] * getattr(self, name).itemsize
            for name, _ in _DETAIL
        )
        columns = sum(getattr(self, name).nbytes for name in KEY_COLUMNS)
        size = sys.getsizeof
        index = size(self.index) + sum(map(size, self.index))
        index += sum(size(k[1]) for k in self.index if k[1] > 256)  # small ints are shared
        index += sum(size(k) for k in self.index.values() if k > 256)
        older = size(self.older)
        for k, buckets in self.older.items():
            older += size(buckets) + (size(k) if k > 256 else 0)
            older += sum(
                size(b) + size(bk) + size(bk[1]) + size(bk[2]) + size(bk[3])
                for b, bk in buckets.items()
            )
        settled = self.settled.nbytes()
        return {
            "detail_rows": detail,
            "key_columns": columns,
            "key_index": index,
            "older_buckets": older,
            "settled_buckets": settled,
        }

    def key_count(self) -> int:
        """Number of live keys over all cohorts."""
        return len(self.index)

    def cohort_key_ids(self, cohort: str) -> list[int]:
        """Ids of the live keys of ``cohort``."""
        cid = self._cid.get(cohort)
        if cid is None:
            return []
        n = self._nkeys
        return np.flatnonzero((self.KC[:n] == cid) & (self.LIVE[:n] != 0)).tolist()

    # -- re-materialization ------------------------------------------------------------

    def same_cohort(self, cohort: str, other: Aggregates) -> bool:
        """Whether ``other`` holds the same keys of ``cohort`` with the same scores (at
        each key's later latest timestamp) and windows (every bucket's count and
        weight), floats to relative 1e-9, and the same timestamps (landmark, latest
        contribution, latest bucket and each bucket's latest contribution), exactly: a
        timestamp left by a purged record (a retraction does not move them) makes the
        rebuild be installed, so the record's time is erased too."""
        mine = {self.key(k)[1:]: k for k in self.cohort_key_ids(cohort)}
        theirs = {other.key(k)[1:]: k for k in other.cohort_key_ids(cohort)}
        if mine.keys() != theirs.keys():
            return False
        for key, a in mine.items():
            b = theirs[key]
            for name in ("L", "TM", "CB", "CTM"):
                if getattr(self, name)[a] != getattr(other, name)[b]:
                    return False
            at = max(int(self.TM[a]), int(other.TM[b]))
            if not math.isclose(
                self._score(a, at), other._score(b, at), rel_tol=1e-9, abs_tol=1e-300
            ):
                return False
            wa = {x[0]: (x[1], x[2], x[4]) for x in self._buckets(a)}
            wb = {x[0]: (x[1], x[2], x[4]) for x in other._buckets(b)}
            if wa.keys() != wb.keys():
                return False
            for bk, (n, w, tm) in wa.items():
                n2, w2, tm2 = wb[bk]
                if n != n2 or tm != tm2 or not math.isclose(w, w2, rel_tol=1e-9, abs_tol=1e-300):
                    return False
        return True

    def install_cohort(
        self, cohort: str, other: Aggregates, key_ids: dict[tuple[int, int], int]
    ) -> None:
        """Replace ``cohort``'s key states with ``other``'s (re-materialization).

        ``key_ids`` maps ``(entity, type)`` to the key id this shard's detail rows
        use for it; the state installed for that key takes that id.
        """
        self._drop_keys(self.cohort_key_ids(cohort))
        oks = other.cohort_key_ids(cohort)
        if not oks:
            return
        pairs = list(zip(other.KE[oks].tolist(), other.KT[oks].tolist()))
        ks = list(map(key_ids.__getitem__, pairs))
        at, src = np.array(ks, dtype=np.int64), np.array(oks, dtype=np.int64)
        for name in KEY_COLUMNS:  # one vectorized copy per column
            if name != "KC":
                getattr(self, name)[at] = getattr(other, name)[src]
        self.index.update(zip(((cohort, e, t) for e, t in pairs), ks))
        self.cohorts[cohort] = self.cohorts.get(cohort, 0) + len(ks)
        for ok, k in zip(oks, ks):
            if ok in other.older:
                self.older[k] = dict(other.older[ok])

    # -- snapshots -------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """The whole state as plain values and bytes (for a snapshot; see `load`)."""
        n = self._nkeys
        ob: list[int] = []
        oflat: list[Any] = []
        for k, older in self.older.items():
            for b, bk in older.items():
                ob.append(k)
                oflat.extend((b, bk[0], bk[1], bk[2], bk[3]))
        return {
            "names": self.cohort_names,
            "n": n,
            "cols": {name: getattr(self, name)[:n].tobytes() for name in KEY_COLUMNS},
            "detail": {
                name: getattr(self, name)[self.row_base - self.phys_base :].tobytes()
                for name, _ in _DETAIL
            },
            "older_keys": array("q", ob).tobytes(),
            "older": oflat,
            "row_base": self.row_base,
            "settled": self.settled.dump(),
            "settled_upto": self.settled_upto,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Inverse of `dump` (on an empty instance)."""
        self.cohort_names = list(state["names"])
        self._cid = {c: i for i, c in enumerate(self.cohort_names)}
        n = state["n"]
        self._cap = 0
        self._reserve(n)
        for name, dtype in KEY_COLUMNS.items():
            raw = state["cols"].get(name)
            if raw is not None:  # AMP is 0 in a snapshot taken before it existed
                getattr(self, name)[:n] = np.frombuffer(raw, dtype=dtype)
        for name, _ in _DETAIL:
            getattr(self, name).frombytes(state["detail"][name])
        self.row_base = self.phys_base = state.get("row_base", 0)  # older snapshots hold every row
        self.settled_upto = dict(state.get("settled_upto", {}))
        if "settled" in state:
            self.settled.load(state["settled"])
        names = self.cohort_names
        self._nkeys = n
        live = np.flatnonzero(self.LIVE[:n])
        self.index = dict(
            zip(
                zip(
                    map(names.__getitem__, self.KC[live].tolist()),
                    self.KE[live].tolist(),
                    self.KT[live].tolist(),
                ),
                live.tolist(),
            )
        )
        counts = np.bincount(self.KC[:n][self.LIVE[:n] != 0], minlength=len(names)).tolist()
        self.cohorts = {names[c]: m for c, m in enumerate(counts) if m}
        ok = array("q")
        ok.frombytes(state["older_keys"])
        flat = state["older"]
        older = self.older
        for i, k in enumerate(ok):
            j = 5 * i
            older.setdefault(k, {})[flat[j]] = (flat[j + 1], flat[j + 2], flat[j + 3], flat[j + 4])
