"""Domain core: sorted runs of (user, cohort) pair codes, the storage of the
contribution log's pair index (`pair_index`).

A *pair key* names a (user, cohort id) pair. Narrow keys (the usual case) are one
uint64 *pair code*, ``user << COHORT_BITS | cohort_id``, for users below
``2 ** (64 - COHORT_BITS)`` and cohort ids below ``2 ** COHORT_BITS``; otherwise an
index holds wide keys: two uint64 columns, the cohort id in ``k`` and the user in
``u``, ordered by ``(u, k)`` (a two-key `np.lexsort`). Both orders are the order of
``(user, cohort id)``, so narrow keys turn into wide ones without a sort
(`widen`).

A `Run` is a batch of (key, log position) entries sorted by key, then position; a
removed entry keeps its slot with position ``GONE`` (a tombstone) until the run is
rewritten. Runs cover disjoint, ascending position ranges, so concatenating runs in
age order and sorting by key (stably) keeps each pair's positions ascending. `Counts`
holds a sorted column of per-pair counts with a dict of point updates over it. The
layout follows the log-structured merge tree (O'Neil, Cheng, Gawlick, O'Neil, "The
Log-Structured Merge-Tree", Acta Informatica 33, 1996) with size-tiered merging.
No threads, no I/O.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "COHORT_BITS",
    "GONE",
    "LOADED",
    "Counts",
    "Run",
    "encode",
    "fits",
    "group",
    "order",
    "span",
]

COHORT_BITS = 20
_MASK = np.uint64((1 << COHORT_BITS) - 1)
_SHIFT = np.uint64(COHORT_BITS)
_U64_MAX = 2**64 - 1
GONE = -1  # the position of a removed entry
LOADED = -1  # the level of a run loaded whole (`Run`): merged with no other

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Key = tuple[U64, U64 | None]  # (k, u): narrow codes and None, or cohort ids and users


def fits(users: U64, cids: npt.NDArray[Any]) -> bool:
    """Whether every pair of ``users`` (uint64) and ``cids`` has a narrow code."""
    return not len(users) or (
        int(users.max()) >> (64 - COHORT_BITS) == 0 and int(cids.max()) >> COHORT_BITS == 0
    )


def encode(users: U64, cids: npt.NDArray[Any], wide: bool) -> Key:
    """The keys of pairs ``users`` (uint64) and ``cids`` (integer): narrow codes (which
    must fit, `fits`) or, if ``wide``, the two columns."""
    c = np.asarray(cids).astype(np.uint64)
    if wide:
        return c, np.asarray(users, dtype=np.uint64).copy()
    return (np.asarray(users, dtype=np.uint64) << _SHIFT) | c, None


def widen(k: U64) -> tuple[U64, U64]:
    """Narrow codes as wide keys ``(cohort ids, users)``, in the same order."""
    return k & _MASK, k >> _SHIFT


def decode(k: U64, u: U64 | None) -> tuple[U64, U64]:
    """``(users, cohort ids)`` of keys."""
    if u is None:
        return k >> _SHIFT, k & _MASK
    return u, k


def order(k: U64, u: U64 | None) -> I64:
    """The stable permutation that sorts keys (ties keep their order)."""
    if u is None:
        return np.argsort(k, kind="stable")
    return np.lexsort((k, u))


def span(k: U64, u: U64 | None, user: int, cid: int) -> tuple[int, int]:
    """``(a, b)``: the slice of sorted keys equal to the pair (user, cid); one
    `searchsorted` call for both ends (of a code and the next one)."""
    if u is None:
        if user >> (64 - COHORT_BITS) or cid >> COHORT_BITS:
            return 0, 0  # no narrow code: not among narrow keys
        code = (user << COHORT_BITS) | cid
        if code == _U64_MAX:  # the largest code: code + 1 does not fit, it ends the keys
            return int(k.searchsorted(np.uint64(code))), len(k)
        a, b = k.searchsorted(np.array([code, code + 1], dtype=np.uint64)).tolist()
        return a, b
    if user == _U64_MAX:
        a, b = int(u.searchsorted(np.uint64(user))), len(u)
    else:
        a, b = u.searchsorted(np.array([user, user + 1], dtype=np.uint64)).tolist()
    if a == b:
        return a, a
    c0, c1 = k[a:b].searchsorted(np.array([cid, cid + 1], dtype=np.uint64)).tolist()
    return a + c0, a + c1


def group(k: U64, u: U64 | None) -> I64:
    """Start of each run of equal keys in sorted keys."""
    if not len(k):
        return np.zeros(0, dtype=np.int64)
    new = k[1:] != k[:-1]
    if u is not None:
        new |= u[1:] != u[:-1]
    return np.flatnonzero(np.r_[True, new])


def take(key: Key, idx: npt.NDArray[Any]) -> Key:
    """The keys at ``idx`` (indices or a mask)."""
    k, u = key
    return k[idx], None if u is None else u[idx]


def concat(keys: list[Key]) -> Key:
    """Keys one after another (all narrow or all wide; an empty narrow one goes
    with wide ones)."""
    k = np.concatenate([x[0] for x in keys]) if keys else np.zeros(0, np.uint64)
    if any(x[1] is not None for x in keys):
        return k, np.concatenate([x[1] if x[1] is not None else x[0] for x in keys])
    return k, None


def sum_by_key(key: Key, n: I64) -> tuple[Key, I64]:
    """Unique sorted keys and the sum of ``n`` over each."""
    if not len(key[0]):
        return key, n
    o = order(*key)
    key, n = take(key, o), n[o]
    starts = group(*key)
    return take(key, starts), np.add.reduceat(n, starts)


def match(table: Key, query: Key) -> I64:
    """For each query key, the index of the equal key in ``table`` (unique keys),
    or -1."""
    nt = len(table[0])
    both = concat([table, query])
    o = order(*both)  # stable: a table key comes before equal queries
    starts = group(*take(both, o))
    flag = np.zeros(len(o), dtype=np.int64)
    flag[starts] = 1
    gid = np.cumsum(flag) - 1
    first = o[starts]
    hit = np.where(first < nt, first, -1)
    out = np.empty(len(query[0]), dtype=np.int64)
    qslot = o >= nt
    out[o[qslot] - nt] = hit[gid[qslot]]
    return out


class Run:
    """Entries (pair key, log position) sorted by key, then position; ``dead``
    entries are tombstones. ``p0 .. p1`` bounds the positions the run covers; a
    position is stored as its offset from ``p0``, a uint32 (4 bytes) when the run
    spans fewer than ``2**32 - 1`` positions, else an int64; a tombstone's offset
    is the dtype's largest value. ``level`` counts the merges the run took
    (`PairStore` merges runs of one level together; `LOADED`: none).

    The keys are held once per pair (a *group*: the pair's key in ``k`` and ``u``,
    where its entries start in ``starts``), not once per entry: a pair has several
    records in a run (about 4 a pair at 5M records on ``bench_ingest``'s shapes,
    so 12 bytes a group instead of 8 an entry). `keys` gives them per entry."""

    __slots__ = ("dead", "k", "level", "off", "p0", "p1", "starts", "u")

    off: npt.NDArray[Any]  # uint32 or int64
    starts: npt.NDArray[Any]  # uint32 or int64: group g's entries are starts[g] .. starts[g + 1]

    def __init__(self, key: Key, pos: I64, p0: int, p1: int, level: int) -> None:
        """``key``: the entries' keys, sorted; ``pos``: their positions (int64,
        ``p0 <= pos < p1``, none `GONE`)."""
        first = group(*key)
        self.k, self.u = take(key, first)
        self.starts = self._starts(first, len(pos))
        dtype = np.uint32 if p1 - p0 < 0xFFFFFFFF else np.int64
        self.off = (pos - p0).astype(dtype)
        self.p0, self.p1 = p0, p1
        self.level = level
        self.dead = 0

    @staticmethod
    def _starts(first: npt.NDArray[Any], n: int) -> npt.NDArray[Any]:
        """Group starts ``first`` and the end ``n``, as the narrowest dtype that holds ``n``."""
        return np.append(first, n).astype(np.uint32 if n < 0xFFFFFFFF else np.int64)

    def __len__(self) -> int:
        return len(self.off)

    def keys(self) -> Key:
        """Each entry's key (sorted)."""
        st = self.starts.astype(np.int64)
        n = st[1:] - st[:-1]
        return self.k.repeat(n), None if self.u is None else self.u.repeat(n)

    def span(self, user: int, cid: int) -> tuple[int, int]:
        """``(a, b)``: the entries of the pair (user, cid) (`span` of its group)."""
        g0, g1 = span(self.k, self.u, user, cid)
        if g0 == g1:
            return 0, 0
        return int(self.starts[g0]), int(self.starts[g1])

    def _gone(self) -> int:
        return int(np.iinfo(self.off.dtype).max)

    def live(self) -> npt.NDArray[np.bool_]:
        """Which entries are not tombstones."""
        live: npt.NDArray[np.bool_] = self.off != self._gone()
        return live

    def positions(self, a: int = 0, b: int | None = None) -> I64:
        """The positions of entries ``a .. b`` (int64; `GONE` for a tombstone)."""
        off = self.off[a:b]
        pos = off.astype(np.int64) + self.p0
        pos[off == self._gone()] = GONE
        return pos

    def kill(self, a: int, b: int, mask: npt.NDArray[np.bool_]) -> None:
        """Make entries ``a .. b`` where ``mask`` is true tombstones (live ones)."""
        self.off[a:b][mask] = self._gone()
        self.dead += int(np.count_nonzero(mask))

    def keep(self, mask: npt.NDArray[np.bool_]) -> None:
        """Keep only the entries where ``mask`` is true (a group left with none goes)."""
        if len(self.k):
            per = np.add.reduceat(mask.astype(np.int64), self.starts[:-1].astype(np.int64))
        else:
            per = np.zeros(0, dtype=np.int64)
        some = per != 0
        self.k, self.u = take((self.k, self.u), some)
        self.off = self.off[mask]
        self.starts = self._starts(np.cumsum(per[some]) - per[some], len(self.off))
        self.dead = int(np.count_nonzero(self.off == self._gone()))

    def rebase(self, p0: int) -> None:
        """Positions below ``p0`` are gone: offsets from ``p0`` on (no tombstones)."""
        self.off -= self.off.dtype.type(p0 - self.p0)
        self.p0 = p0

    def widen(self) -> None:
        self.k, self.u = widen(self.k)

    def nbytes(self) -> int:
        keys = self.k.nbytes + (0 if self.u is None else self.u.nbytes)
        return keys + self.starts.nbytes + self.off.nbytes


