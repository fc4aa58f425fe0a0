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

Top-k reads (`core.published_top.TopReads`) order a (cohort, type)'s keys by
forward-decay rank at the first read of the group in a view, from an earlier view's
order when one of the last few has it, and cache the order on the view.

Exactness: every answer equals, bit for bit, what the shard's own read
(`core.reads.Reads`) gives on the state the view was published from. A read the view
cannot answer that way returns ``None`` and the caller asks the shard: a score or a
top-k at a read time before a key's latest contribution, a window that reaches an
earlier bucket of the key, a top-k whose k-th score is near float underflow, and
any read of a key the index no longer holds after a drop (``drop_epoch``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_codes import (
    _CID_BITS,
    _CID_SHIFT,
    _ENTITY_BITS,
    _TYPE_BITS,
    _TYPE_SHIFT,
    key_code,
)
from tidal_actors.core.key_index import KeyIndex
from tidal_actors.core.published_top import (
    TINY_SCORE,
    Groups,
    Stamps,
    TopOrder,
    TopReads,
    ViewColumns,
    rank_slack,
    unique_ids,
)

__all__ = [
    "NO_BUCKET",
    "TINY_SCORE",
    "Groups",
    "PublishedView",
    "Stamps",
    "ViewColumns",
    "rank_slack",
    "unique_ids",
]

NO_BUCKET = np.iinfo(np.int64).min  # ``prev_b`` of a key without earlier buckets

# the bounds of a narrow `key_code` (`score` computes it inline)
_CID_END, _TYPE_END, _ENTITY_END = 1 << _CID_BITS, 1 << _TYPE_BITS, 1 << _ENTITY_BITS


class PublishedView(TopReads):
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
        pub: the shard's publication number (only grows).
        stamps: the shard's `Stamps` (shared): what top-k orders repair from.
    """

    __slots__ = (
        "_e0",
        "_epoch",
        "_top",
        "cids",
        "cols",
        "groups",
        "index",
        "keys",
        "pub",
        "published_ns",
        "stamps",
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
        index: KeyIndex,
        cohort_ids: dict[str, int],
        groups: Groups,
        epoch: npt.NDArray[np.int64],
        window_width_ns: int,
        window_buckets: int,
        pub: int = 0,
        stamps: Stamps | None = None,
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
        self._top: dict[int, TopOrder | None] = {}  # group id -> its best keys
        self.pub = pub
        self.stamps = Stamps(0) if stamps is None else stamps

    def _find(self, cohort: str, entity: int, stype: int) -> int | None:
        """Key id of ``(cohort, entity, stype)`` in this view, -1 if it has none,
        None if only the shard can tell (keys were dropped since)."""
        cid = self.cids.get(cohort)
        k = None if cid is None else self.index.get(key_code(cid, entity, stype))
        if k is not None and k < self.keys:
            return k
        # absent here, unless the miss comes from a drop after the publication
        return -1 if self._epoch.item(0) == self._e0 else None

    def score(self, cohort: str, entity: int, stype: int, at: int) -> float | None:
        """`Reads.decay_score` at ``at`` (ns); None when only the shard can answer."""
        # `_find` and `key_code` inlined, and ``item`` (a Python number, no numpy
        # scalar): the serving path's most frequent read
        cid = self.cids.get(cohort)
        if cid is None:
            k = None
        elif cid < _CID_END and stype < _TYPE_END and entity < _ENTITY_END:
            k = self.index.get(cid << _CID_SHIFT | stype << _TYPE_SHIFT | entity)  # `key_code`
        else:
            k = self.index.get((cid, entity, stype))
        if k is None or k >= self.keys:
            return 0.0 if self._epoch.item(0) == self._e0 else None
        c = self.cols
        if not c.live.item(k):
            return 0.0
        if at < c.t_max.item(k):
            return None  # contributions after the read time: the shard sums its buckets
        s = c.fd.item(k) * 2.0 ** (-(at - c.landmark.item(k)) / c.half_life.item(k))
        return s if s > 0.0 else 0.0

    def window(self, cohort: str, entity: int, stype: int, at: int) -> tuple[int, float] | None:
        """`Reads.window` at ``at`` (ns): ``(count, weight_sum)``; None when only the
        shard can answer (the window reaches one of the key's earlier buckets)."""
        k = self._find(cohort, entity, stype)
        if k is None or k < 0:
            return None if k is None else (0, 0.0)
        c = self.cols
        if not c.live.item(k):
            return (0, 0.0)
        hi = at // self.width
        lo = hi - self.window_n + 1
        if c.prev_b.item(k) >= lo:
            return None  # an earlier bucket may be inside: the shard reads them
        lb = c.latest_b.item(k)
        n = c.latest_count.item(k)
        if n and lo <= lb <= hi:
            w = c.latest_wsum.item(k)
            return n, (w if w > 0.0 else 0.0)
        return (0, 0.0)
