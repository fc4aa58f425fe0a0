"""Domain core: the storage of the contribution log's (user, cohort) index.

An *entry* of the index is a (user, cohort) pair's count of records already trimmed
away (evicted, not yet reported by a purge; "item 0") and its live log positions,
ascending. A pair with neither has no entry, except a held pair whose positions
moved to its held rows (`pair_index`), whose entry stays until its purge is applied.
`entry_bytes` gives an entry as a snapshot stores it: native int64s, item 0 then the
positions (`pair_positions` reads it).

Layout (`pair_runs`): cohorts are the aggregates' cohort ids
(`Aggregates.cohort_id_for`); appended records wait in a pending buffer and, once
``FLUSH_AT`` of them (or before any read), are sorted by pair key into a run (one
`np.argsort`). ``FANOUT`` runs of one level (the merges a run took) merge into one
run of the next level unless that run would hold more than ``TOP_SIZE`` entries
(which bounds the pause a merge takes): a record is merged two or three times, and
a log of ``n`` records has about ``n * FANOUT / TOP_SIZE`` runs at most, plus fewer
than ``FANOUT`` on each smaller level. A pair is found with one `np.searchsorted`
per run. Positions the log's compaction drops become counts (`Counts`). No
threads, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core import pair_runs as pr
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.log_rows import LogRows
from tidal_actors.core.pair_runs import GONE, Counts, Run

__all__ = [
    "FANOUT",
    "FLUSH_AT",
    "I64",
    "TOP_SIZE",
    "PairStore",
    "entry_bytes",
    "pair_positions",
]

I64 = struct.Struct("=q")  # native int64, as the snapshot's array('q') bytes
FLUSH_AT = 4096  # pending records sorted into a run at once
FANOUT = 4  # runs of one level merged together
TOP_SIZE = 1 << 19  # most entries a merge makes (its sort stalls appends: ~10-40 ms)

Slices = list[tuple[Run, int, int]]
_EMPTY = np.zeros(0, dtype=np.int64)


def pair_positions(lst: bytes | bytearray) -> tuple[int, list[int]]:
    """``(trimmed_count, positions)`` of an entry's bytes (`entry_bytes`)."""
    items = np.frombuffer(bytes(lst), dtype=np.int64)
    return int(items[0]), items[1:].tolist()


def entry_bytes(count: int, positions: npt.NDArray[np.int64]) -> bytes:
    """An entry as native int64s: ``count`` (item 0), then ``positions``."""
    return I64.pack(count) + positions.tobytes()