class Counts:
    """A count per pair key: sorted unique keys and their counts (no zeros), with
    point updates in a dict over them (`set`), folded in by `add` and `fold`."""

    FOLD_AT = 4096  # point updates held before they are folded into the columns

    def __init__(self) -> None:
        self.key: Key = (np.zeros(0, np.uint64), None)
        self.n: I64 = np.zeros(0, np.int64)
        self.over: dict[tuple[int, int], int] = {}

    def widen(self) -> None:
        self.key = widen(self.key[0])

    def get(self, user: int, cid: int) -> int:
        v = self.over.get((user, cid))
        if v is not None:
            return v
        a, b = span(*self.key, user, cid)
        return int(self.n[a]) if a < b else 0

    def set(self, user: int, cid: int, value: int) -> None:
        self.over[(user, cid)] = value
        if len(self.over) >= self.FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Fold the point updates into the columns."""
        if not self.over:
            return
        wide = self.key[1] is not None
        users = np.fromiter((p[0] for p in self.over), np.uint64, len(self.over))
        cids = np.fromiter((p[1] for p in self.over), np.uint64, len(self.over))
        okey = encode(users, cids, wide)
        on = np.fromiter(self.over.values(), np.int64, len(self.over))
        self.over = {}
        stale = match(okey, self.key) >= 0  # columns' entries the updates replace
        key = concat([take(self.key, ~stale), okey])
        n = np.concatenate([self.n[~stale], on])
        self.key, self.n = sum_by_key(key, n)  # keys are unique here: a sort
        self._drop_zeros()

    def add(self, key: Key, n: I64) -> None:
        """Add ``n`` to the counts of ``key`` (keys may repeat)."""
        self.fold()
        self.key, self.n = sum_by_key(concat([self.key, key]), np.concatenate([self.n, n]))
        self._drop_zeros()

    def _drop_zeros(self) -> None:
        nz = self.n != 0
        if not nz.all():
            self.key, self.n = take(self.key, nz), self.n[nz]

    def __bool__(self) -> bool:
        return bool(len(self.n)) or any(self.over.values())

    def nbytes(self) -> int:
        k, u = self.key
        over = sys.getsizeof(self.over) + 120 * len(self.over)  # tuple, ints
        return k.nbytes + self.n.nbytes + (0 if u is None else u.nbytes) + over
