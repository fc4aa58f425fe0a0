"""`OlderBuckets` (each key's earlier buckets as columns, in segments) against a plain
model, ``{key: {b: (count, wsum, fd, tmax)}}``, under random sequences of every
operation: segments that fill up and move, free segments reused, buckets inserted in
the middle and removed, whole keys dropped and replaced (one by one and many at once,
from another instance), a dump loaded back."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core import segments
from tidal_actors.core.older_buckets import OlderBuckets

KEYS = st.integers(0, 12)
BUCKETS = st.integers(-5, 40)
VALUES = st.tuples(
    st.integers(1, 9), st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.integers(0, 10**18)
)

OPS = st.one_of(
    st.tuples(st.just("put"), KEYS, BUCKETS, VALUES),
    st.tuples(st.just("remove"), KEYS, BUCKETS),
    st.tuples(st.just("scale"), KEYS, st.floats(0.001, 1000.0)),
    st.tuples(st.just("drop"), KEYS),
    st.tuples(st.just("replace"), KEYS, st.dictionaries(BUCKETS, VALUES, max_size=6)),
    st.tuples(st.just("push"), st.sets(KEYS, max_size=6), VALUES),
    st.tuples(st.just("push_one"), KEYS, st.integers(-3, 1), VALUES),
    st.tuples(st.just("add_record"), KEYS, BUCKETS, VALUES),
    st.tuples(st.just("drop_many"), st.sets(KEYS, max_size=6)),
    st.tuples(st.just("copy"), st.dictionaries(KEYS, st.dictionaries(BUCKETS, VALUES, max_size=6))),
)


def _apply(ob: OlderBuckets, model: dict[int, dict[int, tuple]], op: tuple) -> None:  # type: ignore[type-arg]
    kind = op[0]
    if kind == "put":
        _, k, b, v = op
        ob.put(k, b, v)
        model.setdefault(k, {})[b] = v
    elif kind == "remove":
        _, k, b = op
        ob.remove(k, b)
        model.get(k, {}).pop(b, None)
    elif kind == "scale":
        _, k, f = op
        ob.scale_fd(k, f)
        for b, (n, w, fd, tm) in model.get(k, {}).items():
            model[k][b] = (n, w, fd * f, tm)
    elif kind == "drop":
        ob.drop(op[1])
        model.pop(op[1], None)
    elif kind == "replace":
        _, k, buckets = op
        ob.replace(k, buckets)
        model[k] = dict(buckets)
    elif kind == "push_one":  # after the key's last bucket (offset > 0), else a put
        _, k, offset, v = op
        b = max(model.get(k, {}), default=-10) + offset
        ob.push_one(k, b, *v)
        model.setdefault(k, {})[b] = v
    elif kind == "drop_many":
        ob.drop_many(np.array(sorted(op[1]), dtype=np.int64))
        for k in op[1]:
            model.pop(k, None)
    elif kind == "copy":  # keys dropped, then given another instance's keys' buckets
        _, given = op
        ks = sorted(given)
        other = OlderBuckets()  # key k's buckets under id 3 * k + 1 there
        for k in ks:
            other.replace(3 * k + 1, given[k])
        ob.drop_many(np.array(ks, dtype=np.int64))
        ob.copy_from(np.array(ks, dtype=np.int64), other, np.array([3 * k + 1 for k in ks]))
        for k in ks:
            model[k] = dict(given[k])
    elif kind == "add_record":  # one contribution: (w, wf, ts) from the values
        _, k, b, (_, w, wf, ts) = op
        ob.add_record(k, b, w, wf, ts)
        n0, w0, f0, t0 = model.get(k, {}).get(b, (0, 0.0, 0.0, ts))
        model.setdefault(k, {})[b] = (n0 + 1, w0 + w, f0 + wf, max(t0, ts))
    else:  # push: each key's new bucket after its last one
        _, keys, (n, w, fd, tm) = op
        ks = sorted(keys)
        bs = [max(model.get(k, {}), default=-10) + 1 + i for i, k in enumerate(ks)]
        ob.push_newest(
            np.array(ks, dtype=np.int64),
            np.array(bs, dtype=np.int64),
            np.full(len(ks), n, dtype=np.int64),
            np.full(len(ks), w),
            np.full(len(ks), fd),
            np.full(len(ks), tm, dtype=np.int64),
        )
        for k, b in zip(ks, bs):
            model.setdefault(k, {})[b] = (n, w, fd, tm)


def _plain(model: dict[int, dict[int, tuple]]) -> dict[int, list[tuple]]:  # type: ignore[type-arg]
    return {k: [(b, *v) for b, v in sorted(bs.items())] for k, bs in sorted(model.items()) if bs}


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=60))
def test_older_buckets_match_a_dict_model(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    _check_against_the_model(ops)


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, max_size=60))
def test_older_buckets_match_a_dict_model_compacting_at_once(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """The same, with segments moved down whenever the free ones are sparse enough."""
    saved = segments.COMPACT_FROM
    segments.COMPACT_FROM = 0
    try:
        _check_against_the_model(ops)
    finally:
        segments.COMPACT_FROM = saved


def _check_against_the_model(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    ob = OlderBuckets()
    model: dict[int, dict[int, tuple]] = {}  # type: ignore[type-arg]
    for op in ops:
        _apply(ob, model, op)
        want = _plain(model)
        assert {k: ob.rows(k) for k in ob} == want
        for k, rows in want.items():
            assert k in ob
            for b, *v in rows:
                assert ob.get(k, b) == tuple(v)
        assert ob.get(99, 0) is None and 99 not in ob
    # every bucket survives a dump and a bulk load
    ks, cols = ob.dump()
    loaded = OlderBuckets()
    loaded.load_sorted(ks, cols)
    assert loaded == ob
    assert {k: loaded.rows(k) for k in loaded} == _plain(model)


def test_segments_are_reused_after_a_drop() -> None:
    ob = OlderBuckets()
    for b in range(5):  # segments of 2, then 4, then 8 rows: 14 rows handed out
        ob.put(1, b, (1, 1.0, 1.0, b))
    assert ob._top == 14
    before = ob._top
    ob.drop(1)
    for b in range(5):
        ob.put(2, b, (1, 1.0, 1.0, b))
    assert ob._top == before  # key 2 took the segments key 1 gave back
    assert ob.rows(2) == [(b, 1, 1.0, 1.0, b) for b in range(5)]


def test_keys_growing_together_do_not_leave_half_the_columns_free() -> None:
    """10,000 keys each gaining one bucket a round for 24 rounds (a day of hourly
    buckets): the segments they outgrow are taken back when the columns would grow,
    so the free rows stay within half the keys' segments (without it a key that
    reached 2**k rows left 2**k - 2 behind: 62 rows a key for 24 buckets, in segments
    of 32), and every bucket is still there."""
    ob = OlderBuckets()
    keys = np.arange(10_000, dtype=np.int64)
    ones = np.ones(len(keys), dtype=np.int64)
    for b in range(24):
        ob.push_newest(keys, ones * b, ones, ones * 0.5, ones * 0.25, ones * (100 + b))
        held = int(ob.cap.sum())  # rows in the keys' segments
        assert 2 * (ob._top - held) <= held  # free rows: at most half of those
    assert ob.rows(7) == [(b, 1, 0.5, 0.25, 100 + b) for b in range(24)]
    assert ob.rows(9_999) == ob.rows(0)
    assert int(ob.cap.sum()) == 32 * len(keys) == ob._top  # moved down after the last growth
    ks, cols = ob.dump()
    assert len(ks) == 240_000 and set(np.unique(cols["b"]).tolist()) == set(range(24))
