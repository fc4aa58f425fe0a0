"""Domain core: the state of a shard's aggregates (key ids, key columns, detail rows).

`KeyState` holds what `Aggregates` computes on: the per-key numpy columns
(`KEY_COLUMNS`), the per-contribution detail rows, the key index, the older buckets
and the settled layer (`SettledBuckets`), with the small operations every part
shares (allotting key and cohort ids, listing a key's buckets, dropping keys, erasing
a row). The arithmetic lives in `adds`, `retraction`, `settling` and `reads`; the
theory of operation is in `aggregates`. No threads, no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core.settled import SettledBuckets

__all__ = ["DEAD", "DETAIL_COLUMNS", "KEY_COLUMNS", "RENORMALIZE_AT", "Bucket", "KeyState"]

RENORMALIZE_AT = 256.0
DEAD = 0xFFFFFFFF  # key id of a retracted detail row

Bucket = tuple[int, int, float, float, int]  # (b, count, weight_sum, fd_sum, t_max_b)

KEY_COLUMNS: dict[str, Any] = {
    "S": np.float64,  # forward-decayed sum against L
    "L": np.int64,  # landmark, ns
    "TM": np.int64,  # latest timestamp added
    "CB": np.int64,  # latest bucket: index b
    "CN": np.int64,  # ... count
    "CW": np.float64,  # ... weight sum
    "CFD": np.float64,  # ... forward-decayed sum
    "CTM": np.int64,  # ... latest timestamp
    "HL": np.int64,  # half-life of the key's signal type, ns
    "KC": np.int32,  # cohort id (cohort_names[KC[k]])
    "KE": np.uint64,  # entity id
    "KT": np.uint64,  # signal type
    "LIVE": np.uint8,  # 1 while the key has a contribution
    "AMP": np.float32,  # log2 bound on how much retractions amplified rounding (`retract_rows`)
}
DETAIL_COLUMNS = (("dk", "I"), ("dt", "q"), ("dw", "f"), ("du", "Q"), ("dm", "B"), ("dr", "q"))
_DETAIL_DTYPES = {
    "dk": np.uint32,
    "dt": np.int64,
    "dw": np.float32,
    "du": np.uint64,
    "dm": np.uint8,
    "dr": np.int64,
}


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
        "index",
        "older",
        "phys_base",
        "row_base",
        "settled",
        "settled_detail",
        "settled_upto",
        *KEY_COLUMNS,
        *(name for name, _ in DETAIL_COLUMNS),
    )

    # the per-key columns (`KEY_COLUMNS`), set in __init__ and grown by _reserve
    S: npt.NDArray[np.float64]
    L: npt.NDArray[np.int64]
    TM: npt.NDArray[np.int64]
    CB: npt.NDArray[np.int64]
    CN: npt.NDArray[np.int64]
    CW: npt.NDArray[np.float64]
    CFD: npt.NDArray[np.float64]
    CTM: npt.NDArray[np.int64]
    HL: npt.NDArray[np.int64]
    KC: npt.NDArray[np.int32]
    KE: npt.NDArray[np.uint64]
    KT: npt.NDArray[np.uint64]
    LIVE: npt.NDArray[np.uint8]
    AMP: npt.NDArray[np.float32]

    def __init__(
        self, half_life_for: Callable[[int], int], window_width_ns: int, window_buckets: int
    ) -> None:
        self._hl = half_life_for
        self._hl_cache: dict[int, int] = {}
        self._width = window_width_ns
        self._n = window_buckets
        self._cap = 0
        for name, dtype in KEY_COLUMNS.items():
            setattr(self, name, np.zeros(0, dtype))
        self._cid: dict[str, int] = {}
        self.cohort_names: list[str] = []  # cohort id -> name
        self.cohorts: dict[str, int] = {}  # cohort -> number of live keys
        self.index: dict[tuple[str, int, int], int] = {}  # live key -> key id
        # key ids allotted so far; a key id's (cohort, entity, type) is in the KC, KE
        # and KT columns (`key`), not in a list of tuples: a list the cyclic GC would
        # walk item by item in every full collection
        self._nkeys = 0
        # key id -> b -> (n, w, fd, tmax): tuples of numbers, so the cyclic GC stops
        # tracking them (and their dicts) and a full collection does not walk them
        self.older: dict[int, dict[int, tuple[int, float, float, int]]] = {}
        self.dk = array("I")  # detail rows: key id (DEAD once retracted)
        self.dt = array("q")  # timestamp ns
        self.dw = array("f")  # float32 weight
        self.du = array("Q")  # user id
        self.dm = array("B")  # membership shard
        self.dr = array("q")  # rseq (record sequence number in its membership shard)
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
        return self.phys_base + len(self.dk)

    @property
    def held(self) -> int:
        """Detail rows held (not settled)."""
        return self.row_end - self.row_base

    def view(self, name: str) -> npt.NDArray[Any]:
        """A numpy view of the held rows of detail column ``name`` (``dk`` .. ``dr``):
        index it with ``row - row_base``. No view may outlive a call that adds or
        settles rows."""
        return np.frombuffer(getattr(self, name), dtype=_DETAIL_DTYPES[name])[
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
        return self.cohort_names[self.KC[k]], int(self.KE[k]), int(self.KT[k])

    @property
    def keys(self) -> list[tuple[str, int, int]]:
        """``(cohort, entity, type)`` of every key id allotted so far, in id order."""
        n = self._nkeys
        names = self.cohort_names
        return list(
            zip(
                map(names.__getitem__, self.KC[:n].tolist()),
                self.KE[:n].tolist(),
                self.KT[:n].tolist(),
            )
        )

    def _reserve(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(1024, self._cap)
        while cap < n:
            cap += cap // 2
        for name, dtype in KEY_COLUMNS.items():
            old = getattr(self, name)
            col = np.zeros(cap, dtype)
            col[: len(old)] = old
            setattr(self, name, col)
        self._cap = cap

    def cohort_id(self, cohort: str) -> int | None:
        """The id ``KC`` holds for ``cohort``'s keys, or None if it never had one."""
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
        self.dk[i] = DEAD
        self.dt[i] = 0
        self.dw[i] = 0.0
        self.du[i] = 0
        self.dr[i] = -1

    def _drop_keys(self, ks: Sequence[int]) -> None:
        """Forget keys' state (no contribution left); their ids are not reused.

        Every column but the cohort id is zeroed (one vectorized assignment per column
        for all of ``ks``): the entity id, the timestamps and the sums of a key whose
        contributions a purge removed must not outlive it in a snapshot (erasure)."""
        gone = []
        for k in ks:
            if not self.LIVE[k]:
                continue
            key = self.key(k)
            if self.index.pop(key, None) is None:
                continue
            n = self.cohorts[key[0]] - 1
            if n:
                self.cohorts[key[0]] = n
            else:
                del self.cohorts[key[0]]
            self.older.pop(k, None)
            gone.append(k)
        if gone:
            at = np.array(gone, dtype=np.int64)
            for name in KEY_COLUMNS:
                if name != "KC":
                    getattr(self, name)[at] = 0

    def _buckets(self, k: int) -> list[Bucket]:
        """Every non-empty bucket of key ``k``: ``(b, count, weight_sum, fd_sum, t_max_b)``."""
        out: list[Bucket] = []
        cn = int(self.CN[k])
        if cn:
            out.append(
                (int(self.CB[k]), cn, float(self.CW[k]), float(self.CFD[k]), int(self.CTM[k]))
            )
        older = self.older.get(k)
        if older:
            out.extend((b, bk[0], bk[1], bk[2], bk[3]) for b, bk in older.items())
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
        return np.flatnonzero((self.KC[:n] == cid) & (self.LIVE[:n] != 0)).tolist()
