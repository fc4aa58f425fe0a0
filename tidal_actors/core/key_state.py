"""Domain core: the state of a shard's aggregates (key ids, key columns, detail rows).

`KeyState` holds what `Aggregates` computes on: the per-key numpy columns
(`KEY_COLUMNS`, laid out in `key_columns`, whose names are re-exported here), the
per-contribution detail rows, the key index, the older buckets
and the settled layer (`SettledBuckets`), with the small operations every part
shares (allotting key and cohort ids, listing a key's buckets, dropping keys, erasing
a row). The arithmetic lives in `adds`, `retraction`, `settling` and `reads`; the
theory of operation is in `aggregates`. No threads, no I/O.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import is_
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core import sets
from tidal_actors.core.key_codes import KeyCode, key_code, key_codes
from tidal_actors.core.key_columns import (
    DEAD,
    DETAIL_COLUMNS,
    KEY_COLUMNS,
    RENORMALIZE_AT,
    Bucket,
    Column,
)
from tidal_actors.core.key_index import KeyIndex
from tidal_actors.core.older_buckets import OlderBuckets
from tidal_actors.core.settled import SettledBuckets

__all__ = [
    "DEAD",
    "DETAIL_COLUMNS",
    "KEY_COLUMNS",
    "RENORMALIZE_AT",
    "Bucket",
    "Column",
    "KeyCode",
    "KeyState",
    "key_code",
    "key_codes",
]


class KeyState:
    """The state of one ledger shard's aggregates: key ids, key columns, detail rows.

    Args:
        half_life_for: signal type -> half-life in ns.
        window_width_ns: bucket width in ns.
        window_buckets: number of buckets a window read covers.
    """

    __slots__ = (
        "_cap",
        "_cid",
        "_hl",
        "_hl_cache",
        "_n",
        "_nkeys",
        "_width",
        "cohort_names",
        "cohorts",
        "drop_epoch",
        "index",
        "items",
        "older",
        "phys_base",
        "row_base",
        "settled",
        "settled_detail",
        "settled_upto",
        *KEY_COLUMNS,
        *DETAIL_COLUMNS,
    )

    # the per-key columns (`KEY_COLUMNS`), set in __init__ and grown by _reserve: each
    # a numpy view of an anonymous memory map, of which ``items`` holds a
    # ``memoryview`` of the same name that the per-record paths (`core.record_adds`)
    # index instead (an item read gives a Python number at half the cost of
    # ``ndarray.item``)
    items: dict[str, Any]  # memoryviews cast to the column's item format
    fd_sum: npt.NDArray[np.float64]
    landmark: npt.NDArray[np.int64]
    t_max: npt.NDArray[np.int64]
    latest_b: npt.NDArray[np.int64]
    latest_count: npt.NDArray[np.int64]
    latest_wsum: npt.NDArray[np.float64]
    latest_fd: npt.NDArray[np.float64]
    latest_t_max: npt.NDArray[np.int64]
    key_half_life: npt.NDArray[np.int64]
    key_cohort: npt.NDArray[np.int32]
    key_entity: npt.NDArray[np.uint64]
    key_type: npt.NDArray[np.uint64]
    live: npt.NDArray[np.uint8]
    rounding_amp: npt.NDArray[np.float32]

    def __init__(
        self, half_life_for: Callable[[int], int], window_width_ns: int, window_buckets: int
    ) -> None:
        self._hl = half_life_for
        self._hl_cache: dict[int, int] = {}
        self._width = window_width_ns
        self._n = window_buckets
        self._nkeys = 0
        self._grow(0)
        self._cid: dict[str, int] = {}
        self.cohort_names: list[str] = []  # cohort id -> name
        self.cohorts: dict[str, int] = {}  # cohort -> number of live keys
        self.index = KeyIndex()  # live key (`key_code`) -> key id
        # incremented before any key leaves ``index`` (`_drop_keys`): a published view
        # sharing ``index`` tells a miss it cannot trust by it (`core.published`)
        self.drop_epoch = np.zeros(1, dtype=np.int64)
        # key ids allotted so far; a key id's (cohort, entity, type) is in the key_cohort,
        # key_entity and key_type columns (`key`), not in a list of tuples: a list the cyclic GC would
        # walk item by item in every full collection (set before the columns, above)
        # each key's earlier buckets, as columns
        self.older = OlderBuckets()
        # the detail rows (`DETAIL_COLUMNS`)
        self.row_key = array("I")
        self.row_ts = array("q")
        self.row_weight = array("f")
        self.row_user = array("Q")
        self.row_mshard = array("B")
        self.row_rseq = array("q")
        # detail rows ``row_base ..`` are held (row ids stay absolute); the ones before
        # were settled (`settle`) into per-(key, bucket) sums. The arrays start at
        # row ``phys_base``: settled rows are cut from their front only once they are
        # half of them (one memmove per half, not one per settle)
        self.row_base = 0
        self.phys_base = 0
        self.settled = SettledBuckets()
        # membership shard -> 1 + the highest rseq settled: a shard's rows reach a
        # ledger in rseq order, so its settled records are exactly those below
        self.settled_upto: dict[int, int] = {}
        # (key id, t_lo, t_hi) -> [(ts, w)] of the settled records in that range, read
        # from the durable history; None in an ephemeral database (`_past_terms`)
        self.settled_detail: Callable[[int, int, int], list[tuple[int, float]]] | None = None

    @property
    def row_end(self) -> int:
        """One past the last detail row (rows are numbered from 0, forever)."""
        return self.phys_base + len(self.row_key)

    @property
    def held(self) -> int:
        """Detail rows held (not settled)."""
        return self.row_end - self.row_base

    def view(self, name: str) -> npt.NDArray[Any]:
        """A numpy view of the held rows of detail column ``name`` (`DETAIL_COLUMNS`):
        index it with ``row - row_base``. No view may outlive a call that adds or
        settles rows."""
        return np.frombuffer(getattr(self, name), dtype=DETAIL_COLUMNS[name].dtype)[
            self.row_base - self.phys_base :
        ]

    def half_life(self, stype: int) -> int:
        h = self._hl_cache.get(stype)
        if h is None:
            h = self._hl_cache[stype] = self._hl(stype)
        return h

    @property
    def key_total(self) -> int:
        """Key ids allotted so far (live or not)."""
        return self._nkeys

    def key(self, k: int) -> tuple[str, int, int]:
        """``(cohort, entity, type)`` of key id ``k``."""
        return self.cohort_names[self.key_cohort[k]], int(self.key_entity[k]), int(self.key_type[k])

    def key_id(self, cohort: str, entity: int, stype: int) -> int | None:
        """The id of live key ``(cohort, entity, stype)``, or None if it has none."""
        cid = self._cid.get(cohort)
        return None if cid is None else self.index.get(key_code(cid, entity, stype))

    def cohort_ids_of(self, cs: Sequence[str]) -> list[int]:
        """The cohort id of each name in ``cs``, one given to a cohort without one."""
        cids = list(map(self._cid.get, cs))
        if None in cids:
            for c in dict.fromkeys(compress(cs, map(is_, cids, repeat(None)))):
                self._cohort_id(c)
            cids = list(map(self._cid.__getitem__, cs))
        return cids  # type: ignore[return-value]

    @property
    def keys(self) -> list[tuple[str, int, int]]:
        """``(cohort, entity, type)`` of every key id allotted so far, in id order."""
        n = self._nkeys
        names = self.cohort_names
        return list(
            zip(
                map(names.__getitem__, self.key_cohort[:n].tolist()),
                self.key_entity[:n].tolist(),
                self.key_type[:n].tolist(),
            )
        )

    def _reserve(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(1024, self._cap)
        while cap < n:
            cap += cap // 2
        self._grow(cap)

    def _grow(self, cap: int) -> None:
        """Give every key column room for ``cap`` keys: a new anonymous memory map
        each, the column a numpy view of it and ``items[name]`` a ``memoryview`` of
        it (item by item, Python numbers, as an ``array`` gives them); the allotted
        keys' items are copied. A map's pages read as zeros and take memory only once
        written, so the capacity past the keys costs address space, not memory."""
        items: dict[str, Any] = {}
        n = self._nkeys
        for name, spec in KEY_COLUMNS.items():
            dt = np.dtype(spec.dtype)
            buf = mmap.mmap(-1, max(cap, 1) * dt.itemsize)
            col = np.frombuffer(buf, dtype=dt, count=cap)
            old = getattr(self, name, None)
            if old is not None:
                m = min(len(old), n)
                col[:m] = old[:m]
            setattr(self, name, col)
            view: Any = memoryview(buf)
            items[name] = view.cast(dt.char)
        self.items = items
        self._cap = cap

    def __getstate__(self) -> dict[str, Any]:
        """The slots, but the key columns (memory maps, which do not pickle): their
        allotted keys' items as bytes, made into columns again on load."""
        state = dict(getattr(self, "__dict__", {}))
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name not in KEY_COLUMNS and name != "items" and hasattr(self, name):
                    state[name] = getattr(self, name)
        n = self._nkeys
        state["items"] = {name: getattr(self, name)[:n].tobytes() for name in KEY_COLUMNS}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        raw: dict[str, bytes] = state.pop("items")
        for name, value in state.items():
            setattr(self, name, value)
        n = self._nkeys
        self._nkeys = 0  # nothing to copy: the columns are new
        self._grow(max(self._cap, n))
        self._nkeys = n
        for name, spec in KEY_COLUMNS.items():
            getattr(self, name)[:n] = np.frombuffer(raw[name], dtype=spec.dtype)

    def key_column_bytes(self) -> int:
        """Bytes the key columns take: the allotted keys' items (the capacity past
        them is never written, so it takes no memory, `_grow`)."""
        return self._nkeys * sum(np.dtype(spec.dtype).itemsize for spec in KEY_COLUMNS.values())

    def cohort_id(self, cohort: str) -> int | None:
        """The id ``key_cohort`` holds for ``cohort``'s keys, or None if it never had one."""
        return self._cid.get(cohort)

    def cohort_id_for(self, cohort: str) -> int:
        """``cohort``'s id, given one if it has none yet (no key is made)."""
        return self._cohort_id(cohort)

    def _cohort_id(self, cohort: str) -> int:
        cid = self._cid.get(cohort)
        if cid is None:
            cid = self._cid[cohort] = len(self.cohort_names)
            self.cohort_names.append(cohort)
        return cid

    def erase_row(self, row: int) -> None:
        """Mark a held row retracted and zero its fields (the aggregates are not touched)."""
        i = row - self.phys_base
        self.row_key[i] = DEAD
        self.row_ts[i] = 0
        self.row_weight[i] = 0.0
        self.row_user[i] = 0
        self.row_rseq[i] = -1

    def _drop_keys(self, ks: Sequence[int] | npt.NDArray[np.int64]) -> None:
        """Forget keys' state (no contribution left); their ids are not reused.

        Every column but the cohort id is zeroed (one vectorized assignment per column
        for all of ``ks``): the entity id, the timestamps and the sums of a key whose
        contributions a purge removed must not outlive it in a snapshot (erasure).
        A few numpy operations and one index removal a key, whatever their number."""
        if not len(ks):
            return
        self.drop_epoch[0] += 1
        ids = np.asarray(ks, dtype=np.int64)
        ids = ids[self.live[ids] != 0]
        pop = self.index.pop
        codes = key_codes(self.key_cohort[ids], self.key_entity[ids], self.key_type[ids])
        found = np.fromiter((pop(c, None) is not None for c in codes), dtype=bool, count=len(ids))
        gone = ids[found]
        if not len(gone):
            return
        cids, per = sets.unique(self.key_cohort[gone], counts=True)
        names = self.cohort_names
        for cid, m in zip(cids.tolist(), per.tolist()):
            cohort = names[cid]
            n = self.cohorts[cohort] - m
            if n:
                self.cohorts[cohort] = n
            else:
                del self.cohorts[cohort]
        self.older.drop_many(gone)
        for name in KEY_COLUMNS:
            if name != "key_cohort":
                getattr(self, name)[gone] = 0

    def _buckets(self, k: int) -> list[Bucket]:
        """Every non-empty bucket of key ``k``: ``(b, count, weight_sum, fd_sum, t_max_b)``."""
        out: list[Bucket] = []
        cn = int(self.latest_count[k])
        if cn:
            out.append(
                (
                    int(self.latest_b[k]),
                    cn,
                    float(self.latest_wsum[k]),
                    float(self.latest_fd[k]),
                    int(self.latest_t_max[k]),
                )
            )
        if k in self.older:
            out.extend(self.older.rows(k))
        return out

    def key_count(self) -> int:
        """Number of live keys over all cohorts."""
        return len(self.index)

    def cohort_key_ids(self, cohort: str) -> list[int]:
        """Ids of the live keys of ``cohort``."""
        cid = self._cid.get(cohort)
        if cid is None:
            return []
        n = self._nkeys
        return np.flatnonzero((self.key_cohort[:n] == cid) & (self.live[:n] != 0)).tolist()
