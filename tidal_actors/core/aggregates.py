"""Domain core: cohort aggregates (forward-decayed scores and bucketed windows).

Owns the arithmetic of one ledger shard's aggregates; no threads, no I/O.

Theory of operation
-------------------
Every key ``(cohort, entity_id, signal_type)`` gets a *key id* ``k`` (ids are never
reused; `key(k)` names the key from the ``key_cohort``, ``key_entity`` and ``key_type``
columns, ``index`` maps a live key to its id). A key's state lives in numpy columns
indexed by ``k`` (`KEY_COLUMNS` in `key_state`, which documents each), not in a
Python object per key: a million keys cost ~93 MB of columns instead of a million
GC-tracked lists, and a batch of contributions is added with a handful of vectorized
operations. The parts: `key_state` (columns, detail rows, key ids), `adds`,
`settling`, `retraction` and `reads`; `Aggregates` composes them.

* ``landmark[k]`` is the key's landmark (ns) and
  ``fd_sum[k] = sum(w_i * 2 ** ((t_i - landmark) / h))`` the forward-decayed sum
  (Cormode, Shkapenyuk, Srivastava, Xu, "Forward Decay: A Practical Time Decay Model
  for Streaming Systems", ICDE 2009). Adding and retracting a contribution are exact
  inverses and order-independent, unlike a lazily decayed ``(score, last_ns)`` pair.
  When ``(t - landmark) / h`` passes ``RENORMALIZE_AT`` the landmark moves to ``t``
  and every stored sum is rescaled, so nothing overflows. ``t_max[k]`` is the latest
  timestamp added (after retractions an upper bound of the latest remaining one,
  exact again once the key is refolded, `core.retraction`), ``key_half_life[k]`` (``h``) the half-life of the key's type.
* Buckets ``b = t // width`` each hold ``count, weight_sum, fd_sum, t_max_b``. The
  latest bucket sits in columns (``latest_b``, ``latest_count``, ``latest_wsum``,
  ``latest_fd``, ``latest_t_max``): most contributions land there. Earlier buckets
  are rows of ``older`` (`older_buckets.OlderBuckets`: per key a segment of columns
  ``b, count, wsum, fd, tmax``, sorted by ``b``, only for keys that have some).
  Every bucket that holds a contribution is kept, so a window read at any time is
  exact and ``fd_sum`` is always the sum of the buckets' ``fd`` (re-derived
  with ``math.fsum`` after a retraction to drop rounding residue).
* Adding a batch: keys are looked up with numpy (`key_index.KeyIndex.find_keys`:
  the codes computed and probed in the index's hash table column-wise; no Python
  object a key, so the cyclic GC has nothing to walk), new keys are given ids
  together, then every contribution that falls in its key's
  latest bucket (the common case) is added with ``np.add.at``; the others (a newer
  bucket, a late contribution, a landmark move) go one by one, after, which gives the
  same state as adding all in order.
* Every contribution also gets a *detail row* in parallel columns (`DETAIL_COLUMNS`):
  key id (u32), timestamp (i64), weight (f32), user (u64), membership shard (u8) and
  record sequence number ``rseq`` (i64): 33 bytes. The contribution log points into
  them (it holds no copy), reads inside a bucket are exact from them, and
  re-materialization rebuilds a cohort from them. A retracted row has key id
  ``DEAD`` and its other fields zeroed (erasure in memory).

Reads: ``score(at) = sum(w_i * 2 ** (-(at - t_i) / h))`` over contributions with
``t_i <= at``. If ``at >= t_max`` this is ``fd_sum * 2 ** (-(at - landmark) / h)``.
Otherwise buckets after ``b(at)`` are left out, and the bucket ``b(at)`` itself, when
some of it lies after ``at``, is summed row by row from the detail columns. A
contribution stamped after the read time is never counted, so none ever weighs more
than its weight. The window at ``at`` covers buckets ``b(at)-n+1 .. b(at)`` whole.
Reads of many keys (``top``, ``rows``) compute the same numbers as a read of one key,
bit for bit.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import numpy as np

from tidal_actors.core import sets
from tidal_actors.core.adds import Adds
from tidal_actors.core.key_index import KeyIndex
from tidal_actors.core.key_state import DETAIL_COLUMNS, KEY_COLUMNS, key_codes
from tidal_actors.core.older_buckets import OLDER_COLUMNS
from tidal_actors.core.reads import Reads
from tidal_actors.core.retraction import Retraction
from tidal_actors.core.settling import Settling

__all__ = ["Aggregates", "AggregatesSnapshot"]

# the key columns a rebuilt cohort must hold exactly as the live one (`same_cohort`)
_SAME_EXACTLY = (
    "key_entity",
    "key_type",
    "landmark",
    "t_max",
    "latest_b",
    "latest_t_max",
    "latest_count",
)


def _pair_codes(agg: Aggregates, ks: np.ndarray) -> np.ndarray | None:
    """``type << 44 | entity`` (uint64) of keys ``ks`` of one cohort, or None if one
    does not fit (an entity from 2**44 or a type from 2**20)."""
    e, t = agg.key_entity[ks], agg.key_type[ks]
    if len(ks) and (int(e.max()) >> 44 or int(t.max()) >> 20):
        return None
    out: np.ndarray = (t << np.uint64(44)) | e
    return out


def _close(x: np.ndarray, y: np.ndarray) -> bool:
    """``math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)`` of every pair (equal
    values are close, infinities included)."""
    with np.errstate(invalid="ignore"):
        tol = np.maximum(1e-9 * np.maximum(np.abs(x), np.abs(y)), 1e-300)
        return bool(np.all((x == y) | (np.abs(x - y) <= tol)))


class AggregatesSnapshot(TypedDict):
    """`Aggregates.dump`: the whole state as msgpack-able values (`storage.format.snapshot`)."""

    names: list[str]  # cohort id -> name
    n: int  # key ids allotted
    cols: dict[str, bytes]  # `KEY_COLUMNS` tag -> the column's first ``n`` items
    detail: dict[str, bytes]  # `DETAIL_COLUMNS` tag -> the held rows
    older_keys: bytes  # int64: the key id of each older bucket
    older: list[Any]  # five an older bucket: b, count, weight sum, fd sum, t_max
    row_base: NotRequired[int]  # first held detail row (absent: 0)
    settled: NotRequired[dict[str, bytes]]  # `SettledBuckets.dump`
    settled_upto: NotRequired[dict[int, int]]  # membership shard -> 1 + highest rseq settled


class Aggregates(Reads, Retraction, Settling, Adds):
    """The decayed scores and windows of every cohort one ledger shard owns.

    Args:
        half_life_for: signal type -> half-life in ns.
        window_width_ns: bucket width in ns.
        window_buckets: number of buckets a window read covers.
    """

    __slots__ = ()

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: ``detail_rows`` (per held contribution),
        ``settled_buckets`` (per key and bucket with settled contributions),
        ``key_columns``, ``key_index`` (`KeyIndex.nbytes`: its columns, and the
        wide codes' dict) and ``older_buckets`` (per key with earlier buckets)."""
        detail = sum(
            getattr(self, name).buffer_info()[1] * getattr(self, name).itemsize
            for name in DETAIL_COLUMNS
        )
        columns = self.key_column_bytes()
        index = self.index.nbytes()
        older = self.older.nbytes()
        settled = self.settled.nbytes()
        return {
            "detail_rows": detail,
            "key_columns": columns,
            "key_index": index,
            "older_buckets": older,
            "settled_buckets": settled,
        }

    # -- re-materialization ------------------------------------------------------------

    def live_key_ids(self, cohort: str, other: Aggregates) -> tuple[np.ndarray, np.ndarray]:
        """``(oks, ks)``: the ids of ``other``'s live keys of ``cohort`` and, one for
        one, the ids of the same keys here (int64 arrays; a rebuild's keys, every
        one of them live here).

        Raises:
            KeyError: a key of ``other`` is not live here.
        """
        oks = np.array(other.cohort_key_ids(cohort), dtype=np.int64)
        cid = self.cohort_id(cohort)
        if not len(oks):
            return oks, oks.copy()
        if cid is None:
            raise KeyError(f"cohort {cohort!r} has no key here")
        mine = np.array(self.cohort_key_ids(cohort), dtype=np.int64)
        pair = _pair_codes(self, mine), _pair_codes(other, oks)
        if pair[0] is not None and pair[1] is not None and len(mine):
            # the cohort's live keys here sorted by (type, entity), each of other's
            # found among them with one search (no dict lookup a key)
            order = np.argsort(pair[0], kind="stable")
            sorted_codes = pair[0][order]
            at = np.minimum(np.searchsorted(sorted_codes, pair[1]), len(mine) - 1)
            if not np.array_equal(sorted_codes[at], pair[1]):
                raise KeyError(f"a key of cohort {cohort!r} is not live here")
            return oks, mine[order[at]]
        codes = key_codes(
            np.full(len(oks), cid, dtype=np.int64), other.key_entity[oks], other.key_type[oks]
        )
        found = list(map(self.index.get, codes))
        if None in found:
            raise KeyError(f"a key of cohort {cohort!r} is not live here")
        return oks, np.array(found, dtype=np.int64)

    def same_cohort(self, cohort: str, other: Aggregates) -> bool:
        """Whether ``other`` holds the same keys of ``cohort`` with the same scores (at
        each key's later latest timestamp) and windows (every bucket's count and
        weight), floats to relative 1e-9, and the same timestamps (landmark, latest
        contribution, latest bucket and each bucket's latest contribution), exactly: a
        timestamp left by a purged record (a retraction does not move them) makes the
        rebuild be installed, so the record's time is erased too.

        On columns, a few numpy operations for all the cohort's keys (a
        re-materialization compares a cohort of 100,000 keys in one handler)."""
        a = np.array(self.cohort_key_ids(cohort), dtype=np.int64)
        b = np.array(other.cohort_key_ids(cohort), dtype=np.int64)
        if len(a) != len(b):
            return False
        a = a[np.lexsort((self.key_type[a], self.key_entity[a]))]
        b = b[np.lexsort((other.key_type[b], other.key_entity[b]))]
        for name in _SAME_EXACTLY:
            if not np.array_equal(getattr(self, name)[a], getattr(other, name)[b]):
                return False
        # the score at the (equal) latest timestamp: `Reads._score` after t_max
        at = self.t_max[a]
        scores = []
        for agg, ks in ((self, a), (other, b)):
            s = agg.fd_sum[ks] * np.exp2(-(at - agg.landmark[ks]) / agg.key_half_life[ks])
            scores.append(np.maximum(s, 0.0))
        cn = self.latest_count[a] != 0  # the latest bucket is one of the key's buckets
        if not (_close(*scores) and _close(self.latest_wsum[a][cn], other.latest_wsum[b][cn])):
            return False
        la, ra = self.older.segment_rows(a)
        lb, rb = other.older.segment_rows(b)
        if not np.array_equal(la, lb):
            return False
        mo, oo = self.older, other.older
        return all(
            np.array_equal(getattr(mo, name)[ra], getattr(oo, name)[rb])
            for name in ("b", "count", "tmax")
        ) and _close(mo.wsum[ra], oo.wsum[rb])

    def install_cohort(self, cohort: str, other: Aggregates, ks: np.ndarray) -> None:
        """Replace ``cohort``'s key states with ``other``'s (re-materialization).

        ``ks`` (int64) gives, for each of ``other``'s live keys of ``cohort`` in
        `cohort_key_ids` order, the id of the same key here, a live one
        (`live_key_ids`): the state installed for that key takes that id, the one
        this shard's detail rows use; the cohort's keys not among them (every
        record of theirs left out) are dropped. A few numpy operations for all the
        cohort's keys.
        """
        at = np.asarray(ks, dtype=np.int64)
        mine = np.array(self.cohort_key_ids(cohort), dtype=np.int64)
        self._drop_keys(mine[~sets.isin(mine, at)])
        self.older.drop_many(at)
        oks = np.array(other.cohort_key_ids(cohort), dtype=np.int64)
        if not len(oks):
            return
        for name in KEY_COLUMNS:  # one vectorized copy per column
            if name != "key_cohort":
                getattr(self, name)[at] = getattr(other, name)[oks]
        self.older.copy_from(at, other.older, oks)

    # -- snapshots -------------------------------------------------------------------

    def dump(self) -> AggregatesSnapshot:
        """The whole state as plain values and bytes (for a snapshot; see `load`)."""
        n = self._nkeys
        ok, ocols = self.older.dump()
        oflat: list[Any] = []
        for row in zip(*(ocols[name].tolist() for name in OLDER_COLUMNS)):
            oflat.extend(row)
        return {
            "names": self.cohort_names,
            "n": n,
            "cols": {
                col.tag: getattr(self, name)[:n].tobytes() for name, col in KEY_COLUMNS.items()
            },
            "detail": {
                col.tag: getattr(self, name)[self.row_base - self.phys_base :].tobytes()
                for name, col in DETAIL_COLUMNS.items()
            },
            "older_keys": ok.tobytes(),
            "older": oflat,
            "row_base": self.row_base,
            "settled": self.settled.dump(),
            "settled_upto": self.settled_upto,
        }

    def load(self, state: AggregatesSnapshot) -> None:
        """Inverse of `dump` (on an empty instance)."""
        self.cohort_names = list(state["names"])
        self._cid = {c: i for i, c in enumerate(self.cohort_names)}
        n = state["n"]
        self._cap = 0
        self._reserve(n)
        for name, col in KEY_COLUMNS.items():
            raw = state["cols"].get(col.tag)
            if raw is not None:  # a column a snapshot lacks stays 0
                getattr(self, name)[:n] = np.frombuffer(raw, dtype=col.dtype)
        for name, col in DETAIL_COLUMNS.items():
            getattr(self, name).frombytes(state["detail"][col.tag])
        # a snapshot without ``row_base`` holds every row
        self.row_base = self.phys_base = state.get("row_base", 0)
        self.settled_upto = dict(state.get("settled_upto", {}))
        if "settled" in state:
            self.settled.load(state["settled"])
        names = self.cohort_names
        self._nkeys = n
        live = np.flatnonzero(self.live[:n])
        self.index = KeyIndex()
        self.index.update_keys(
            self.key_cohort[live], self.key_entity[live], self.key_type[live], live
        )
        counts = np.bincount(self.key_cohort[:n][self.live[:n] != 0], minlength=len(names)).tolist()
        self.cohorts = {names[c]: m for c, m in enumerate(counts) if m}
        ok = np.frombuffer(state["older_keys"], dtype=np.int64)
        flat = state["older"]
        cols = {
            name: np.array(flat[i::5], dtype=dtype)
            for i, (name, dtype) in enumerate(OLDER_COLUMNS.items())
        }
        order = np.lexsort((cols["b"], ok))  # the layout a snapshot's writer chose
        self.older.load_sorted(ok[order], {name: col[order] for name, col in cols.items()})
