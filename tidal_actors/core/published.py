"""Domain core: a ledger shard's published view, read in the caller's thread.

A `PublishedView` is an immutable, versioned copy of what the serving reads need of
one ledger shard's aggregates, built by `core.publisher.Publisher` after the shard
applied a message, and swapped in by one attribute assignment (atomic under the GIL).
A reader takes the view object once and reads only it, so everything it answers
comes from one state the shard was in; the shard never waits for a reader, nor a
reader for the shard. No threads, no I/O.

What it holds:

* ``keys``: ``(cohort, entity, type) -> KeyEntry``, the key's forward-decayed sum,
  landmark, latest timestamp, half-life, latest bucket and earlier buckets' counts
  and weights (`KEY_COLUMNS` in `core.key_state` says what each means);
* ``groups``: ``(cohort, type) -> Group``, the keys of one cohort and type with the
  highest *rank* ``log2(fd_sum) + (landmark - ref) / half_life``, best first, and a
  bound on every other key's rank. All keys of a (cohort, type) share a half-life, so
  at a read time ``at`` at or after a key's latest contribution its score is
  ``2 ** (rank - (at - ref) / half_life)``: the order by rank is the order by score
  at every such read time (forward decay, Cormode, Shkapenyuk, Srivastava, Xu, ICDE
  2009).

Both maps are `LayeredMap` s: a few immutable dicts, newest first, so a publication
copies only what changed (a small top layer), merging layers geometrically.

Exactness: every answer equals, bit for bit, what the shard's own read
(`core.reads.Reads`) gives on the state the view was published from; a read the view
cannot answer that way returns ``None`` and the caller asks the shard (a score read
before the key's latest contribution; a top-k whose candidates include such a key, a
near-tie with a key the view does not list, or scores near float underflow).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "EMPTY_MAP",
    "NOT_READY",
    "Candidate",
    "Group",
    "KeyEntry",
    "LayeredMap",
    "PublishedView",
    "rank_slack",
]

# a layer merges into the one below it once it holds 1/MERGE_RATIO of that one's items
MERGE_RATIO = 4
# A top-k whose scores go below this is left to the shard. A contribution lost to
# underflow in a forward-decayed sum (below 2**-1074) counts, at a read time less than
# RENORMALIZE_AT (256) half-lives before the landmark, less than 2**(256 - 1074) times
# its weight (at most 2**128, float32): below 2**-690, 2**-650 for 2**40 of them, far
# below this times the rank slack. Above it, rounding is relative.
TINY_SCORE = 1e-180


def rank_slack(rank: float) -> float:
    """How far apart (log2 units) two ranks must be for the float scores computed
    from them to be in the same order: far above the rounding of ``log2``, of
    ``(landmark - ref) / half_life`` (relative 2**-52) and of the score's three
    roundings (a few ulp)."""
    return 1e-9 + abs(rank) * 1e-12


# One key's state as the reads use it (units as `KEY_COLUMNS`), a plain tuple:
# (fd_sum, landmark ns, t_max ns, half_life ns, latest_b, latest_count, latest_wsum,
# older, older_lo): ``older`` the (b, count, weight_sum) of its earlier buckets from
# ``latest_b - window_buckets + 1`` on; ``older_lo`` that first bucket if the key has
# earlier ones (a window read reaching below it is the shard's), else None.
KeyEntry = tuple[
    float, int, int, int, int, int, float, tuple[tuple[int, int, float], ...], int | None
]

# One key of a group's best, a plain tuple ordered best first:
# (-rank, entity, fd_sum, landmark ns, half_life ns, t_max ns, key id).
Candidate = tuple[float, int, float, int, int, int, int]


class Group(NamedTuple):
    """A (cohort, type)'s best keys by rank, best first; ``bound``: no other live key
    of it has a higher rank (``-inf``: none has a score at or after its latest
    contribution); ``since`` (ns): no read time before it may be answered here.

    ``since`` is ``RENORMALIZE_AT`` half-lives before a bound on the keys' landmarks.
    A key's rank bounds its score at a read time before its latest contribution too,
    up to rounding, unless that read time lies that far before its landmark: then
    contributions too small for the forward-decayed sum (underflowed in it) can be all
    the read time counts, and only the shard, summing them one by one, knows."""

    best: tuple[Candidate, ...]
    bound: float
    since: int


_MISSING: Any = object()


class LayeredMap:
    """An immutable mapping kept as a few dicts, newest first; ``None`` values mark
    deleted keys in upper layers. `updated` returns a new map sharing the lower
    layers: a publication costs what changed, plus geometric merges (each item is
    copied about ``MERGE_RATIO`` times per layer it sinks through)."""

    __slots__ = ("layers",)

    def __init__(self, layers: tuple[dict[Hashable, Any], ...] = ()) -> None:
        self.layers = layers

    def get(self, key: Hashable) -> Any:
        """The value of ``key``, or None."""
        for layer in self.layers:
            v = layer.get(key, _MISSING)
            if v is not _MISSING:
                return v
        return None

    def updated(self, changes: Mapping[Hashable, Any]) -> LayeredMap:
        """A map with ``changes`` applied (a value of None deletes the key)."""
        if not changes:
            return self
        layers = [dict(changes), *self.layers]
        while len(layers) > 1 and len(layers[0]) * MERGE_RATIO >= len(layers[1]):
            top, below = layers[0], layers[1]
            merged = dict(below)
            merged.update(top)
            if len(layers) == 2:  # the bottom layer keeps no deletion marks
                merged = {k: v for k, v in merged.items() if v is not None}
            layers[:2] = [merged]
        return LayeredMap(tuple(layers))

    def items(self) -> Iterable[tuple[Hashable, Any]]:
        """Every live item (for tests and full rebuilds), newest layer winning."""
        seen: set[Hashable] = set()
        for layer in self.layers:
            for k, v in layer.items():
                if k not in seen:
                    seen.add(k)
                    if v is not None:
                        yield k, v


EMPTY_MAP = LayeredMap()


class PublishedView:
    """One ledger shard's published state (see the module doc).

    Args:
        version: increases with every publication of any shard in the process.
        published_ns: ``time.monotonic_ns()`` when it was published.
        keys: ``(cohort, entity, type) -> KeyEntry`` of every live key.
        groups: ``(cohort, type) -> Group`` of every (cohort, type) with a live key.
        window_width_ns, window_buckets: the shard's window settings.
        ready: False for the placeholder a shard holds before its first publication
            (every read returns None).
    """

    __slots__ = ("groups", "keys", "published_ns", "ready", "version", "width", "window_n")

    def __init__(
        self,
        version: int,
        published_ns: int,
        keys: LayeredMap,
        groups: LayeredMap,
        window_width_ns: int,
        window_buckets: int,
        ready: bool = True,
    ) -> None:
        self.version = version
        self.published_ns = published_ns
        self.keys = keys
        self.groups = groups
        self.width = window_width_ns
        self.window_n = window_buckets
        self.ready = ready

    def score(self, cohort: str, entity: int, stype: int, at: int) -> float | None:
        """`Reads.decay_score` at ``at`` (ns); None when only the shard can answer."""
        if not self.ready:
            return None
        e: KeyEntry | None = self.keys.get((cohort, entity, stype))
        if e is None:
            return 0.0
        if at < e[2]:
            return None  # contributions after the read time: the shard sums its buckets
        s = e[0] * 2.0 ** (-(at - e[1]) / e[3])
        return s if s > 0.0 else 0.0

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float] | None:
        """`Reads.window` at ``at`` (ns): ``(count, weight_sum)``; None when only the
        shard can answer (not ready, or a window reaching below the buckets kept)."""
        if not self.ready:
            return None
        e: KeyEntry | None = self.keys.get((cohort, entity, stype))
        if e is None:
            return (0, 0.0)
        hi = at // self.width
        lo = hi - self.window_n + 1
        if e[8] is not None and lo < e[8]:
            return None
        count = 0
        ws = []
        if e[5] and lo <= e[4] <= hi:
            count += e[5]
            ws.append(e[6])
        for b, n, w in e[7]:
            if lo <= b <= hi:
                count += n
                ws.append(w)
        s = math.fsum(ws)
        return count, (s if s > 0.0 else 0.0)

    def top(self, cohort: str, stype: int, k: int, at: int) -> list[tuple[int, float]] | None:
        """`Reads.top`: the ``k`` best ``(entity, score)`` at ``at``, score descending,
        ties by entity ascending; None when only the shard can answer."""
        if not self.ready:
            return None
        g: Group | None = self.groups.get((cohort, stype))
        if g is None:
            return []
        best, bound, since = g
        if at < since:
            return None  # long before a landmark: see `Group`
        if not best:
            return [] if bound == -math.inf else None
        n = len(best)
        if k > n and bound != -math.inf:
            return None  # keys the view does not list could be among the k
        rk = -best[min(k, n) - 1][0]
        cut = rk - rank_slack(rk)
        if bound >= cut:
            return None  # a near-tie with a key not listed
        scored = []
        for i, (neg_rank, entity, fd, landmark, h, t_max, _k) in enumerate(best, 1):
            if -neg_rank < cut:
                break
            if at < t_max:
                return None
            s = fd * 2.0 ** (-(at - landmark) / h)
            if s < TINY_SCORE and (i < n or bound != -math.inf):
                return None  # near underflow rounding is not relative: the shard
            if s > 0.0:
                scored.append((-s, entity))
        return [(e, -neg) for neg, e in heapq.nsmallest(k, scored)]


NOT_READY = PublishedView(0, 0, EMPTY_MAP, EMPTY_MAP, 1, 1, ready=False)
