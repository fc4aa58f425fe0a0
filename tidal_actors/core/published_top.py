"""Domain core: top-k reads of a published view (`core.published`), and the parts
of a view its publisher shares with it (`ViewColumns`, `Groups`).

All keys of a (cohort, type) share a half-life, so at a read time at or after every
key's latest contribution the order of their scores is the order of their *ranks*
``log2(fd_sum) + (landmark - ref) / half_life`` (forward decay, Cormode, Shkapenyuk,
Srivastava, Xu, ICDE 2009). The first top-k read of a group in a view finds its
order (`TopReads.top`): repaired from the newest order any reader computed for the
group at or before the view's publication (`Stamps.orders`), by ranking again only
the group's keys changed since (those whose `Stamps.key_pub` is later), or else
ranked from all the group's live keys (numpy argpartition, then argsort of the
best). The order lists the best keys, best first, and a *bound*: no live key not
listed ranks higher. Adds only raise a key's rank and retractions lower it, so a
changed key above the bound is listed with its new rank, one at or below it is not,
and the bound stays true. Scores are computed for the keys within `rank_slack` of
the k-th as `core.reads.Reads._scores` computes them, bit for bit. No threads, no
I/O.
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "TIES_MAX",
    "TINY_SCORE",
    "TOP_KEEP",
    "Groups",
    "Stamps",
    "TopOrder",
    "TopReads",
    "ViewColumns",
    "rank_slack",
    "unique_ids",
]

_EXACT = 2**53  # int64 -> float64 is exact below this
# A top-k whose scores go below this is left to the shard: near float underflow the
# rounding of a score is no longer relative, so the rank order may not be the
# order of the scores the shard computes.
TINY_SCORE = 1e-180
# the first top-k read of a group in a view orders this many of its best keys (at
# least twice the k asked)
TOP_KEEP = 64
# an order lists at most this many times that many keys nearly tied with its best
TIES_MAX = 8


def unique_ids(ks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct values of ``ks``, ascending (by sorting: numpy's ``unique``
    hashes, ten times slower on a few thousand key ids)."""
    if len(ks) < 2:
        return ks
    s = np.sort(ks)
    keep = np.empty(len(s), dtype=np.bool_)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def rank_slack(rank: float) -> float:
    """How far apart (log2 units) two ranks must be for the float scores computed
    from them to be in the same order: far above the rounding of ``log2``, of
    ``(landmark - ref) / half_life`` (relative 2**-52) and of a score's three
    roundings (a few ulp)."""
    return 1e-9 + abs(rank) * 1e-12


class ViewColumns(NamedTuple):
    """The copied per-key columns of a view (one numpy array each, at least
    ``keys`` items; dtypes as `core.key_state.KEY_COLUMNS`)."""

    fd: npt.NDArray[np.float64]
    landmark: npt.NDArray[np.int64]
    t_max: npt.NDArray[np.int64]
    half_life: npt.NDArray[np.int64]
    latest_b: npt.NDArray[np.int64]
    latest_count: npt.NDArray[np.int64]
    latest_wsum: npt.NDArray[np.float64]
    prev_b: npt.NDArray[np.int64]
    entity: npt.NDArray[np.uint64]
    live: npt.NDArray[np.uint8]


class Groups:
    """A shard's (cohort, type) groups: ``gid`` maps ``cohort_id << 64 | type`` to a
    group id, ``members[g]`` is ``(ids, n)``: group ``g``'s key ids are ``ids[:n]``,
    ascending. Written by the shard's thread only (the arrays only grow, a full one
    replaced by a larger copy, the tuple swapped in one assignment); read by any."""

    __slots__ = ("gid", "members", "upto")

    def __init__(self) -> None:
        self.gid: dict[int, int] = {}
        self.members: list[tuple[npt.NDArray[np.int64], int]] = []
        self.upto = 0  # key ids below this are in their group

    def of(self, cid: int, stype: int) -> npt.NDArray[np.int64] | None:
        """The key ids of group ``(cid, stype)`` so far, or None."""
        g = self.gid.get(cid << 64 | stype)
        if g is None:
            return None
        ids, n = self.members[g]
        return ids[:n]


