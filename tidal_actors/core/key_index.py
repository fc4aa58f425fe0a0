"""Domain core: a ledger shard's key index, ``key code -> key id`` (`KeyIndex`).

`KeyState.index` maps each live key's `key_codes.KeyCode` to its key id. Narrow
codes (ints below 2**64, the usual case) live in an open-addressing hash table of
two columns, the codes (uint64) and the ids (uint32), with linear probing from a
Fibonacci hash (Knuth, TAOCP vol. 3, 6.4: the code times 2**64 / phi, its top bits),
grown by doubling at a load of 0.7: 12 bytes a slot, 17-34 a key, where a dict with
an int object for the code and one for the id held about 107. Wide codes (tuples,
`key_codes`) stay in a dict beside it. A batch of codes is looked up and inserted
with numpy (`find`, `update`); one code at a time in plain Python over the
``array`` objects under the columns (`get`, ``index[code] = k``).

An id slot holds `EMPTY` (never used) or `DELETED` (a key dropped: a lookup of its
code goes on past it; a slot is reused only by the same code) or the key id. Key
ids stay below `DELETED` (the detail rows' key column is uint32 with ``DEAD`` =
2**32 - 1 already).

Readers in other threads (`core.published`) call `get` while the shard's thread
inserts and drops: an insert writes the code before the id, so a reader sees a
slot whole or empty; a growth builds new columns and swaps them in with one
assignment, and a reader that probed columns swapped out meanwhile looks again in
the new ones, so a key dropped after the swap is not found there. No I/O.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_codes import KeyCode, narrow_codes

__all__ = ["DELETED", "EMPTY", "KeyIndex"]

EMPTY = 0xFFFFFFFF  # an id slot never used
DELETED = 0xFFFFFFFE  # an id slot whose key was dropped
_GOLD = 0x9E3779B97F4A7C15  # 2**64 / phi, odd
_M64 = (1 << 64) - 1
_MIN_BITS = 10
_LOAD = 0.7  # most used slots (live or deleted) a slot
_TAIL = 64  # codes left on their probe runs that a loop in Python takes over from numpy


class _Table:
    """One generation of the columns: codes, ids, and the bits of the slot count."""

    __slots__ = ("bits", "codes", "ids", "mask", "shift")

    def __init__(self, bits: int) -> None:
        n = 1 << bits
        self.bits = bits
        self.mask = n - 1
        self.shift = 64 - bits
        self.codes = array("Q", bytes(8 * n))
        self.ids = array("I", b"\xff" * (4 * n))  # EMPTY

    def np_codes(self) -> npt.NDArray[np.uint64]:
        return np.frombuffer(self.codes, dtype=np.uint64)

    def np_ids(self) -> npt.NDArray[np.uint32]:
        return np.frombuffer(self.ids, dtype=np.uint32)

    def home(self, codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Each code's first slot (vectorized Fibonacci hash)."""
        with np.errstate(over="ignore"):
            h = (codes * np.uint64(_GOLD)) >> np.uint64(self.shift)
        return h.astype(np.int64)

    def slots_of(self, codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The slot holding each code (live or `DELETED`), or -1 (vectorized probing)."""
        out = np.full(len(codes), -1, dtype=np.int64)
        h = self.home(codes)
        todo = np.arange(len(codes), dtype=np.int64)
        ids, cs, mask = self.np_ids(), self.np_codes(), self.mask
        while len(todo) > _TAIL:
            hh = h[todo]
            v = ids[hh]
            hit = (v != EMPTY) & (cs[hh] == codes[todo])
            out[todo[hit]] = hh[hit]
            go = (v != EMPTY) & ~hit
            todo = todo[go]
            h[todo] = (hh[go] + 1) & mask
        # the few on long probe runs: one at a time (a numpy round costs ~10 us)
        ida, csa = self.ids, self.codes
        for i, c, j in zip(todo.tolist(), codes[todo].tolist(), h[todo].tolist()):
            while True:
                v = ida[j]
                if v == EMPTY:
                    break
                if csa[j] == c:
                    out[i] = j
                    break
                j = (j + 1) & mask
        return out


class KeyIndex:
    """``key code -> key id`` of a shard's live keys (see the module docstring).

    Reads like the dict it replaces: ``get``, ``index[code] = k``, ``pop``,
    ``update``, ``len``, iteration over codes, ``items``, ``==`` (by contents).
    """

    __slots__ = ("_deleted", "_live", "_t", "wide")

    def __init__(self) -> None:
        self._t = _Table(_MIN_BITS)
        self._live = 0  # live narrow codes
        self._deleted = 0  # DELETED slots in _t
        self.wide: dict[KeyCode, int] = {}  # the tuple codes

    # -- one code at a time ------------------------------------------------------------

    def get(self, code: KeyCode, default: int | None = None) -> int | None:
        """The id of ``code``, or ``default``."""
        if type(code) is not int:
            if isinstance(code, tuple):
                return self.wide.get(code, default)
            code = operator.index(code)  # a numpy integer: filed as the int it equals
        while True:
            t = self._t
            mask, codes, ids = t.mask, t.codes, t.ids
            h = ((code * _GOLD) & _M64) >> t.shift
            while True:
                v = ids[h]
                if v == EMPTY:
                    k = default
                    break
                if codes[h] == code:
                    k = default if v == DELETED else v
                    break
                h = (h + 1) & mask
            if t is self._t:  # else swapped meanwhile: look again in the new columns
                return k

    def __contains__(self, code: KeyCode) -> bool:
        return self.get(code) is not None

    def __getitem__(self, code: KeyCode) -> int:
        k = self.get(code)
        if k is None:
            raise KeyError(code)
        return k

    def __setitem__(self, code: KeyCode, k: int) -> None:
        """File ``code`` under id ``k`` (``0 <= k < DELETED``)."""
        if type(code) is not int:
            if isinstance(code, tuple):
                self.wide[code] = k
                return
            code = operator.index(code)
        if not 0 <= k < DELETED:
            raise ValueError(f"key id {k} out of range 0..{DELETED - 1}")
        self._room(1)
        t = self._t
        mask, codes, ids = t.mask, t.codes, t.ids
        h = ((code * _GOLD) & _M64) >> t.shift
        while True:
            v = ids[h]
            if v == EMPTY:
                codes[h] = code  # the code first: a reader sees the slot whole or empty
                ids[h] = k
                self._live += 1
                return
            if codes[h] == code:
                if v == DELETED:
                    self._deleted -= 1
                    self._live += 1
                ids[h] = k
                return
            h = (h + 1) & mask

    def pop(self, code: KeyCode, default: int | None = None) -> int | None:
        """Remove ``code``; its id, or ``default`` if it has none."""
        if type(code) is not int:
            if isinstance(code, tuple):
                return self.wide.pop(code, default)
            code = operator.index(code)
        t = self._t
        mask, codes, ids = t.mask, t.codes, t.ids
        h = ((code * _GOLD) & _M64) >> t.shift
        while True:
            v = ids[h]
            if v == EMPTY:
                return default
            if codes[h] == code:
                if v == DELETED:
                    return default
                ids[h] = DELETED
                self._live -= 1
                self._deleted += 1
                return v
            h = (h + 1) & mask

    # -- many at once ------------------------------------------------------------------

    def find(self, codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The id of each narrow code (uint64), -1 where it has none."""
        while True:
            t = self._t
            codes = np.asarray(codes, dtype=np.uint64)
            slots = t.slots_of(codes)
            out = np.full(len(codes), -1, dtype=np.int64)
            at = slots >= 0
            v = t.np_ids()[slots[at]].astype(np.int64)
            v[v == DELETED] = -1
            out[at] = v
            if t is self._t:
                return out

    def find_keys(
        self, cids: npt.NDArray[Any], es: npt.NDArray[Any], types: npt.NDArray[Any]
    ) -> npt.NDArray[np.int64]:
        """The id of each key (cohort ids, entities and types, integer arrays of one
        length), -1 where it has none: narrow codes with numpy, tuples one by one."""
        codes, narrow = narrow_codes(cids, es, types)
        if narrow.all():
            return self.find(codes)
        out = np.full(len(codes), -1, dtype=np.int64)
        out[narrow] = self.find(codes[narrow])
        get = self.wide.get
        wide = np.flatnonzero(~narrow)
        tuples = zip(
            np.asarray(cids)[wide].tolist(),
            np.asarray(es)[wide].tolist(),
            np.asarray(types)[wide].tolist(),
        )
        out[wide] = [get(code, -1) for code in tuples]
        return out

    def update_keys(
        self,
        cids: npt.NDArray[Any],
        es: npt.NDArray[Any],
        types: npt.NDArray[Any],
        ks: npt.NDArray[np.int64],
    ) -> None:
        """File distinct keys (cohort ids, entities and types, integer arrays of one
        length) under ids ``ks``: narrow codes with numpy, tuples one by one."""
        codes, narrow = narrow_codes(cids, es, types)
        ks = np.asarray(ks, dtype=np.int64)
        self.update_narrow(codes[narrow], ks[narrow])
        wide = np.flatnonzero(~narrow)
        if len(wide):
            tuples = zip(
                np.asarray(cids)[wide].tolist(),
                np.asarray(es)[wide].tolist(),
                np.asarray(types)[wide].tolist(),
            )
            self.wide.update(zip(tuples, ks[wide].tolist()))

    def update_ids(self, codes: Sequence[KeyCode], first: int) -> None:
        """File distinct ``codes``, none of them live here (new keys), under ids
        ``first, first + 1, ...``: with numpy when every code is narrow (an int), else
        code by code (`update`)."""
        try:
            arr = np.fromiter(codes, dtype=np.uint64, count=len(codes))
        except (TypeError, ValueError, OverflowError):  # a tuple among them
            self.update(zip(codes, range(first, first + len(codes))))
            return
        self.update_narrow(arr, np.arange(first, first + len(codes), dtype=np.int64), True)

    def update(self, pairs: Iterable[tuple[KeyCode, int]]) -> None:
        """File each ``(code, id)`` (codes distinct)."""
        narrow_c: list[int] = []
        narrow_k: list[int] = []
        for code, k in pairs:
            if isinstance(code, tuple):
                self.wide[code] = k
            else:
                narrow_c.append(operator.index(code))
                narrow_k.append(k)
        if narrow_c:
            self.update_narrow(
                np.array(narrow_c, dtype=np.uint64), np.array(narrow_k, dtype=np.int64)
            )

    def update_narrow(
        self, codes: npt.NDArray[np.uint64], ks: npt.NDArray[np.int64], absent: bool = False
    ) -> None:
        """File narrow ``codes`` (uint64, distinct) under ids ``ks`` with numpy;
        ``absent``: the caller knows none of them is live here (new keys), so with no
        dropped slot to reuse they are not looked up first."""
        if not len(codes):
            return
        if int(ks.min()) < 0 or int(ks.max()) >= DELETED:
            raise ValueError(f"key ids out of range 0..{DELETED - 1}")
        self._room(len(codes))
        t = self._t
        if absent and not self._deleted:
            self._live += len(codes)
            self._fill(t, codes, ks)
            return
        ids = t.np_ids()
        slots = t.slots_of(codes)
        old = slots >= 0  # filed already (live or dropped): the slot takes the new id
        if old.any():
            was = ids[slots[old]]
            self._deleted -= int(np.count_nonzero(was == DELETED))
            self._live += int(np.count_nonzero(was == DELETED))
            ids[slots[old]] = ks[old]
        new = ~old
        self._live += int(np.count_nonzero(new))
        self._fill(t, codes[new], ks[new])

    def _room(self, n: int) -> None:
        """Before ``n`` more codes: past a load of `_LOAD`, file the live codes in new
        columns (twice as many slots, or more, until they are at most half full; as
        many if dropped slots made the load) and swap them in."""
        t = self._t
        if self._live + self._deleted + n <= _LOAD * (t.mask + 1):
            return
        bits = _MIN_BITS
        while self._live + n > (1 << bits) // 2:
            bits += 1
        new = _Table(bits)
        ids = t.np_ids()
        live = (ids != EMPTY) & (ids != DELETED)
        self._fill(new, t.np_codes()[live], ids[live].astype(np.int64))
        self._t = new  # one assignment: readers of the old columns look again (`get`)
        self._deleted = 0

    @staticmethod
    def _fill(t: _Table, codes: npt.NDArray[np.uint64], ks: npt.NDArray[np.int64]) -> None:
        """File distinct codes absent from ``t``, with room for them, with numpy: each
        round, of the codes whose slot is free one for each slot takes it, the others
        move on one slot. A slot's code is written before its id (a reader sees a slot
        whole or empty)."""
        ids, cs = t.np_ids(), t.np_codes()
        todo = np.arange(len(codes), dtype=np.int64)
        h = t.home(codes)
        while len(todo) > _TAIL:
            free = np.flatnonzero(ids[h] == EMPTY)
            hf, cf = h[free], codes[todo[free]]
            cs[hf] = cf  # of codes sharing a free slot, the last written takes it
            won = cs[hf] == cf  # (codes are distinct)
            take = free[won]
            ids[hf[won]] = ks[todo[take]]
            rest = np.ones(len(todo), dtype=bool)
            rest[take] = False
            todo, h = todo[rest], (h[rest] + 1) & t.mask
        ida, csa, mask = t.ids, t.codes, t.mask  # the last few one at a time
        for c, k, j in zip(codes[todo].tolist(), ks[todo].tolist(), h.tolist()):
            while ida[j] != EMPTY:
                j = (j + 1) & mask
            csa[j] = c
            ida[j] = k

    # -- the whole -----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._live + len(self.wide)

    def items(self) -> list[tuple[KeyCode, int]]:
        """Every ``(code, id)``: the narrow ones by slot, then the wide ones."""
        t = self._t
        ids = t.np_ids()
        live = (ids != EMPTY) & (ids != DELETED)
        out: list[tuple[KeyCode, int]] = list(zip(t.np_codes()[live].tolist(), ids[live].tolist()))
        out.extend(self.wide.items())
        return out

    def __iter__(self) -> Iterator[KeyCode]:
        return iter([c for c, _ in self.items()])

    def values(self) -> list[int]:
        return [k for _, k in self.items()]

    def to_dict(self) -> dict[KeyCode, int]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyIndex):
            return self.to_dict() == other.to_dict()
        if isinstance(other, dict):
            return self.to_dict() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def nbytes(self) -> int:
        """Bytes held: the columns, and the wide codes' dict with its tuples and ints."""
        t = self._t
        out = len(t.codes) * 8 + len(t.ids) * 4
        size = sys.getsizeof
        out += size(self.wide)
        for code, k in self.wide.items():
            assert isinstance(code, tuple)
            out += size(code) + sum(map(size, code)) + (size(k) if k > 256 else 0)
        return out

    def __repr__(self) -> str:
        return f"KeyIndex({len(self)} keys, {self._t.mask + 1} slots)"
