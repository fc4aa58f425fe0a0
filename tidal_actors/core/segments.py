"""Domain core: per-key segments of shared numpy columns (`Segments`).

The storage under `older_buckets.OlderBuckets`: every key id ``k`` owns one segment of
rows of the columns a subclass names (``COLUMNS``), ``start[k] .. start[k] +
length[k]``, with room for ``cap[k]`` rows. A segment that is full moves to one of the
next power of two in size (`room`), many keys at once where a batch fills many
(`_move_many`); the old one is kept for reuse by size, so a freed segment fits the
next key that grows to it. Keys that grow together leave sizes no key asks for again:
once the free segments hold more than half as many rows as the keys' segments, every
segment moves down into one block (`_compact_if_sparse`). No Python object per row,
and nothing the cyclic GC walks (the free lists are a dict of ``array`` objects, which
hold no references). No threads, no I/O.
"""

from __future__ import annotations

from array import array
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets

__all__ = ["COMPACT_FROM", "FIRST_CAP", "Segments", "room"]

FIRST_CAP = 2  # rows a key's first segment holds
COMPACT_FROM = 1024  # rows handed out below which free segments are left as they are


_PER_KEY = ("start", "length", "cap")


def room(n: int) -> int:
    """Rows of the segment that holds ``n`` rows: the least power of two at least
    ``n`` and ``FIRST_CAP``. Sizes from one short list, so a freed segment is reused
    by the next key that needs that size."""
    return max(FIRST_CAP, 1 << (n - 1).bit_length())


