"""Domain core: the settled sums of contributions whose detail rows were dropped.

Owns the layer `Aggregates.settle` fills: per (key id, bucket) the count, weight
sum, decayed sum at the bucket's latest settled timestamp ``hi`` (``fd = sum(w * 2
** ((t - hi) / h))``: every factor at most 1, so it never overflows, whatever the
bucket width in half-lives), and the first and last timestamp of the contributions
whose 33-byte detail rows left memory. Only adds reach it (no retraction: a purge names
held rows only), so its sums carry no cancellation, and `Retraction._refold` can
sum a key again exactly from its held rows plus these.

Layout: seven numpy columns (``k b n w f lo hi``, 56 bytes an entry) and a dict
from ``(k << 64) | (b mod 2**64)`` (one int) to the entry's row; about 130 bytes an
entry in all, against ~500 for a dict of tuples. An entry dropped (`drop_keys`)
leaves a hole (``k = -1``) until `compact`. No threads, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets

__all__ = ["SettledBuckets"]

_MASK = (1 << 64) - 1
_COLS = {
    "k": np.int64,
    "b": np.int64,
    "n": np.int64,
    "w": np.float64,
    "f": np.float64,
    "lo": np.int64,
    "hi": np.int64,
}
Entry = tuple[int, int, float, float, int, int]  # (b, n, w, fd_b, lo, hi)


def _column(values: Iterable[Any], dtype: type[np.generic]) -> npt.NDArray[Any]:
    """``values`` as a numpy column of ``dtype`` (an array as it is, if it has it)."""
    if isinstance(values, np.ndarray):
        return values.astype(dtype, copy=False)
    return np.fromiter(values, dtype=dtype)


def _among(ck: npt.NDArray[np.int64], want: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """For each key id of ``ck`` (-1: a hole), whether it is among ``want`` (key ids,
    not negative): one gather from a mask over the key ids, not a search per entry
    (the columns hold every settled bucket of a shard, millions at full size)."""
    top = max(int(want.max()), int(ck.max()) if len(ck) else 0) + 1
    mask = np.zeros(top + 1, dtype=bool)  # the last slot, False, is a hole's (-1)
    mask[want] = True
    out: npt.NDArray[np.bool_] = mask[ck]
    return out


class SettledBuckets:
    """Settled sums per (key id, bucket); see the module docstring."""

    def __init__(self) -> None:
        self.size = 0
        self.holes = 0
        self.index: dict[int, int] = {}
        self.cols: dict[str, npt.NDArray[Any]] = {c: np.zeros(0, dtype=t) for c, t in _COLS.items()}

    def __len__(self) -> int:
        return len(self.index)

    def _reserve(self, n: int) -> None:
        cap = len(self.cols["k"])
        if n <= cap:
            return
        cap = max(1024, cap)
        while cap < n:
            cap += cap // 2
        for c, col in self.cols.items():
            new = np.zeros(cap, dtype=col.dtype)
            new[: self.size] = col[: self.size]
            self.cols[c] = new

    def add(
        self,
        k: Iterable[int],
        b: Iterable[int],
        n: Iterable[int],
        w: Iterable[float],
        f: Iterable[float],
        lo: Iterable[int],
        hi: Iterable[int],
        h: Iterable[int],
    ) -> None:
        """Merge one sum per (key, bucket) (each pair at most once in a call):
        existing entries in one vectorized step per column, new ones appended.
        ``h`` is each key's half-life (ns): merging two decayed sums brings both to
        the later latest timestamp first."""
        kk, bb, nn, ll, hh, hl = (_column(x, np.int64) for x in (k, b, n, lo, hi, h))
        ww, ff = _column(w, np.float64), _column(f, np.float64)
        if not len(kk):
            return
        keys = [(ki << 64) | (bi & _MASK) for ki, bi in zip(kk.tolist(), bb.tolist())]
        found = list(map(self.index.get, keys))
        old = np.array([r is not None for r in found], dtype=bool)
        c = self.cols
        if old.any():
            rows = np.array([r for r in found if r is not None], dtype=np.int64)
            was, now = c["hi"][rows], hh[old]
            top = np.maximum(was, now)
            c["n"][rows] += nn[old]
            c["w"][rows] += ww[old]
            c["f"][rows] = c["f"][rows] * np.exp2((was - top) / hl[old]) + ff[old] * np.exp2(
                (now - top) / hl[old]
            )
            c["lo"][rows] = np.minimum(c["lo"][rows], ll[old])
            c["hi"][rows] = top
        new = ~old
        m = int(new.sum())
        if not m:
            return
        first = self.size
        self._reserve(first + m)
        c = self.cols
        for name, col in (
            ("k", kk),
            ("b", bb),
            ("n", nn),
            ("w", ww),
            ("f", ff),
            ("lo", ll),
            ("hi", hh),
        ):
            c[name][first : first + m] = col[new]
        self.index.update(
            zip((key for key, is_new in zip(keys, new.tolist()) if is_new), range(first, first + m))
        )
        self.size = first + m

    def get(self, k: int, b: int) -> Entry | None:
        """The entry of key ``k``'s bucket ``b``, or None."""
        row = self.index.get((k << 64) | (b & _MASK))
        if row is None:
            return None
        c = self.cols
        return (
            b,
            int(c["n"][row]),
            float(c["w"][row]),
            float(c["f"][row]),
            int(c["lo"][row]),
            int(c["hi"][row]),
        )

    def rows_of_keys(self, ks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The rows of ``cols`` holding an entry of one of the keys ``ks`` (one scan)."""
        if not len(ks) or not self.index:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(sets.isin(self.cols["k"][: self.size], ks))

    def of_keys(self, ks: Iterable[int]) -> dict[int, list[Entry]]:
        """Every entry of the keys ``ks`` (one scan of the columns)."""
        want = np.fromiter(ks, dtype=np.int64)
        out: dict[int, list[Entry]] = {}
        if not len(want) or not self.index:
            return out
        c = {name: col[: self.size] for name, col in self.cols.items()}
        rows = np.flatnonzero(sets.isin(c["k"], want))
        for row in rows.tolist():
            out.setdefault(int(c["k"][row]), []).append(
                (
                    int(c["b"][row]),
                    int(c["n"][row]),
                    float(c["w"][row]),
                    float(c["f"][row]),
                    int(c["lo"][row]),
                    int(c["hi"][row]),
                )
            )
        return out

    def drop_keys(self, ks: Iterable[int]) -> None:
        """Forget every entry of the keys ``ks`` (their values are zeroed: erasure)."""
        want = _column(ks, np.int64)
        if not len(want) or not self.index:
            return
        ck = self.cols["k"][: self.size]
        rows = np.flatnonzero(_among(ck, want))
        if not len(rows):
            return
        index = self.index
        for k, b in zip(ck[rows].tolist(), self.cols["b"][rows].tolist()):
            del index[(k << 64) | (b & _MASK)]
        for name, col in self.cols.items():
            col[rows] = -1 if name == "k" else 0
        self.holes += len(rows)
        if self.holes * 2 > self.size:
            self.compact()

    def compact(self) -> None:
        """Close the holes `drop_keys` left."""
        keep = np.flatnonzero(self.cols["k"][: self.size] >= 0)
        for name, col in self.cols.items():
            self.cols[name] = col[keep].copy()
        self.size = len(keep)
        self.holes = 0
        ck, cb = self.cols["k"].tolist(), self.cols["b"].tolist()
        self.index = {(k << 64) | (b & _MASK): i for i, (k, b) in enumerate(zip(ck, cb))}

    def nbytes(self) -> int:
        """Approximate bytes held (columns, and ~72 bytes a dict entry with its int)."""
        return sum(col.nbytes for col in self.cols.values()) + 72 * len(self.index)

    def dump(self) -> dict[str, bytes]:
        """The live entries' columns as bytes (a snapshot)."""
        keep = np.flatnonzero(self.cols["k"][: self.size] >= 0)
        return {name: col[keep].tobytes() for name, col in self.cols.items()}

    def load(self, state: dict[str, bytes]) -> None:
        """Inverse of `dump` (on an empty instance)."""
        for name, dtype in _COLS.items():
            self.cols[name] = np.frombuffer(state[name], dtype=dtype).copy()
        self.size = len(self.cols["k"])
        self.compact()
