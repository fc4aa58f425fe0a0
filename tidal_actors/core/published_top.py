"""Domain core: top-k reads of a published view (`core.published`), and the parts
of a view its publisher shares with it (`ViewColumns`, `Groups`).

All keys of a (cohort, type) share a half-life, so at a read time at or after every
key's latest contribution the order of their scores is the order of their *ranks*
``log2(fd_sum) + (landmark - ref) / half_life`` (forward decay, Cormode, Shkapenyuk,
Srivastava, Xu, ICDE 2009). The first top-k read of a group in a view finds its
order (`TopReads.top`): repaired from the newest order any reader computed for the
group at or before the view's publication (`Stamps.orders`), by ranking again only
the group's keys changed since (none when `Stamps.group_pub` says the group is
unchanged; else those whose `Stamps.key_pub` is later), merged into the earlier
order's rows, or else ranked from all the group's live keys (numpy argpartition,
then a sort of the best). A read from an order makes no numpy call. The order
lists the best keys, best first, and a *bound*: no live key not
listed ranks higher. Adds only raise a key's rank and retractions lower it, so a
changed key above the bound is listed with its new rank, one at or below it is not,
and the bound stays true. Scores are computed for the keys within `rank_slack` of
the k-th as `core.reads.Reads._scores` computes them, bit for bit. No threads, no
I/O.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
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
    ascending, and ``of_key[k]`` is key ``k``'s group id (for ``k < upto``). Written
    by the shard's thread only (the arrays only grow, a full one replaced by a larger
    copy, the tuple swapped in one assignment); read by any."""

    __slots__ = ("gid", "members", "of_key", "upto")

    def __init__(self) -> None:
        self.gid: dict[int, int] = {}
        self.members: list[tuple[npt.NDArray[np.int64], int]] = []
        self.of_key = np.zeros(0, dtype=np.int64)
        self.upto = 0  # key ids below this are in their group

    def of(self, cid: int, stype: int) -> npt.NDArray[np.int64] | None:
        """The key ids of group ``(cid, stype)`` so far, or None."""
        g = self.gid.get(cid << 64 | stype)
        if g is None:
            return None
        ids, n = self.members[g]
        return ids[:n]


Row = tuple[float, int, float, int, int, int]  # rank, key id, fd_sum, landmark, half-life, entity


def _neg_rank(row: Row) -> float:
    return -row[0]


class TopOrder(NamedTuple):
    """A group's best keys in one view, best first (see `PublishedView.top`), as plain
    tuples of numbers: read without a numpy call (one that lets go of the
    interpreter lock waits for it again while another thread ingests), and, holding
    no container, untracked by the garbage collector once it has seen them."""

    pub: int  # the publication whose state it orders
    t_max: int  # a bound on the latest contribution of the group's live keys (ns)
    ref: int  # the landmark the ranks are taken against (ns)
    bound: float  # no live key of the group not listed ranks higher (-inf: none)
    # the listed keys, rank descending: (rank, key id, fd_sum, landmark ns,
    # half-life ns, entity)
    rows: tuple[Row, ...]


