"""Domain core: a ledger shard's published view, read in the caller's thread.

A `PublishedView` is an immutable copy of the per-key columns the serving reads need
of one ledger shard's aggregates, built by `core.publisher.Publisher` in the shard's
thread after it applied messages, and swapped in by one attribute assignment (atomic
under the GIL). A reader takes the view object once and reads only it, so every
answer comes from one state the shard was in; the shard never waits for a reader,
nor a reader for the shard. No threads, no I/O.

What it holds (item ``k`` is key id ``k``'s, for ``k < keys``, the key ids allotted
when it was published; units as `core.key_state.KEY_COLUMNS`):

* copies of ``fd_sum``, ``landmark``, ``t_max``, ``key_half_life``, ``latest_b``,
  ``latest_count``, ``latest_wsum``, ``key_entity`` and ``live``, and ``prev_b``, the
  newest earlier bucket of each key (``NO_BUCKET`` if it has none): numpy columns,
  which the cyclic garbage collector never walks;
* the shard's live key index (``KeyCode -> key id``) and cohort ids, shared, not
  copied: key ids only grow and a key keeps its id, so a key id found there below
  ``keys`` is the same key the copied columns hold; one at or above it, or none, is a
  key the view does not have, unless keys were dropped from the index since the
  view was published: the aggregates bump ``KeyState.drop_epoch`` before they drop
  any, and a view finding it moved leaves the miss to the shard;
* the shard's (cohort, type) groups (`Groups`: each group's key ids, ascending,
  append only), shared likewise.

Top-k: all keys of a (cohort, type) share a half-life, so at a read time at or after
every key's latest contribution the order of their scores is the order of their
*ranks* ``log2(fd_sum) + (landmark - ref) / half_life`` (forward decay, Cormode,
Shkapenyuk, Srivastava, Xu, ICDE 2009). The first top-k read of a group in a view
ranks the group's live keys with numpy (argpartition, then argsort of the best) and
caches the order on the view; later reads score only the best few.

Exactness: every answer equals, bit for bit, what the shard's own read
(`core.reads.Reads`) gives on the state the view was published from. A read the view
cannot answer that way returns ``None`` and the caller asks the shard: a score or a
top-k at a read time before a key's latest contribution, a window that reaches an
earlier bucket of the key, a top-k whose k-th score is near float underflow, and
any read of a key the index no longer holds after a drop (``epoch``).
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_state import key_code

__all__ = [
    "NO_BUCKET",
    "TINY_SCORE",
    "Changes",
    "Groups",
    "History",
    "PublishedView",
    "ViewColumns",
    "rank_slack",
    "unique_ids",
]

NO_BUCKET = np.iinfo(np.int64).min  # ``prev_b`` of a key without earlier buckets
_EXACT = 2**53  # int64 -> float64 is exact below this
# A top-k whose scores go below this is left to the shard: near float underflow the
# rounding of a score is no longer relative, so the rank order may not be the
# order of the scores the shard computes.
TINY_SCORE = 1e-180
# the first top-k read of a group in a view orders this many of its best keys (at
# least twice the k asked)
TOP_KEEP = 64


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


class _Top(NamedTuple):
    """A group's best keys in one view, best first (see `PublishedView.top`): numpy
    arrays, so that the caches views keep are nothing the garbage collector walks."""

    t_max: int  # a bound on the latest contribution of the group's live keys (ns)
    ref: int  # the landmark the ranks are taken against (ns)
    bound: float  # no live key of the group not listed ranks higher (-inf: none)
    ranks: npt.NDArray[np.float64]  # of the listed keys, descending
    keys: npt.NDArray[np.int64]  # their key ids
    fd: npt.NDArray[np.float64]  # their forward-decayed sums
    landmark: npt.NDArray[np.int64]  # their landmarks (ns)
    half_life: npt.NDArray[np.int64]  # their half-lives (ns)
    entity: npt.NDArray[np.uint64]  # their entities

    def head(self, n: int, bound: float) -> _Top:
        """The best ``n`` listed keys, no other ranking above ``bound``."""
        return _Top(
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


# The key ids one publication changed, by group: ``(gids ascending, key ids)``.
Changes = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
# What a view can repair its group orders from: ``(cache of an earlier view, the
# changes of the publication after it)``, newest first, one per publication.
History = tuple[tuple[dict[int, Any], Changes], ...]
_NO_KEYS = np.zeros(0, dtype=np.int64)
_NO_T_MAX = int(np.iinfo(np.int64).min)


class PublishedView:
    """One ledger shard's published state (see the module doc).

    Args:
        version: increases with every publication of the shard.
        published_ns: ``time.monotonic_ns()`` when it was published.
        keys: the key ids allotted when it was published.
        cols: the copied columns.
        index: the shard's key index (shared).
        cohort_ids: the shard's cohort name -> cohort id map (shared, only grows).
        groups: the shard's groups (shared).
        epoch: ``KeyState.drop_epoch`` (shared): bumped before keys leave ``index``.
        window_width_ns, window_buckets: the shard's window settings.
        history: earlier views' group orders and the changes since (`History`).
    """

    __slots__ = (
        "_e0",
        "_epoch",
        "_history",
        "_top",
        "cids",
        "cols",
        "groups",
        "index",
        "keys",
        "published_ns",
        "version",
        "width",
        "window_n",
    )

    def __init__(
        self,
        version: int,
        published_ns: int,
        keys: int,
        cols: ViewColumns,
        index: dict[Any, int],
        cohort_ids: dict[str, int],
        groups: Groups,
        epoch: npt.NDArray[np.int64],
        window_width_ns: int,
        window_buckets: int,
        history: History = (),
    ) -> None:
        self.version = version
        self.published_ns = published_ns
        self.keys = keys
        self.cols = cols
        self.index = index
        self.cids = cohort_ids
        self.groups = groups
        self._epoch = epoch
        self._e0 = int(epoch[0])
        self.width = window_width_ns
        self.window_n = window_buckets
        self._top: dict[int, _Top | None] = {}  # group id -> its best keys
        self._history = history

    def _find(self, cohort: str, entity: int, stype: int) -> int | None:
        """Key id of ``(cohort, entity, stype)`` in this view, -1 if it has none,
        None if only the shard can tell (keys were dropped since)."""
        cid = self.cids.get(cohort)
        k = None if cid is None else self.index.get(key_code(cid, entity, stype))
        if k is not None and k < self.keys:
            return k
        # absent here, unless the miss comes from a drop after the publication
        return -1 if int(self._epoch[0]) == self._e0 else None

    def score(self, cohort: str, entity: int, stype: int, at: int) -> float | None:
        """`Reads.decay_score` at ``at`` (ns); None when only the shard can answer."""
        k = self._find(cohort, entity, stype)
        if k is None or k < 0:
            return None if k is None else 0.0
        c = self.cols
        if not c.live[k]:
            return 0.0
        if at < c.t_max[k]:
            return None  # contributions after the read time: the shard sums its buckets
        s = float(c.fd[k]) * 2.0 ** (-(at - int(c.landmark[k])) / int(c.half_life[k]))
        return s if s > 0.0 else 0.0

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float] | None:
        """`Reads.window` at ``at`` (ns): ``(count, weight_sum)``; None when only the
        shard can answer (the window reaches one of the key's earlier buckets)."""
        k = self._find(cohort, entity, stype)
        if k is None or k < 0:
            return None if k is None else (0, 0.0)
        c = self.cols
        if not c.live[k]:
            return (0, 0.0)
        hi = at // self.width
        lo = hi - self.window_n + 1
        if c.prev_b[k] >= lo:
            return None  # an earlier bucket may be inside: the shard reads them
        lb = int(c.latest_b[k])
        n = int(c.latest_count[k])
        if n and lo <= lb <= hi:
            w = float(c.latest_wsum[k])
            return n, (w if w > 0.0 else 0.0)
        return (0, 0.0)

    def _listed(self, ks: npt.NDArray[np.int64], ref: int, bound: float, t_max: int) -> _Top:
        """A `_Top` of keys ``ks`` (their ranks against ``ref``), ``want`` best kept."""
        c = self.cols
        fd = c.fd[ks]
        lm = c.landmark[ks]
        h = c.half_life[ks]
        rank = np.full(len(ks), -np.inf)
        scoring = (fd > 0.0) & (c.live[ks] != 0)
        rank[scoring] = np.log2(fd[scoring]) + (lm[scoring] - ref) / h[scoring]
        order = np.argsort(-rank, kind="stable")
        return _Top(
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

    def _order(self, g: int, want: int) -> _Top | None:
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
        if len(ks) > want:
            part = np.argpartition(-rank, want)
            bound = float(rank[part[want:]].max())
            best = ks[part[:want]]
        else:
            best = ks
        return self._listed(best, ref, bound, int(c.t_max[ks].max()))

    def _repair(self, g: int, want: int) -> _Top | Any | None:
        """Group ``g``'s best keys from an earlier view's, with the keys changed since
        ranked again (`_MISSING` if no earlier view has them)."""
        parts = []
        for cache, (gs, kb) in self._history:
            lo = gs.searchsorted(g, "left")
            hi = gs.searchsorted(g, "right")
            if hi > lo:
                parts.append(kb[lo:hi])
            base = cache.get(g, _MISSING)
            if base is not _MISSING:
                break
        else:
            return _MISSING
        if not parts:
            return base  # nothing of the group changed since
        c = self.cols
        ch = unique_ids(np.concatenate(parts)) if len(parts) > 1 else parts[0]
        ch = ch[ch < self.keys]
        live = ch[c.live[ch] != 0]
        if base is None:  # no live key then
            if not len(live):
                return None
            base = self._listed(_NO_KEYS, int(c.landmark[live].max()), -np.inf, _NO_T_MAX)
        if not len(ch):
            return base
        t_max = max(base.t_max, int(c.t_max[live].max())) if len(live) else base.t_max
        keep = base.keys[~np.isin(base.keys, ch)]
        new = self._listed(np.concatenate([keep, ch]), base.ref, base.bound, t_max)
        n = int(np.count_nonzero(new.ranks > base.bound))
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
            t = self._repair(g, want) if t is _MISSING else _MISSING
            if t is _MISSING or (t is not None and len(t.ranks) < k and t.bound > -np.inf):
                t = self._order(g, want)
            self._top[g] = t
        if t is None:
            return []
        n = len(t.ranks)
        if not n:
            return []
        if at < t.t_max:
            return None  # contributions after the read time: the shard sums buckets
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