class Segments:
    """Rows of ``COLUMNS`` (name -> numpy dtype) in one segment per key id (see the
    module). Subclasses read and write the rows; this class hands out the room."""

    __slots__ = ("_free", "_free_rows", "_nrows", "_top", "cap", "items", "length", "start")

    COLUMNS: ClassVar[dict[str, type[np.generic]]] = {}

    start: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    cap: npt.NDArray[np.int64]
    # each column above and in ``COLUMNS`` is a numpy view of the ``array`` of the same
    # name here (`_new`), which per-record code indexes instead: an item read gives a
    # Python number at half the cost of ``ndarray.item``
    items: dict[str, array[Any]]

    def __init__(self) -> None:
        self.items = {}
        for name, dtype in self.COLUMNS.items():
            self._new(name, dtype, 0)
        self._nrows = 0  # rows the columns hold
        # per key id: its segment's first row, rows used and rows of room
        for name in _PER_KEY:
            self._new(name, np.int64, 0)
        self._top = 0  # rows of the columns handed out to segments so far
        self._free: dict[int, array[int]] = {}  # segment size -> starts of free ones
        self._free_rows = 0  # rows in free segments

    def _new(self, name: str, dtype: type[np.generic], size: int) -> npt.NDArray[Any]:
        """A zeroed ``array`` of ``size`` items in ``items[name]``, and attribute
        ``name`` a numpy view of it; returns the view."""
        dt = np.dtype(dtype)
        buf = array(dt.char, bytes(size * dt.itemsize))
        self.items[name] = buf
        col = np.frombuffer(buf, dtype=dt)
        setattr(self, name, col)
        return col

    def __getstate__(self) -> dict[str, Any]:
        """The slots, but the numpy views of ``items`` (made again on load)."""
        views = {*self.COLUMNS, *_PER_KEY}
        state = dict(getattr(self, "__dict__", {}))
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name not in views and hasattr(self, name):
                    state[name] = getattr(self, name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        dtypes: dict[str, type[np.generic]] = {**self.COLUMNS, **dict.fromkeys(_PER_KEY, np.int64)}
        for name, dtype in dtypes.items():
            setattr(self, name, np.frombuffer(self.items[name], dtype=dtype))

    def _keys(self, n: int) -> None:
        """Make the per-key arrays hold key ids below ``n``."""
        have = len(self.length)
        if n <= have:
            return
        size = max(n, have + have // 2, 1024)
        for name in _PER_KEY:
            old = getattr(self, name)
            self._new(name, np.int64, size)[:have] = old

    def _rows(self, n: int) -> None:
        """Make the columns hold rows below ``n``."""
        have = self._nrows
        if n <= have:
            return
        size = max(n, have + have // 2, 1024)
        for name, dtype in self.COLUMNS.items():
            old = getattr(self, name)
            self._new(name, dtype, size)[:have] = old
        self._nrows = size

    def _compact_if_sparse(self) -> None:
        """When the free segments hold more than half as many rows as the keys'
        segments (keys that grew together leave their smaller segments behind, and
        no key asks for that size again), move every key's segment down into one
        block and drop the free ones."""
        held = self._top - self._free_rows
        if self._top < COMPACT_FROM or 2 * self._free_rows <= held:
            return
        ks = np.flatnonzero(self.cap)
        caps, lens = self.cap[ks], self.length[ks]
        starts = np.cumsum(caps) - caps
        offs = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        src = np.repeat(self.start[ks], lens) + offs
        dst = np.repeat(starts, lens) + offs
        size = max(1024, held + held // 2)
        for name, dtype in self.COLUMNS.items():
            old = getattr(self, name)
            self._new(name, dtype, size)[dst] = old[src]
        self._nrows = size
        self.start[ks] = starts
        self._top = held
        self._free = {}
        self._free_rows = 0

    def _alloc(self, cap: int) -> int:
        free = self._free.get(cap)
        if free:
            self._free_rows -= cap
            return free.pop()
        at = self._top
        self._top = at + cap
        self._rows(self._top)
        return at

    def _release(self, k: int) -> None:
        it = self.items
        cap = it["cap"][k]
        if cap:
            self._free.setdefault(cap, array("q")).append(it["start"][k])
            self._free_rows += cap
        it["length"][k] = it["cap"][k] = 0

    def _move(self, k: int, cap: int) -> int:
        """Move key ``k``'s rows to a segment of ``cap`` rows; returns its start. Plain
        Python on the ``array`` objects (`items`): a key's first segment or a move
        of a few rows costs item reads and slice copies, no numpy call."""
        at = self._alloc(cap)  # may grow the columns: ``items`` read after it
        it = self.items
        n = it["length"][k]
        if n:
            s = it["start"][k]
            for name in self.COLUMNS:
                col = it[name]
                col[at : at + n] = col[s : s + n]
        self._release(k)
        it["start"][k] = at
        it["length"][k] = n
        it["cap"][k] = cap
        return at

    def _alloc_many(self, caps: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Segments of ``caps`` rows each: free ones of the same size first, the rest
        handed out in one block."""
        starts = np.empty(len(caps), dtype=np.int64)
        todo = np.ones(len(caps), dtype=bool)
        for cap in sets.unique(caps).tolist():
            free = self._free.get(cap)
            if not free:
                continue
            at = np.flatnonzero(caps == cap)[: len(free)]
            take = len(at)
            starts[at] = np.array(free[len(free) - take :], dtype=np.int64)
            del free[len(free) - take :]
            self._free_rows -= take * cap
            todo[at] = False
        if todo.any():
            c = caps[todo]
            ends = self._top + np.cumsum(c)
            starts[todo] = ends - c
            self._top = int(ends[-1])
            self._rows(self._top)
        return starts

    def _move_many(self, ks: npt.NDArray[np.int64]) -> None:
        """`_move` of keys ``ks`` (distinct) to segments of ``_room(length + 1)`` rows,
        at once."""
        lens = self.length[ks]
        # 1 << bit_length(n): the least power of two above n (frexp: n = m * 2**e,
        # 0.5 <= m < 1, exact for n < 2**53)
        caps = np.maximum(np.left_shift(1, np.frexp(lens.astype(np.float64))[1]), FIRST_CAP)
        caps = caps.astype(np.int64)
        starts = self._alloc_many(caps)
        if lens.any():
            offs = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
            src = np.repeat(self.start[ks], lens) + offs
            dst = np.repeat(starts, lens) + offs
            for name in self.COLUMNS:
                col = getattr(self, name)
                col[dst] = col[src]
        old = self.cap[ks]
        for cap in sets.unique(old[old > 0]).tolist():
            self._free.setdefault(cap, array("q")).extend(self.start[ks[old == cap]].tolist())
        self._free_rows += int(old.sum())
        self.start[ks] = starts
        self.cap[ks] = caps
        self._compact_if_sparse()