class Stamps:
    """What a shard's views share to repair group orders: ``key_pub[k]``, the last
    publication that changed key ``k``, and ``group_pub[g]``, the last that changed
    a key of group ``g`` (both only grow; each array is replaced by a longer copy as
    keys and groups are allotted), and ``orders``, group id -> the newest
    `TopOrder` a reader computed. Replaced whole when a publication does not know
    which keys changed (it copies every key)."""

    __slots__ = ("group_pub", "key_pub", "orders")

    def __init__(self, n: int) -> None:
        self.key_pub = np.zeros(n, dtype=np.int64)
        self.group_pub = np.zeros(0, dtype=np.int64)
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

    def _rows(self, ks: npt.NDArray[np.int64], ref: int, above: float | None) -> list[Row]:
        """The rows of keys ``ks`` (their ranks against ``ref``), in the order of
        ``ks``: all of them (``above`` None), or those ranking above ``above`` (at it
        too, unless it is -inf)."""
        c = self.cols
        fd = c.fd[ks]
        lm = c.landmark[ks]
        h = c.half_life[ks]
        rank = np.full(len(ks), -np.inf)
        scoring = (fd > 0.0) & (c.live[ks] != 0)
        rank[scoring] = np.log2(fd[scoring]) + (lm[scoring] - ref) / h[scoring]
        if above is not None:
            keep = rank > above if above == -np.inf else rank >= above
            if not keep.all():
                ks, rank, fd, lm, h = ks[keep], rank[keep], fd[keep], lm[keep], h[keep]
        return list(
            zip(
                rank.tolist(),
                ks.tolist(),
                fd.tolist(),
                lm.tolist(),
                h.tolist(),
                c.entity[ks].tolist(),
            )
        )

    def _members(self, g: int) -> npt.NDArray[np.int64]:
        """Group ``g``'s key ids in this view (those below ``keys``)."""
        ids, n = self.groups.members[g]
        if n and ids[n - 1] < self.keys:
            return ids[:n]
        return ids[: np.searchsorted(ids[:n], self.keys)]

    def _order(self, g: int, want: int) -> TopOrder | None:
        """Group ``g``'s best ``want`` keys by rank, from all of its keys."""
        c = self.cols
        ks = self._members(g)
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
        rows = self._rows(best, ref, None)
        rows.sort(key=_neg_rank)
        return TopOrder(self.pub, int(c.t_max[ks].max()), ref, bound, tuple(rows))

    def _repair(self, g: int, want: int) -> TopOrder | None:
        """Group ``g``'s best keys from the newest order computed at or before this
        view's publication, with the keys changed since ranked again (None if there
        is no such order)."""
        stamps = self.stamps
        base = stamps.orders.get(g)
        if base is None or base.pub > self.pub:
            return None
        gp = stamps.group_pub
        if g < len(gp) and gp[g] <= base.pub:  # no key of the group changed since
            return base if base.pub == self.pub else base._replace(pub=self.pub)
        ks = self._members(g)
        ch = ks[stamps.key_pub[ks] > base.pub]  # all changed since, and maybe more
        if not len(ch):
            return base if base.pub == self.pub else base._replace(pub=self.pub)
        c = self.cols
        live = ch[c.live[ch] != 0]
        t_max = max(base.t_max, int(c.t_max[live].max())) if len(live) else base.t_max
        # listed: every key above the bound (at it too: listing more is always true),
        # the changed ones ranked again from this view, the others as they were
        bound = base.bound
        changed = set(ch.tolist())
        up = self._rows(ch, base.ref, bound)
        up.sort(key=_neg_rank)
        if bound == -np.inf:
            keep = [r for r in base.rows if r[0] > bound and r[1] not in changed]
        else:
            keep = [r for r in base.rows if r[0] >= bound and r[1] not in changed]
        rows = sorted(keep + up, key=_neg_rank) if up else keep
        if len(rows) > 2 * want:  # keep the best ``want``, the bound raised to the next one
            return TopOrder(self.pub, t_max, base.ref, rows[want][0], tuple(rows[:want]))
        return TopOrder(self.pub, t_max, base.ref, bound, tuple(rows))

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]] | None:
        """`Reads.top`: the ``k`` best ``(entity, score)`` at ``at``, score descending,
        ties by entity ascending; None when only the shard can answer."""
        cid = self.cids.get(cohort)
        g = None if cid is None else self.groups.gid.get(cid << 64 | stype)
        if g is None:
            return []
        t = self._top.get(g, _MISSING)
        if t is _MISSING or (t is not None and len(t.rows) < k and t.bound > -_INF):
            want = max(TOP_KEEP, 2 * k)
            t = self._repair(g, want) if t is _MISSING else None
            if t is None or (len(t.rows) < k and t.bound > -_INF):
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
        rows = t.rows
        n = len(rows)
        if not n:
            return []
        rk = rows[min(k, n) - 1][0]
        if rk == -_INF:  # fewer than k keys score: every one that does is listed
            if t.bound > -_INF:
                return None
            m = bisect_left(rows, _INF, key=_neg_rank)  # the keys ranking above -inf
        else:
            cut = rk - rank_slack(rk)
            if t.bound >= cut:
                return None  # a near-tie with a key not listed: left to the shard
            m = bisect_right(rows, -cut, key=_neg_rank)  # the keys ranking at cut or above
        scored = []
        for _r, _k, fd, lm, h, e in rows[:m]:
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


_INF = float("inf")
_MISSING: Any = object()