class TopOrder(NamedTuple):
    """A group's best keys in one view, best first (see `PublishedView.top`): numpy
    arrays, so that the caches views keep are nothing the garbage collector walks."""

    pub: int  # the publication whose state it orders
    t_max: int  # a bound on the latest contribution of the group's live keys (ns)
    ref: int  # the landmark the ranks are taken against (ns)
    bound: float  # no live key of the group not listed ranks higher (-inf: none)
    ranks: npt.NDArray[np.float64]  # of the listed keys, descending
    keys: npt.NDArray[np.int64]  # their key ids
    fd: npt.NDArray[np.float64]  # their forward-decayed sums
    landmark: npt.NDArray[np.int64]  # their landmarks (ns)
    half_life: npt.NDArray[np.int64]  # their half-lives (ns)
    entity: npt.NDArray[np.uint64]  # their entities

    def head(self, n: int, bound: float) -> TopOrder:
        """The best ``n`` listed keys, no other ranking above ``bound``."""
        return TopOrder(
            self.pub,
            self.t_max,
            self.ref,
            bound,
            self.ranks[:n],
            self.keys[:n],
            self.fd[:n],
            self.landmark[:n],
            self.half_life[:n],
            self.entity[:n],
        )


class Stamps:
    """What a shard's views share to repair group orders: ``key_pub[k]``, the last
    publication that changed key ``k`` (only grows; the array is replaced by a
    longer copy as keys are allotted), and ``orders``, group id -> the newest
    `TopOrder` a reader computed. Replaced whole when a publication does not know
    which keys changed (it copies every key)."""

    __slots__ = ("key_pub", "orders")

    def __init__(self, n: int) -> None:
        self.key_pub = np.zeros(n, dtype=np.int64)
        self.orders: dict[int, TopOrder] = {}