class PairStore:
    """The entries of a `ContributionLog`'s pair index (see the module docstring)."""

    # set by ContributionLog: the detail-row column and the position of its item 0
    d: LogRows
    base: int

    def __init__(self, aggregates: Aggregates) -> None:
        self.agg = aggregates
        self.runs: list[Run] = []  # oldest first; position ranges ascending
        self.counts = Counts()  # item 0 of each entry that has one
        self.wide = False  # pair keys are two columns (`pair_runs`)
        # pairs whose entry stays while it may have no count nor position: held
        # pairs whose positions moved to their held rows (until `_keep_live`)
        self._kept: set[tuple[int, int]] = set()
        # pending: users, by append (a uint64 copy, or a small batch's list of ints)
        self._pu: list[npt.NDArray[np.uint64] | list[int]] = []
        self._pc: list[Sequence[str] | npt.NDArray[Any]] = []  # pending: cohorts
        self._pn = 0  # pending records; their positions are _p0 ..
        self._p0 = 0

    def _pend(self, users: Any, cohorts: Sequence[str] | npt.NDArray[Any], n: int) -> None:
        """Queue ``n`` records just appended to the column (copies of their users and
        cohorts, names or cohort ids; a list of user ids, a small batch's, which
        nobody changes, as it is: converted with the others at the flush); sorted
        into a run at ``FLUSH_AT``."""
        if not self._pn:
            self._p0 = self.base + len(self.d) - n
        self._pu.append(users if type(users) is list else np.array(users, dtype=np.uint64))
        self._pc.append(np.array(cohorts) if isinstance(cohorts, np.ndarray) else list(cohorts))
        self._pn += n
        if self._pn >= FLUSH_AT:
            self._flush(merge=True)
        elif len(self.runs) >= FANOUT:  # small runs flushed by reads merge here too
            self._merge()

    def _cids(self, cohorts: Sequence[str] | npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        if isinstance(cohorts, np.ndarray):
            return cohorts.astype(np.int64)
        lut = {c: self.agg.cohort_id_for(c) for c in set(cohorts)}
        return np.fromiter(map(lut.__getitem__, cohorts), np.int64, len(cohorts))

    def _ensure(self, users: npt.NDArray[np.uint64], cids: npt.NDArray[Any]) -> None:
        """Switch to wide keys if a pair of these has no narrow code."""
        if not self.wide and not pr.fits(users, cids):
            self.wide = True
            for r in self.runs:
                r.widen()
            self.counts.widen()

    def _flush(self, merge: bool = False) -> None:
        """Sort the pending records into a run (then merge runs, if ``merge``)."""
        if self._pn:
            pu = self._pu
            if all(type(u) is list for u in pu):  # one conversion for them all
                users = np.array(list(chain.from_iterable(pu)), dtype=np.uint64)
            else:
                users = np.concatenate([np.asarray(u, dtype=np.uint64) for u in pu])
            strs = [c for c in self._pc if not isinstance(c, np.ndarray)]
            if len(strs) == len(self._pc):  # names only: one pass
                cids = self._cids(list(chain.from_iterable(strs)))
            else:
                cids = np.concatenate([self._cids(c) for c in self._pc])
            p0, n = self._p0, self._pn
            self._pu, self._pc, self._pn = [], [], 0
            self._ensure(users, cids)
            key = pr.encode(users, cids, self.wide)
            o = pr.order(*key)
            pos = np.arange(p0, p0 + n, dtype=np.int64)[o]
            self.runs.append(Run(pr.take(key, o), pos, p0, p0 + n, 0))
        if merge:
            self._merge()

    def _merge(self) -> None:
        runs = self.runs
        while len(runs) >= FANOUT:
            level = runs[-1].level
            group = runs[-FANOUT:]
            if any(r.level != level for r in group) or sum(map(len, group)) > TOP_SIZE:
                return
            del runs[-FANOUT:]
            key = pr.concat([r.keys() for r in group])
            pos = np.concatenate([r.positions() for r in group])
            if any(r.dead for r in group):
                live = pos != GONE
                key, pos = pr.take(key, live), pos[live]
            o = pr.order(*key)  # stable: each pair's positions stay ascending
            runs.append(Run(pr.take(key, o), pos[o], group[0].p0, group[-1].p1, level + 1))

    def _slices(self, user: int, cid: int) -> Slices:
        """Where the pair's entries lie: ``(run, a, b)`` per run holding some."""
        self._flush()
        out = []
        for r in self.runs:
            a, b = r.span(user, cid)
            if a < b:
                out.append((r, a, b))
        return out

    @staticmethod
    def _raw(slices: Slices) -> npt.NDArray[np.int64]:
        """The slices' positions, tombstones included, in order."""
        if not slices:
            return _EMPTY
        return np.concatenate([r.positions(a, b) for r, a, b in slices])

    def _remove(self, slices: Slices, gone: npt.NDArray[np.bool_]) -> None:
        """Tombstone the slices' entries where ``gone`` (over `_raw`) is true; a run
        half tombstones is rewritten."""
        i = 0
        for r, a, b in slices:
            m = gone[i : i + b - a]
            i += b - a
            k = int(np.count_nonzero(m))
            if not k:
                continue
            r.kill(a, b, m)
            if r.dead * 2 >= len(r):
                r.keep(r.live())
                if not len(r):
                    self.runs.remove(r)

    def entry(self, user: int, cohort: str) -> tuple[int, npt.NDArray[np.int64]] | None:
        """The pair's entry ``(item 0, positions int64)``, or None if it has none."""
        cid = self.agg.cohort_id(cohort)
        if cid is None:
            return None
        raw = self._raw(self._slices(user, cid))
        pos = raw[raw != GONE]
        count = self.counts.get(user, cid)
        return (count, pos) if count or len(pos) or (user, cid) in self._kept else None

    def entries(self) -> list[tuple[tuple[int, str], int, npt.NDArray[np.int64]]]:
        """Every entry: ``((user, cohort), item 0, positions)``, by user, then cohort id."""
        self._flush()
        self.counts.fold()
        key = pr.concat([r.keys() for r in self.runs])
        pos = np.concatenate([r.positions() for r in self.runs]) if self.runs else _EMPTY
        live = pos != GONE
        key, pos = pr.take(key, live), pos[live]
        o = pr.order(*key)
        key, pos = pr.take(key, o), pos[o]
        starts = pr.group(*key)
        ends = np.r_[starts[1:], len(pos)].astype(np.int64)
        ekey = pr.take(key, starts)
        ckey = self.counts.key
        kept = list(self._kept)
        kkey = pr.encode(
            np.array([p[0] for p in kept], dtype=np.uint64),
            np.array([p[1] for p in kept], dtype=np.int64),
            self.wide,
        )
        both = pr.concat([ekey, ckey, kkey])
        sb = pr.take(both, pr.order(*both))
        ukey = pr.take(sb, pr.group(*sb))
        ei, ci = pr.match(ekey, ukey), pr.match(ckey, ukey)
        users, cids = pr.decode(*ukey)
        names = self.agg.cohort_names
        cn = self.counts.n
        out = []
        for j, (u, c) in enumerate(zip(users.tolist(), cids.tolist())):
            e, k = int(ei[j]), int(ci[j])
            out.append(
                (
                    (u, names[c]),
                    int(cn[k]) if k >= 0 else 0,
                    pos[starts[e] : ends[e]] if e >= 0 else _EMPTY,
                )
            )
        return out

    def empty(self) -> bool:
        """Whether the index has no entry (and nothing pending)."""
        return not (self._pn or self.runs or self.counts or self._kept)

    def index_bytes(self) -> int:
        """Bytes held by the index: its runs, its counts and the pending records."""
        # a pending list of ids: a pointer and an int object (28-32 B) each
        pend = sum(u.nbytes if isinstance(u, np.ndarray) else 40 * len(u) for u in self._pu)
        pend += 8 * self._pn + 56 * len(self._pc)
        return sum(r.nbytes() + 96 for r in self.runs) + self.counts.nbytes() + pend

    def _trim_runs(self) -> None:
        """Positions below ``base`` (the column's dropped head) become their pairs'
        counts (item 0, reported by the next purge)."""
        self._flush()
        keys, ns = [], []
        runs, base = self.runs, self.base
        while runs and runs[0].p0 < base:
            r = runs[0]
            p = r.positions()
            cut = (p != GONE) & (p < base)
            if cut.any():
                key = pr.take(r.keys(), cut)
                starts = pr.group(*key)
                keys.append(pr.take(key, starts))
                ns.append(np.diff(np.r_[starts, len(key[0])]).astype(np.int64))
            if r.p1 <= base:
                del runs[0]
                continue
            r.keep(p >= base)
            r.rebase(base)
            if not len(r):
                del runs[0]
        if keys:
            self.counts.add(pr.concat(keys), np.concatenate(ns))

    def load_entries(
        self,
        users: npt.NDArray[np.uint64],
        cids: npt.NDArray[Any],
        counts: npt.NDArray[np.int64],
        pair_of: npt.NDArray[np.int64],
        pos: npt.NDArray[np.int64],
    ) -> None:
        """Fill an empty index: pair ``i`` is (``users[i]``, cohort id ``cids[i]``)
        with item 0 ``counts[i]`` (pairs may repeat: their counts add up); position
        ``pos[j]`` (int64, at or above ``base``) belongs to pair ``pair_of[j]``.
        Each pair's positions ascend in ``pos``."""
        users = np.asarray(users, dtype=np.uint64)
        cids = np.asarray(cids, dtype=np.int64)
        self._ensure(users, cids)
        key = pr.encode(users, cids, self.wide)
        if len(pos):
            ekey = pr.take(key, pair_of)
            o = pr.order(*ekey)
            p = pos[o]
            self.runs.append(
                Run(pr.take(ekey, o), p, int(pos.min()), int(pos.max()) + 1, pr.LOADED)
            )
        nz = counts != 0
        if nz.any():
            self.counts.add(pr.take(key, nz), counts[nz])
