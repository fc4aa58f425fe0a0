"""Domain core: building a ledger shard's published views (`core.published`).

`Publisher` copies the per-key columns the reads need (`ViewColumns`) into buffers a
`PublishedView` then owns, and keeps the shard's (cohort, type) groups (`Groups`)
current. Owned by the shard's thread; the views it returns are never written while
a reader can reach them. No threads, no I/O.

Theory of operation
-------------------
A publication needs a copy of the columns as they are now. Copying every key each
time costs about 70 bytes a key; instead the publisher keeps the views it published
before and, once no reader holds one any more, brings its buffers up to date by
writing only the rows of the keys changed since that view was published (the key ids
each publication changed are kept for the last ``HISTORY`` publications) and
publishes them in a new view object. "No reader holds it" is CPython's reference
count: a retired view that only the publisher's own list refers to cannot be reached
by a reader any more (the shard's ``view`` attribute names a newer one, and a reader
that took the old one holds a reference for as long as it reads). Elsewhere (another
Python implementation) every publication copies every key.

Group ids are given to key ids as they are allotted (``Groups``): a key's cohort and
type never change, and key ids only grow, so each group's key ids are appended in
ascending order and never rewritten.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from itertools import count

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_state import KeyState
from tidal_actors.core.published import (
    NO_BUCKET,
    Groups,
    PublishedView,
    Stamps,
    ViewColumns,
    unique_ids,
)

__all__ = ["HISTORY", "SPARES", "Publisher", "unique_ids"]

HISTORY = 4  # publications whose changed key ids are kept (to update a retired view)
SPARES = 3  # retired views kept for their buffers
# a retired view is updated row by row while the rows changed since are fewer than
# this fraction of the keys; else its buffers are overwritten whole
SCATTER_MAX = 0.25
# whether reference counts tell that no reader holds a retired view (see the module)
_REFCOUNTS = sys.implementation.name == "cpython"
_probe = [object()]
_UNHELD = sys.getrefcount(_probe[0])  # of an item only its list refers to
del _probe

# the copied columns: (`ViewColumns` field, `KEY_COLUMNS` name or None: computed)
_SOURCES = (
    ("fd", "fd_sum"),
    ("landmark", "landmark"),
    ("t_max", "t_max"),
    ("half_life", "key_half_life"),
    ("latest_b", "latest_b"),
    ("latest_count", "latest_count"),
    ("latest_wsum", "latest_wsum"),
    ("prev_b", None),
    ("entity", "key_entity"),
    ("live", "live"),
)
_DTYPES = {
    "fd": np.float64,
    "landmark": np.int64,
    "t_max": np.int64,
    "half_life": np.int64,
    "latest_b": np.int64,
    "latest_count": np.int64,
    "latest_wsum": np.float64,
    "prev_b": np.int64,
    "entity": np.uint64,
    "live": np.uint8,
}


class Publisher:
    """Builds the published views of one shard's aggregates (see the module doc).

    Args:
        agg: the shard's aggregates (read only here).
    """

    def __init__(self, agg: KeyState) -> None:
        self.agg = agg
        self.groups = Groups()
        self.stamps = Stamps(0)  # what views repair top-k orders from
        self._versions = count(1)
        self._pubs = 0  # publications so far
        self.current: PublishedView | None = None
        self._at: dict[int, int] = {}  # id(view) -> the publication it was current at
        self._spares: list[PublishedView] = []  # retired views, oldest first
        self._changed: deque[tuple[int, npt.NDArray[np.int64] | None]] = deque(maxlen=HISTORY)
        self.rows_written = 0  # rows copied into views so far (for benchmarks)

    def regroup(self) -> None:
        """Make the groups again at the next publication (a rebuild dropped keys and
        installed them again: a dropped key's type column is zeroed)."""
        self.groups = Groups()
        self.stamps = Stamps(0)

    def release(self) -> None:
        """Forget every view (nobody reads them): the next publication copies all."""
        self.current = None
        self.stamps = Stamps(0)
        self._spares.clear()
        self._at.clear()
        self._changed.clear()

    def publish(self, ks: npt.NDArray[np.int64] | None) -> PublishedView:
        """A view of the state now; ``ks``: the key ids changed since the last
        publication (unique, any order), or None if unknown (all are copied)."""
        agg = self.agg
        n = agg.key_total
        self._grow_groups(n)
        self._pubs += 1
        self._changed.append((self._pubs, ks))
        self._stamp(ks, n)
        if self.current is not None:
            self._spares.append(self.current)
        cols = self._reuse(n)
        if cols is None:
            cap = max(1024, n + n // 4)
            cols = ViewColumns(*(np.zeros(cap, _DTYPES[f]) for f, _ in _SOURCES))
            self._copy_all(cols, n)
        view = PublishedView(
            next(self._versions),
            time.monotonic_ns(),
            n,
            cols,
            agg.index,
            agg._cid,
            self.groups,
            agg.drop_epoch,
            agg._width,
            agg._n,
            self._pubs,
            self.stamps,
        )
        self.current = view
        self._at[id(view)] = self._pubs
        return view

    # -- parts ------------------------------------------------------------------------

    def _stamp(self, ks: npt.NDArray[np.int64] | None, n: int) -> None:
        """Stamp keys ``ks`` changed by this publication (None: any may have; then
        no view repairs an order computed before)."""
        st = self.stamps
        if ks is None:
            self.stamps = Stamps(max(1024, n + n // 2))
            return
        if len(st.key_pub) < n:
            grown = np.zeros(max(1024, n + n // 2), dtype=np.int64)
            grown[: len(st.key_pub)] = st.key_pub
            st.key_pub = grown  # one assignment: a reader sees the old or this one
        st.key_pub[ks] = self._pubs

    def _reuse(self, n: int) -> ViewColumns | None:
        """The buffers of a retired view no reader holds, brought up to date."""
        if not _REFCOUNTS:
            self._spares.clear()
            self._at.clear()
            return None
        spares = self._spares
        for i in range(len(spares)):
            if sys.getrefcount(spares[i]) > _UNHELD or len(spares[i].cols.fd) < n:
                continue
            view = spares.pop(i)
            since = self._at.pop(id(view))
            cols = view.cols
            del view  # retired: only its buffers live on, in the new view
            self._update(cols, since, n)
            break
        else:
            cols = None
        while len(spares) > SPARES:
            self._at.pop(id(spares.pop(0)), None)
        return cols

    def _update(self, cols: ViewColumns, since: int, n: int) -> None:
        """Write into ``cols`` (current at publication ``since``) the rows changed since."""
        parts = [ks for p, ks in self._changed if p > since and ks is not None]
        if len(parts) < self._pubs - since:
            self._copy_all(cols, n)  # changes not kept (or not known)
            return
        ks = unique_ids(np.concatenate(parts)) if len(parts) > 1 else parts[0]
        if len(ks) > SCATTER_MAX * n:
            self._copy_all(cols, n)
            return
        agg = self.agg
        ks = ks.astype(np.int64, copy=False)
        for field, src in _SOURCES:
            dst = getattr(cols, field)
            if src is None:
                dst[ks] = agg.older.newest_b(ks, NO_BUCKET)
            else:
                dst[ks] = getattr(agg, src)[ks]
        self.rows_written += len(ks)

    def _copy_all(self, cols: ViewColumns, n: int) -> None:
        agg = self.agg
        for field, src in _SOURCES:
            dst = getattr(cols, field)
            if src is None:
                dst[:n] = agg.older.newest_b(np.arange(n, dtype=np.int64), NO_BUCKET)
            else:
                dst[:n] = getattr(agg, src)[:n]
        self.rows_written += n

    def _grow_groups(self, n: int) -> None:
        """Put key ids ``groups.upto .. n`` in their (cohort, type) groups."""
        g = self.groups
        first = g.upto
        if n <= first:
            return
        agg = self.agg
        ids = np.arange(first, n, dtype=np.int64)
        cids = agg.key_cohort[first:n].astype(np.int64)
        types = agg.key_type[first:n]
        order = np.lexsort((ids, types, cids))
        cs, ts = cids[order], types[order]
        cut = np.flatnonzero((cs[1:] != cs[:-1]) | (ts[1:] != ts[:-1])) + 1
        starts = [0, *cut.tolist()]
        ends = [*cut.tolist(), len(order)]
        for s, e, c, t in zip(starts, ends, cs[starts].tolist(), ts[starts].tolist()):
            code = c << 64 | t
            gid = g.gid.get(code)
            new = ids[order[s:e]]
            if gid is None:
                arr = np.zeros(max(16, 2 * len(new)), dtype=np.int64)
                arr[: len(new)] = new
                g.members.append((arr, len(new)))
                # its id last: a reader that finds the id finds its members
                g.gid[code] = len(g.members) - 1
                continue
            arr, m = g.members[gid]
            if m + len(new) > len(arr):
                grown = np.zeros(2 * (m + len(new)), dtype=np.int64)
                grown[:m] = arr[:m]
                arr = grown
            arr[m : m + len(new)] = new
            g.members[gid] = (arr, m + len(new))
        g.upto = n