class TopReads:
    """The top-k reads of `PublishedView` (a base class of it)."""

    __slots__ = ()

    cols: ViewColumns
    keys: int
    cids: dict[str, int]
    groups: Groups
    pub: int
    stamps: Stamps
    _top: dict[int, TopOrder | None]

    def _listed(self, ks: npt.NDArray[np.int64], ref: int, bound: float, t_max: int) -> TopOrder:
        """A `TopOrder` of keys ``ks`` (their ranks against ``ref``), ``want`` best kept."""
        c = self.cols
        fd = c.fd[ks]
        lm = c.landmark[ks]
        h = c.half_life[ks]
        rank = np.full(len(ks), -np.inf)
        scoring = (fd > 0.0) & (c.live[ks] != 0)
        rank[scoring] = np.log2(fd[scoring]) + (lm[scoring] - ref) / h[scoring]
        order = np.argsort(-rank, kind="stable")
        return TopOrder(
            self.pub,
            t_max,
            ref,
            bound,
            rank[order],
            ks[order],
            fd[order],
            lm[order],
            h[order],
            c.entity[ks[order]],
        )

    def _order(self, g: int, want: int) -> TopOrder | None:
        """Group ``g``'s best ``want`` keys by rank, from all of its keys."""
        ids, n = self.groups.members[g]
        c = self.cols
        ks = ids[: np.searchsorted(ids[:n], self.keys)]
        ks = ks[c.live[ks] != 0]
        if not len(ks):
            return None
        fd = c.fd[ks]
        lm = c.landmark[ks]
        ref = int(lm.max())
        rank = np.full(len(ks), -np.inf)
        scoring = fd > 0.0
        rank[scoring] = np.log2(fd[scoring]) + (lm[scoring] - ref) / c.half_life[ks[scoring]]
        bound = -np.inf
        best = ks
        if len(ks) > want:
            # the best ``want``, and every key nearly tied with the (want/2)-th best
            # (so that a near-tie at the k-th of a k <= want/2 is listed), unless
            # that is more than TIES_MAX keys
            half = want // 2
            part = np.argpartition(-rank, (half, want))
            r = float(rank[part[half]])
            near = np.flatnonzero(rank >= r - rank_slack(r)) if r > -np.inf else part[:0]
            pick = near if want <= len(near) <= TIES_MAX * want else part[:want]
            listed = np.zeros(len(ks), dtype=np.bool_)
            listed[pick] = True
            if not listed.all():
                bound = float(rank[~listed].max())
            best = ks[listed]
        return self._listed(best, ref, bound, int(c.t_max[ks].max()))

    def _repair(self, g: int, want: int) -> TopOrder | None:
        """Group ``g``'s best keys from the newest order computed at or before this
        view's publication, with the keys changed since ranked again (None if there
        is no such order)."""
        stamps = self.stamps
        base = stamps.orders.get(g)
        if base is None or base.pub > self.pub:
            return None
        ids, n = self.groups.members[g]
        ks = ids[: np.searchsorted(ids[:n], self.keys)]
        ch = ks[stamps.key_pub[ks] > base.pub]  # all changed since, and maybe more
        if not len(ch):
            return base if base.pub == self.pub else base._replace(pub=self.pub)
        c = self.cols
        live = ch[c.live[ch] != 0]
        t_max = max(base.t_max, int(c.t_max[live].max())) if len(live) else base.t_max
        keep = base.keys[~np.isin(base.keys, ch)]
        new = self._listed(np.concatenate([keep, ch]), base.ref, base.bound, t_max)
        # listed: every key above the bound (at it too: listing more is always true)
        above = new.ranks > base.bound if base.bound == -np.inf else new.ranks >= base.bound
        n = int(np.count_nonzero(above))
        if n > 2 * want:  # keep the best ``want``, the bound raised to the next one
            return new.head(want, float(new.ranks[want]))
        return new.head(n, base.bound) if n < len(new.ranks) else new

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]] | None:
        """`Reads.top`: the ``k`` best ``(entity, score)`` at ``at``, score descending,
        ties by entity ascending; None when only the shard can answer."""
        cid = self.cids.get(cohort)
        g = None if cid is None else self.groups.gid.get(cid << 64 | stype)
        if g is None:
            return []
        t = self._top.get(g, _MISSING)
        if t is _MISSING or (t is not None and len(t.ranks) < k and t.bound > -np.inf):
            want = max(TOP_KEEP, 2 * k)
            t = self._repair(g, want) if t is _MISSING else None
            if t is None or (len(t.ranks) < k and t.bound > -np.inf):
                t = self._order(g, want)
            self._top[g] = t
            if t is not None:
                orders = self.stamps.orders
                have = orders.get(g)
                if have is None or have.pub < t.pub:
                    orders[g] = t
        if t is None:
            return []
        if at < t.t_max:
            return None  # contributions after the read time: the shard sums buckets
        n = len(t.ranks)
        if not n:
            return []
        asc = t.ranks[::-1]
        rk = float(t.ranks[min(k, n) - 1])
        if rk == -np.inf:  # fewer than k keys score: every one that does is listed
            if t.bound > -np.inf:
                return None
            m = n - int(asc.searchsorted(-np.inf, "right"))
        else:
            cut = rk - rank_slack(rk)
            if t.bound >= cut:
                return None  # a near-tie with a key not listed: left to the shard
            m = n - int(asc.searchsorted(cut, "left"))
        scored = []
        for fd, lm, h, e in zip(
            t.fd[:m].tolist(),
            t.landmark[:m].tolist(),
            t.half_life[:m].tolist(),
            t.entity[:m].tolist(),
        ):
            diff = at - lm
            if diff >= _EXACT or h >= _EXACT:
                return None
            s = fd * 2.0 ** (-diff / h)
            if s < TINY_SCORE:
                return None  # near underflow the rank order is not the scores'
            scored.append((-s, e))
        if len(scored) > k:
            scored = heapq.nsmallest(k, scored)
        else:
            scored.sort()
        return [(e, -neg) for neg, e in scored]


_MISSING: Any = object()
