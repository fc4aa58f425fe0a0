"""The ledger fold at its edges: batches of 127, 128 and 129 records (where
`Adds.add_columns` switches from the per-record path to the vectorized one), many
keys (the key columns and the earlier buckets' columns grow inside a batch),
timestamps far behind a key's latest bucket, very large and tiny weights, and a
pickled copy taken between batches. The per-record path of a batch is the sequence of
one-record adds, so it must equal adding each record on its own bit for bit; the
vectorized path equals it up to rounding."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DETAIL_COLUMNS, KEY_COLUMNS
from tidal_actors.core.record_adds import SMALL_BATCH

WIDTH = 1000
HALF = {1: 500, 2: 50_000, 3: 7}  # type 3: a landmark move every few thousand ns


class _Vectorized(Aggregates):
    __slots__ = ()
    small_batch = 0


def _agg(vectorized: bool = False) -> Aggregates:
    return (_Vectorized if vectorized else Aggregates)(HALF.__getitem__, WIDTH, 4)


def _f32(w: float) -> float:
    return float(np.float32(w))


WEIGHTS = st.sampled_from([0.0, 1.0, 0.5, 1e-30, 1e-38, 3e38, 1e30, 0.1]).map(_f32)
# far in the past (earlier buckets), far ahead (landmark moves), and close together
TIMESTAMPS = st.one_of(
    st.integers(0, 3_000), st.integers(0, 10**9), st.integers(10**12, 10**12 + 5_000)
)
RECORD = st.tuples(
    st.sampled_from(["a", "b", "@community"]),
    # entity: many keys, and ids past the narrow key codes (`core.key_codes`)
    st.one_of(st.integers(0, 1_500), st.sampled_from([2**44 - 1, 2**44, 2**64 - 1])),
    st.sampled_from([1, 2, 3]),
    WEIGHTS,
    TIMESTAMPS,
)


def _recs(raw: list[tuple[str, int, int, float, int]]) -> list[tuple[Any, ...]]:
    return [(0, i, 100 + e % 1_000, c, e, t, w, ts) for i, (c, e, t, w, ts) in enumerate(raw)]


def _state(a: Aggregates) -> tuple[Any, ...]:
    """Every key column (as bytes), the earlier buckets, the detail rows, the index."""
    n = a.key_total
    cols = {name: getattr(a, name)[:n].tobytes() for name in KEY_COLUMNS}
    ks, older = a.older.dump()
    rows = {name: bytes(getattr(a, name)) for name in DETAIL_COLUMNS}
    return cols, ks.tobytes(), {k: v.tobytes() for k, v in older.items()}, rows, a.index


def _sizes(n: int, first: int, top: int = SMALL_BATCH + 1) -> list[int]:
    """Cut ``n`` records into batches of ``first`` then of the switch sizes up to
    ``top`` in turn."""
    out, cycle = [], [first, *range(SMALL_BATCH - 1, top + 1), 1]
    i = 0
    while n > 0:
        s = min(n, cycle[i % len(cycle)])
        out.append(s)
        n -= s
        i += 1
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(RECORD, min_size=100, max_size=700),
    st.sampled_from([SMALL_BATCH - 1, SMALL_BATCH]),
    st.integers(0, 4),
)
def test_per_record_batches_equal_one_at_a_time_bit_for_bit(
    raw: list[tuple[str, int, int, float, int]], first: int, snap_after: int
) -> None:
    """Batches at the switch sizes leave, bit for bit, the state of adding the records
    one at a time (itself the per-record path); a pickled copy taken after batch
    ``snap_after`` and fed the rest ends in that state too."""
    recs = _recs(raw)
    one = _agg()
    for r in recs:
        one.add_many([r])
    batched = _agg()
    at = 0
    copy: Aggregates | None = None
    # batches up to SMALL_BATCH: the per-record path (129 goes vectorized, equal
    # only up to rounding: the test below)
    for i, s in enumerate(_sizes(len(recs), first, SMALL_BATCH)):
        for a in (batched, copy) if copy is not None else (batched,):
            a.add_many(recs[at : at + s])
        at += s
        if i == snap_after:
            copy = pickle.loads(pickle.dumps(batched))
    assert _state(batched) == _state(one)
    if copy is not None:
        assert _state(copy) == _state(one)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(RECORD, min_size=100, max_size=500),
    st.sampled_from([SMALL_BATCH - 1, SMALL_BATCH, SMALL_BATCH + 1]),
)
def test_vectorized_batches_equal_one_at_a_time(
    raw: list[tuple[str, int, int, float, int]], first: int
) -> None:
    """The vectorized path on the same batches, and batches that switch between the
    two paths (127, 128, 129 records), keep the same keys, buckets, counts and
    timestamps, and sums equal up to rounding."""
    recs = _recs(raw)
    one = _agg()
    for r in recs:
        one.add_many([r])
    for vec in (_agg(vectorized=True), _agg()):
        at = 0
        for s in _sizes(len(recs), first):
            vec.add_many(recs[at : at + s])
            at += s
        _assert_close(one, vec)


def _assert_close(one: Aggregates, vec: Aggregates) -> None:
    n = one.key_total
    assert one.index == vec.index and vec.key_total == n
    for name in ("landmark", "t_max", "latest_b", "latest_count", "latest_t_max", "live"):
        assert getattr(one, name)[:n].tolist() == getattr(vec, name)[:n].tolist(), name
    for name in ("fd_sum", "latest_wsum", "latest_fd"):
        for x, y in zip(getattr(one, name)[:n].tolist(), getattr(vec, name)[:n].tolist()):
            assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-300), name
    ko, oo = one.older.dump()
    kv, ov = vec.older.dump()
    assert ko.tolist() == kv.tolist()
    for name in ("b", "count", "tmax"):
        assert oo[name].tolist() == ov[name].tolist(), name
    for name in ("wsum", "fd"):
        for x, y in zip(oo[name].tolist(), ov[name].tolist()):
            assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-300), name
    for name in DETAIL_COLUMNS:
        assert getattr(one, name) == getattr(vec, name), name


def test_many_keys_grow_the_columns_inside_a_batch() -> None:
    """3,000 keys, each with records in several buckets, in batches of 128 records:
    the key columns and the earlier buckets' columns and per-key arrays grow (past
    1,024 keys and rows) inside per-record batches; the state equals adding the
    records one at a time bit for bit, and a pickled copy taken midway ends in it."""
    rng = np.random.default_rng(7)
    n = 12_000
    ents = rng.integers(0, 1_000, n).tolist()
    types = rng.choice([1, 2, 3], n).tolist()
    cohorts = rng.choice(["a", "b", "@community"], n).tolist()
    ws = [_f32(w) for w in rng.choice([1e-30, 0.5, 1e30], n).tolist()]
    # mostly forward in time, with some records several buckets in the past
    tss = (np.arange(n) * 3 - rng.integers(0, 4_000, n) * (rng.random(n) < 0.2)).tolist()
    tss = [max(0, t) for t in tss]
    recs = _recs(list(zip(cohorts, ents, types, ws, tss)))
    one, batched = _agg(), _agg()
    for r in recs:
        one.add_many([r])
    copy: Aggregates | None = None
    for at in range(0, n, SMALL_BATCH):
        for a in (batched, copy) if copy is not None else (batched,):
            a.add_many(recs[at : at + SMALL_BATCH])
        if at == SMALL_BATCH * 40:
            copy = pickle.loads(pickle.dumps(batched))
    assert one.key_total > 1_024 and len(one.older) > 1_024
    assert _state(batched) == _state(one)
    assert copy is not None and _state(copy) == _state(one)
