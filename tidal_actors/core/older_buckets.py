"""Domain core: each key's earlier buckets, as columns (`OlderBuckets`).

A key's *latest* bucket lives in the key columns (`key_state.KEY_COLUMNS`); its earlier
buckets, the ones a window read or a read in the past still needs, live here: one row
per (key, bucket) in five numpy columns, ``b`` (bucket index, ``t // width``),
``count``, ``wsum`` (weight sum), ``fd`` (forward-decayed sum against the key's
landmark) and ``tmax`` (latest timestamp in the bucket, ns).

Layout: the rows of key ``k`` are one segment of the columns (`segments.Segments`:
how segments are handed out, moved, reused and compacted), sorted by ``b``. A key's
latest bucket moves here when a newer one opens, so it always goes to the end of the
segment (`push_newest`, vectorized over a batch's keys). No Python object per bucket:
40 bytes a bucket plus the segments' spare room, and nothing the cyclic GC walks.

No threads, no I/O.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets
from tidal_actors.core.segments import FIRST_CAP, Segments, room

__all__ = ["OLDER_COLUMNS", "OlderBucket", "OlderBuckets"]

OlderBucket = tuple[int, float, float, int]  # (count, weight_sum, fd_sum, t_max_b)

# the columns, in the order of a snapshot's five values a bucket (`Aggregates.dump`)
OLDER_COLUMNS: dict[str, type[np.generic]] = {
    "b": np.int64,
    "count": np.int64,
    "wsum": np.float64,
    "fd": np.float64,
    "tmax": np.int64,
}


class OlderBuckets(Segments):
    """The earlier buckets of every key of one shard's aggregates (see the module)."""

    __slots__ = ("b", "count", "fd", "tmax", "wsum")

    COLUMNS = OLDER_COLUMNS

    b: npt.NDArray[np.int64]
    count: npt.NDArray[np.int64]
    wsum: npt.NDArray[np.float64]
    fd: npt.NDArray[np.float64]
    tmax: npt.NDArray[np.int64]

    # -- reading -----------------------------------------------------------------------

    def __contains__(self, k: int) -> bool:
        return k < len(self.length) and bool(self.length[k])

    def __iter__(self) -> Iterator[int]:
        """The key ids that have earlier buckets."""
        return iter(np.flatnonzero(self.length).tolist())

    def have(self, ks: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """For each key id of ``ks``, whether it has earlier buckets."""
        ks = np.asarray(ks, dtype=np.int64)
        out = np.zeros(len(ks), dtype=bool)
        inside = ks < len(self.length)
        out[inside] = self.length[ks[inside]] > 0
        return out

    def __len__(self) -> int:
        return int(np.count_nonzero(self.length))

    def newest_b(self, ks: npt.NDArray[np.int64], none: int) -> npt.NDArray[np.int64]:
        """For each key id of ``ks``, its newest earlier bucket's ``b``, or ``none``."""
        ks = np.asarray(ks, dtype=np.int64)
        out = np.full(len(ks), none, dtype=np.int64)
        inside = np.flatnonzero(ks < len(self.length))
        kk = ks[inside]
        n = self.length[kk]
        has = n > 0
        out[inside[has]] = self.b[self.start[kk[has]] + n[has] - 1]
        return out

    def rows(self, k: int) -> list[tuple[int, int, float, float, int]]:
        """Key ``k``'s earlier buckets, ``(b, count, wsum, fd, tmax)``, by ``b``."""
        if k >= len(self.length):
            return []
        n = int(self.length[k])
        if not n:
            return []
        s = int(self.start[k])
        e = s + n
        return list(
            zip(
                self.b[s:e].tolist(),
                self.count[s:e].tolist(),
                self.wsum[s:e].tolist(),
                self.fd[s:e].tolist(),
                self.tmax[s:e].tolist(),
            )
        )

    def segment_rows(
        self, ks: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """For key ids ``ks``: how many earlier buckets each has, and the rows of
        them all, key after key, each key's by ``b`` (index the columns with them)."""
        ks = np.asarray(ks, dtype=np.int64)
        lens = np.zeros(len(ks), dtype=np.int64)
        starts = np.zeros(len(ks), dtype=np.int64)
        inside = ks < len(self.length)
        lens[inside] = self.length[ks[inside]]
        starts[inside] = self.start[ks[inside]]
        offs = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        return lens, np.repeat(starts, lens) + offs

    def of(self, k: int) -> dict[int, OlderBucket]:
        """Key ``k``'s earlier buckets as ``{b: (count, wsum, fd, tmax)}``."""
        return {r[0]: r[1:] for r in self.rows(k)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OlderBuckets):
            return NotImplemented
        mine, theirs = list(self), list(other)
        return mine == theirs and all(self.rows(k) == other.rows(k) for k in mine)

    __hash__ = None  # type: ignore[assignment]

    def _find(self, k: int, b: int) -> tuple[int, bool]:
        """Where bucket ``b`` of key ``k`` is (its row) or would go, and whether it is
        (a binary search of the segment's ``b`` on the ``array`` under it, no copy)."""
        it = self.items
        s = it["start"][k]
        e = s + it["length"][k]
        bs = it["b"]
        row = bisect.bisect_left(bs, b, s, e)
        return row, row < e and bs[row] == b

    def get(self, k: int, b: int) -> OlderBucket | None:
        """Bucket ``b`` of key ``k`` as ``(count, wsum, fd, tmax)``, or None."""
        if k not in self:
            return None
        row, hit = self._find(k, b)
        if not hit:
            return None
        return (
            int(self.count[row]),
            float(self.wsum[row]),
            float(self.fd[row]),
            int(self.tmax[row]),
        )

    def nbytes(self) -> int:
        """Bytes held: the columns as allocated (rows handed out to segments and the
        room the columns grew by), and the per-key arrays."""
        cols = sum(int(getattr(self, name).nbytes) for name in OLDER_COLUMNS)
        return cols + self.start.nbytes + self.length.nbytes + self.cap.nbytes

    # -- writing -----------------------------------------------------------------------

    def put(self, k: int, b: int, bucket: OlderBucket) -> None:
        """Set bucket ``b`` of key ``k`` to ``(count, wsum, fd, tmax)``, adding it
        in ``b`` order if the key has none there. Plain Python on the ``array``
        objects under the columns (`Segments.items`)."""
        self._keys(k + 1)
        it = self.items
        n = it["length"][k]
        if n:
            row, hit = self._find(k, b)
        else:
            row, hit = it["start"][k], False
        if not hit:
            if n == it["cap"][k]:
                i = row - it["start"][k]
                row = self._move(k, room(n + 1)) + i  # may grow the columns
            end = it["start"][k] + n
            if row < end:  # (an empty slice assigned to an exported array raises)
                for name in OLDER_COLUMNS:
                    col = it[name]
                    col[row + 1 : end + 1] = col[row:end]  # the slice read is a copy
            it["b"][row] = b
            it["length"][k] = n + 1
        it["count"][row], it["wsum"][row], it["fd"][row], it["tmax"][row] = bucket

    def push_one(self, k: int, b: int, count: int, wsum: float, fd: float, tmax: int) -> None:
        """`put` of bucket ``b`` of key ``k`` where ``b`` is later than every bucket the
        key has here (its latest bucket moving aside), in plain Python on the
        ``array`` objects under the columns (`Segments.items`): a few item reads and
        writes, a segment move when the key's is full. A ``b`` that is not later
        goes to `put`."""
        it = self.items
        if k >= len(it["length"]):
            self._keys(k + 1)
        n = it["length"][k]
        if n:
            s = it["start"][k]
            if it["b"][s + n - 1] >= b:
                self.put(k, b, (count, wsum, fd, tmax))
                return
            if n == it["cap"][k]:
                self._move(k, room(n + 1))
                self._compact_if_sparse()
                s = it["start"][k]
        else:
            if not it["cap"][k]:
                self._move(k, FIRST_CAP)
            s = it["start"][k]
        row = s + n
        it["b"][row] = b
        it["count"][row] = count
        it["wsum"][row] = wsum
        it["fd"][row] = fd
        it["tmax"][row] = tmax
        it["length"][k] = n + 1

    def add_record(self, k: int, b: int, w: float, wf: float, ts: int) -> None:
        """Add one contribution (weight ``w``, forward-decayed ``wf``, at ``ts`` ns) to
        bucket ``b`` of key ``k``, the bucket made if the key has none there: `put` of
        ``(count + 1, wsum + w, fd + wf, max(tmax, ts))``, the row found once."""
        it = self.items
        if k < len(it["length"]) and it["length"][k]:
            row, hit = self._find(k, b)
            if hit:
                it["count"][row] = it["count"][row] + 1
                it["wsum"][row] = it["wsum"][row] + w
                it["fd"][row] = it["fd"][row] + wf
                if ts > it["tmax"][row]:
                    it["tmax"][row] = ts
                return
        self.put(k, b, (1, w, wf, ts))

    def remove(self, k: int, b: int) -> None:
        """Forget bucket ``b`` of key ``k`` (nothing if it has none there)."""
        if k not in self:
            return
        row, hit = self._find(k, b)
        if not hit:
            return
        end = int(self.start[k] + self.length[k])
        for name in OLDER_COLUMNS:
            col = getattr(self, name)
            col[row : end - 1] = col[row + 1 : end].copy()
        self.length[k] -= 1
        if not self.length[k]:
            self._release(k)

    def scale_fd(self, k: int, factor: float) -> None:
        """Multiply the forward-decayed sums of key ``k``'s buckets by ``factor`` (a
        landmark move)."""
        if k in self:
            s = int(self.start[k])
            self.fd[s : s + int(self.length[k])] *= factor

    def drop(self, k: int) -> None:
        """Forget every earlier bucket of key ``k``."""
        if k < len(self.length):
            self._release(k)

    def drop_many(self, ks: npt.NDArray[np.int64]) -> None:
        """`drop` of keys ``ks`` (distinct), at once."""
        ks = np.asarray(ks, dtype=np.int64)
        ks = ks[ks < len(self.length)]
        old = self.cap[ks]
        for cap in sets.unique(old[old > 0]).tolist():
            self._free.setdefault(cap, array("q")).extend(self.start[ks[old == cap]].tolist())
        self._free_rows += int(old.sum())
        self.length[ks] = 0
        self.cap[ks] = 0

    def copy_from(
        self, ks: npt.NDArray[np.int64], other: OlderBuckets, oks: npt.NDArray[np.int64]
    ) -> None:
        """Keys ``ks`` (distinct, with no earlier buckets here) take the earlier
        buckets of ``other``'s keys ``oks`` (one for one): `replace` of many keys at
        once, a few numpy operations for all."""
        ks = np.asarray(ks, dtype=np.int64)
        lens, src = other.segment_rows(oks)
        has = lens > 0
        ks, lens = ks[has], lens[has]
        if not len(ks):
            return
        self._keys(int(ks.max()) + 1)
        # `room(n)`: the least power of two at least n (frexp(n - 1): n - 1 = m * 2**e)
        caps = np.maximum(np.left_shift(1, np.frexp((lens - 1).astype(np.float64))[1]), FIRST_CAP)
        caps = caps.astype(np.int64)
        starts = self._alloc_many(caps)
        offs = np.arange(len(src), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        dst = np.repeat(starts, lens) + offs
        for name in OLDER_COLUMNS:
            getattr(self, name)[dst] = getattr(other, name)[src]
        self.start[ks], self.length[ks], self.cap[ks] = starts, lens, caps

    def replace(self, k: int, buckets: Mapping[int, OlderBucket]) -> None:
        """Key ``k``'s earlier buckets become ``buckets`` (``{b: (count, wsum, fd,
        tmax)}``; empty: none)."""
        self._keys(k + 1)
        self._release(k)
        n = len(buckets)
        if not n:
            return
        cap = room(n)
        at = self._alloc(cap)
        bs = sorted(buckets)
        self.b[at : at + n] = bs
        cols = list(zip(*map(buckets.__getitem__, bs)))
        self.count[at : at + n] = cols[0]
        self.wsum[at : at + n] = cols[1]
        self.fd[at : at + n] = cols[2]
        self.tmax[at : at + n] = cols[3]
        self.start[k], self.length[k], self.cap[k] = at, n, cap

    def push_newest(
        self,
        ks: npt.NDArray[np.int64],
        b: npt.NDArray[np.int64],
        count: npt.NDArray[np.int64],
        wsum: npt.NDArray[np.float64],
        fd: npt.NDArray[np.float64],
        tmax: npt.NDArray[np.int64],
    ) -> None:
        """Append one bucket to each of keys ``ks`` (distinct), each later than every
        bucket the key has here (its latest bucket moving aside): a few numpy
        operations for all, a segment move for each key whose segment is full."""
        if not len(ks):
            return
        self._keys(int(ks.max()) + 1)
        full = self.length[ks] >= self.cap[ks]
        if full.any():
            self._move_many(ks[full])
        at = self.start[ks] + self.length[ks]
        self.b[at] = b
        self.count[at] = count
        self.wsum[at] = wsum
        self.fd[at] = fd
        self.tmax[at] = tmax
        self.length[ks] += 1

    def load_sorted(self, ks: npt.NDArray[np.int64], cols: dict[str, npt.NDArray[Any]]) -> None:
        """Install many keys' buckets at once into empty `OlderBuckets`: ``ks`` the key
        of each bucket, sorted by key and then ``b``; ``cols`` the five columns
        (``b``, ``count``, ``wsum``, ``fd``, ``tmax``), in the same order.

        Raises:
            ValueError: this instance already holds buckets.
        """
        if self._top:
            raise ValueError("load_sorted needs empty OlderBuckets")
        n = len(ks)
        if not n:
            return
        keys, first, per = sets.unique(ks, index=True, counts=True)
        self._keys(int(keys[-1]) + 1)
        self._rows(n)
        for name in OLDER_COLUMNS:
            getattr(self, name)[:n] = cols[name]
        self._top = n
        self.start[keys] = first
        self.length[keys] = per
        self.cap[keys] = per

    def dump(self) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[Any]]]:
        """Every bucket: its key ids and the five columns, sorted by key and ``b``
        (the input `load_sorted` takes)."""
        keys = np.flatnonzero(self.length)
        if not len(keys):
            return np.zeros(0, np.int64), {n: np.zeros(0, d) for n, d in OLDER_COLUMNS.items()}
        lens = self.length[keys]
        ks = np.repeat(keys, lens)
        # each bucket's row: its key's start + its place in the segment
        offs = np.arange(len(ks)) - np.repeat(np.cumsum(lens) - lens, lens)
        rows = np.repeat(self.start[keys], lens) + offs
        return ks.astype(np.int64), {name: getattr(self, name)[rows] for name in OLDER_COLUMNS}
