"""Domain core: the contribution log's column of detail rows, as segments.

Each record of a ledger shard's contribution log (`contrib_log`) points at its
detail row in the shard's `Aggregates`. The log appends a batch's records as the
aggregates add their rows, in the same order, so the rows of consecutive positions
are consecutive rows almost everywhere: the column is held as *segments*, each a
first index and the difference ``row - index`` that holds from there to the next
segment's first index (16 bytes a segment, instead of 8 bytes a record). Ingestion
keeps one segment; a restore that leaves evicted records out of the log
(`ContributionLog.load_columns`) starts a segment after each gap, at most one a
record (16 bytes a record then, until the log trims them).

`LogRows` reads like the ``array('q')`` of rows it replaces: ``len``, ``rows[i]``,
iteration, ``tobytes``/``frombytes`` (a snapshot's bytes are the rows as native
int64s, as before: `storage.format.snapshot`), plus `take` (many at once, with
numpy) and `drop_head`. Indices count from the column's first held record (the
log's ``base``). No threads, no I/O.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LogRows"]

I64 = npt.NDArray[np.int64]


class LogRows:
    """A column of detail rows (int64), one a log record, held as segments of
    consecutive rows (see the module docstring).

    Internally an index ``i`` is ``j = i + _off`` (``_off``: records dropped from
    the head so far), and the row at ``j`` is ``_delta[s] + j`` for the last
    segment ``s`` with ``_start[s] <= j``."""

    __slots__ = ("_delta", "_n", "_off", "_start")

    def __init__(self) -> None:
        self._start = array("q")  # each segment's first index (internal, ascending)
        self._delta = array("q")  # each segment's ``row - index``
        self._off = 0
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def segments(self) -> int:
        """Segments held (one after ingestion without gaps)."""
        return len(self._start)

    def append_range(self, first: int, n: int) -> None:
        """Append the rows ``first .. first + n - 1``."""
        if n <= 0:
            return
        j = self._off + self._n
        delta = first - j
        if not self._n or self._delta[-1] != delta:
            self._start.append(j)
            self._delta.append(delta)
        self._n += n

    def extend(self, rows: Iterable[int] | I64) -> None:
        """Append rows (integers, in log order)."""
        if isinstance(rows, range) and rows.step == 1:
            self.append_range(rows.start, len(rows))
            return
        r = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        m = len(r)
        if not m:
            return
        j0 = self._off + self._n
        delta = r - np.arange(j0, j0 + m, dtype=np.int64)
        new = np.empty(m, dtype=bool)
        new[0] = not self._n or self._delta[-1] != int(delta[0])
        new[1:] = delta[1:] != delta[:-1]
        at = np.flatnonzero(new)
        self._start.frombytes((at + j0).tobytes())
        self._delta.frombytes(np.ascontiguousarray(delta[at]).tobytes())
        self._n += m

    def frombytes(self, raw: bytes) -> None:
        """Append rows given as native int64 bytes (`tobytes`)."""
        self.extend(np.frombuffer(raw, dtype=np.int64))

    def __getitem__(self, i: int) -> int:
        """The row of index ``i`` (``0 <= i < len``)."""
        if not 0 <= i < self._n:
            raise IndexError(f"log row index {i} out of range 0..{self._n - 1}")
        j = i + self._off
        return self._delta[bisect_right(self._start, j) - 1] + j

    def take(self, idx: npt.NDArray[Any]) -> I64:
        """The rows of indices ``idx`` (integers, each ``0 <= i < len``), int64."""
        j = np.asarray(idx, dtype=np.int64) + self._off
        delta = np.frombuffer(self._delta, dtype=np.int64)
        if len(delta) == 1:
            out: I64 = j + delta[0]
            return out
        start = np.frombuffer(self._start, dtype=np.int64)
        seg = np.searchsorted(start, j, side="right") - 1
        out = delta[seg] + j
        return out

    def tail(self, i: int) -> I64:
        """The rows of indices ``i ..`` (int64)."""
        return self.take(np.arange(i, self._n, dtype=np.int64))

    def tolist(self) -> list[int]:
        return self.tail(0).tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def tobytes(self) -> bytes:
        """The rows as native int64s (a snapshot's column)."""
        return self.tail(0).tobytes()

    def drop_head(self, n: int) -> None:
        """Drop the first ``n`` records (``0 <= n <= len``): index ``n`` becomes 0."""
        if not 0 <= n <= self._n:
            raise ValueError(f"drop_head: n={n} not in 0..{self._n}")
        self._off += n
        self._n -= n
        if not self._n:
            self._start, self._delta, self._off = array("q"), array("q"), 0
            return
        s = bisect_right(self._start, self._off) - 1  # the segment holding the new head
        if s > 0:
            del self._start[:s]
            del self._delta[:s]

    def nbytes(self) -> int:
        """Bytes held by the segments' two columns."""
        return (self._start.buffer_info()[1] + self._delta.buffer_info()[1]) * 8
