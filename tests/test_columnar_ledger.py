"""The columnar aggregates: a batch added at once (vectorized, with the one-by-one
path for bucket changes, late contributions and landmark moves) gives the state of
adding its contributions one at a time; many-key reads equal one-key reads bit for
bit; a dump loads back bit for bit; history batches encode from columns to the layout
built by hand."""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.actors import messages as M
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import LogRecord
from tidal_actors.core.key_state import DETAIL_COLUMNS
from tidal_actors.storage.format import decode_batch, encode_history_columns, seal

from ._history_v1 import encode_batch, records_of

WIDTH = 1000
HALF = {1: 500, 2: 50_000, 3: 7}  # type 3 renormalizes often (RENORMALIZE_AT half-lives)


def _older(agg: Aggregates) -> dict[int, dict[int, tuple[int, float, float, int]]]:
    """Each key's earlier buckets, ``{k: {b: (count, wsum, fd, tmax)}}``."""
    return {k: agg.older.of(k) for k in agg.older}


def _agg() -> Aggregates:
    return Aggregates(HALF.__getitem__, WIDTH, 4)


class _Vectorized(Aggregates):
    """Aggregates that add every batch with numpy (`Adds.add_columns`'s vectorized
    path), however small: the default adds batches of up to ``small_batch`` records
    one record at a time (`core.record_adds`)."""

    __slots__ = ()
    small_batch = 0


def _vectorized() -> Aggregates:
    return _Vectorized(HALF.__getitem__, WIDTH, 4)


records = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "@community"]),
        st.integers(0, 5),  # entity
        st.sampled_from([1, 2, 3]),
        st.sampled_from([0.0, 0.5, 1.0, 3.0, 0.10000000149011612]),
        st.integers(0, 12_000),  # ts: several buckets, late ones, far ones
    ),
    min_size=1,
    max_size=60,
)


def _recs(
    raw: list[tuple[str, int, int, float, int]],
) -> list[tuple[int, int, int, str, int, int, float, int]]:
    return [(0, i, 100 + e, c, e, t, w, ts) for i, (c, e, t, w, ts) in enumerate(raw)]


def _reads(a: Aggregates, at: int) -> tuple[object, ...]:
    rows = sorted(a.rows(at))
    one = [(c, e, t, a.decay_score(c, e, t, at), *a.window(c, e, t, at)) for c, e, t, *_ in rows]
    return rows, one, [a.top(c, t, 3, at) for c in ("a", "b", "@community") for t in (1, 2, 3)]


def _close(x: tuple[object, ...], y: tuple[object, ...]) -> bool:
    (rx, _, tx), (ry, _, ty) = x, y
    if [r[:3] for r in rx] != [r[:3] for r in ry] or [r[4] for r in rx] != [r[4] for r in ry]:
        return False
    for a, b in zip(rx, ry):
        if not (
            math.isclose(a[3], b[3], rel_tol=1e-9, abs_tol=1e-12)
            and math.isclose(a[5], b[5], rel_tol=1e-9, abs_tol=1e-12)
        ):
            return False
    return all(len(a) == len(b) for a, b in zip(tx, ty))  # ties may order differently by rounding


@settings(max_examples=150, deadline=None)
@given(records, st.integers(1, 20), st.integers(0, 13_000), st.booleans())
def test_batches_equal_one_at_a_time(
    raw: list[tuple[str, int, int, float, int]], step: int, at: int, vectorized: bool
) -> None:
    """Batches added by either path (numpy, or record by record in plain Python)
    leave the state of adding each record on its own."""
    recs = _recs(raw)
    one, batched = _agg(), (_vectorized() if vectorized else _agg())
    for r in recs:
        one.add_many([r])
    for k in range(0, len(recs), step):
        batched.add_many(recs[k : k + step])
    assert _close(_reads(one, at), _reads(batched, at))
    # the detail rows are the same, in the same order
    for name in DETAIL_COLUMNS:
        assert getattr(one, name) == getattr(batched, name)
    # so are the keys made (numpy makes a batch's new ones at once, `_new_narrow_keys`):
    # their ids, index, cohorts' key counts and the columns set at a key's first record
    n = one.key_total
    assert batched.key_total == n and one.keys == batched.keys
    assert one.index == batched.index and one.cohorts == batched.cohorts
    for name in ("key_half_life", "landmark", "live"):
        assert (getattr(one, name)[:n] == getattr(batched, name)[:n]).all(), name


class _OneByOne(_Vectorized):
    """Vectorized aggregates whose records outside the latest bucket all go through
    `_add_one` (no bulk bucket moves): the sequential definition of a bucket move."""

    __slots__ = ()

    def _add_newer(self, k, b, x, w, wf, ts, cand):  # type: ignore[no-untyped-def]
        import numpy as np

        return np.zeros(len(k), dtype=bool)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(1, 20), st.integers(0, 13_000))
def test_bulk_bucket_moves_equal_moving_one_record_at_a_time(
    raw: list[tuple[str, int, int, float, int]], step: int, at: int
) -> None:
    """Batches that open newer buckets (moving each key's latest bucket to its older
    ones in bulk) leave the buckets that adding each record on its own leaves."""
    recs = _recs(raw)
    seq, bulk = _OneByOne(HALF.__getitem__, WIDTH, 4), _vectorized()
    for k in range(0, len(recs), step):
        seq.add_many(recs[k : k + step])
        bulk.add_many(recs[k : k + step])
    assert _close(_reads(seq, at), _reads(bulk, at))
    assert list(seq.latest_b) == list(bulk.latest_b)
    assert list(seq.latest_count) == list(bulk.latest_count)
    assert list(seq.latest_t_max) == list(bulk.latest_t_max)
    assert {k: {b: (v[0], v[3]) for b, v in o.items()} for k, o in _older(seq).items()} == {
        k: {b: (v[0], v[3]) for b, v in o.items()} for k, o in _older(bulk).items()
    }
    for k, o in _older(seq).items():
        for b, v in o.items():
            got = _older(bulk)[k][b]
            assert math.isclose(v[1], got[1], rel_tol=1e-12, abs_tol=1e-12)
            assert math.isclose(v[2], got[2], rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 13_000), st.booleans(), st.data())
def test_bulk_load_equals_one_at_a_time(raw, at, retract, data) -> None:  # type: ignore[no-untyped-def]
    """The restore's bulk load (numpy per key and per bucket) gives the state of adding
    the records one at a time: late ones, several buckets, landmark moves, and the
    same detail rows; retracting rows afterwards agrees too."""
    import numpy as np

    recs = _recs(raw)
    one, bulk = _agg(), _agg()
    for r in recs:
        one.add_many([r])
    names = ["a", "b", "@community"]
    cols = list(zip(*recs))
    bulk.load_columns(
        np.array(cols[0], dtype=np.uint8),
        np.array(cols[1], dtype=np.int64),
        np.array(cols[2], dtype=np.uint64),
        np.array([names.index(c) for c in cols[3]]),
        names,
        np.array(cols[4], dtype=np.uint64),
        np.array(cols[5], dtype=np.uint64),
        np.array(cols[6], dtype=np.float32),
        np.array(cols[7], dtype=np.int64),
    )
    for name in DETAIL_COLUMNS:
        assert getattr(one, name) == getattr(bulk, name)
    assert one.keys == bulk.keys and one.index == bulk.index and one.cohorts == bulk.cohorts
    assert set(one.older) == set(bulk.older)
    for k, buckets in _older(one).items():
        assert set(buckets) == set(_older(bulk)[k])
    if retract:
        for row in data.draw(st.lists(st.sampled_from(range(len(recs))), max_size=10)):
            one.retract_row(row)
            bulk.retract_row(row)
    assert _close(_reads(one, at), _reads(bulk, at))
    for name in ("landmark", "t_max", "latest_b", "latest_count", "latest_t_max", "live"):
        assert list(getattr(one, name)[: one.key_total]) == list(
            getattr(bulk, name)[: bulk.key_total]
        ), name


@settings(max_examples=100, deadline=None)
@given(records, st.integers(0, 13_000), st.data())
def test_many_key_reads_equal_one_key_reads_and_retraction(raw, at, data) -> None:  # type: ignore[no-untyped-def]
    a = _agg()
    rows = a.add_many(_recs(raw))
    for row in data.draw(st.lists(st.sampled_from(list(rows)), max_size=20)):
        a.retract_row(row)
    bulk, single, _ = _reads(a, at)
    assert bulk == single  # bit for bit, not merely close
    for *_, s, n, w in bulk:
        assert s >= 0.0 and w >= 0.0 and n >= 0


@settings(max_examples=60, deadline=None)
@given(records, st.integers(0, 13_000))
def test_dump_loads_back_bit_for_bit(raw: list[tuple[str, int, int, float, int]], at: int) -> None:

    a = _agg()
    rows = a.add_many(_recs(raw))
    a.retract_row(rows[0])
    b = _agg()
    b.load(msgpack.unpackb(msgpack.packb(a.dump()), strict_map_key=False))
    assert _reads(a, at) == _reads(b, at)
    assert a.keys == b.keys and a.index == b.index and a.cohorts == b.cohorts


@settings(max_examples=40, deadline=None)
@given(records, records, st.integers(0, 13_000))
def test_a_pickled_copy_adds_and_reads_as_the_original(
    first: list[tuple[str, int, int, float, int]],
    then: list[tuple[str, int, int, float, int]],
    at: int,
) -> None:
    """The key columns are numpy views of the memory maps the per-record path
    writes through (`KeyState.items`: memoryviews of them), the earlier buckets'
    columns of the ``array`` objects it writes through (`Segments.items`): a copy
    made by pickling keeps them one, so records added to it afterwards, by either
    path, read as on the original."""
    import pickle

    for make in (_agg, _vectorized):
        a = make()
        a.add_many(_recs(first))
        b = pickle.loads(pickle.dumps(a))
        for agg in (a, b):
            agg.add_many(_recs(then))
            agg.add_many(_recs(then)[:1])
        assert _reads(a, at) == _reads(b, at)
        for name in ("fd_sum", "latest_count", "latest_b", "landmark"):
            assert getattr(b, name).base.obj is b.items[name].obj  # one memory map
        for name in ("b", "count", "fd", "start", "length"):  # the earlier buckets' too
            assert getattr(b.older, name).base.obj is b.older.items[name]


def test_retracting_everything_leaves_nothing() -> None:
    a = _agg()
    rows = a.add_many(
        _recs([("a", 1, 1, 0.10000000149011612, ts) for ts in (5, 900, 1500, 3000, 10)])
    )
    for row in rows:
        assert a.retract_row(row)
    assert not a.retract_row(rows[0])
    assert list(a.rows(5000)) == [] and a.key_count() == 0 and a.cohorts == {}
    a.add_many(_recs([("a", 1, 1, 1.0, 7000)]))  # the key comes back with a new id
    assert a.decay_score("a", 101, 1, 7000) == 0.0 and a.decay_score("a", 1, 1, 7000) == 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.integers(0, 2**40),
            st.integers(0, 2**64 - 1),
            st.sampled_from(["a", "b", "c" * 150]),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.floats(0, 1e30),
            st.integers(0, 2**63 - 1),
        ),
        min_size=1,
        max_size=30,
    ),
    st.one_of(st.none(), st.just({0: {"k": 1}})),
)
def test_history_columns_encode_like_records(recs, contexts) -> None:  # type: ignore[no-untyped-def]
    """Columns in, the same records back (weights rounded to float32 at intake), and
    the version 1 layout of the same records decodes alike."""
    want = [(*r[:6], _f32(r[6]), r[7]) for r in recs]
    b = decode_batch(0, 0, seal(b"k", encode_history_columns(tuple(zip(*recs)), contexts)), b"k")
    assert records_of(b) == want and b.contexts == contexts
    old = decode_batch(0, 0, encode_batch(recs, contexts))
    assert records_of(old) == want and old.contexts == contexts


def _f32(w: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", w))[0])


def _round_trip(cols: tuple, contexts: dict | None) -> list:  # type: ignore[type-arg]
    return records_of(decode_batch(0, 0, seal(b"k", encode_history_columns(cols, contexts)), b"k"))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.just(3),
            st.integers(0, 2**40),
            st.integers(0, 2**64 - 1),
            st.sampled_from(["a", "b"]),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.floats(0, 2.0**100, width=32),
            st.integers(0, 2**63 - 1),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_history_columns_from_an_attribute_message_encode_like_records(recs) -> None:  # type: ignore[no-untyped-def]
    """The ledger persists a membership shard's message as it came: numpy columns and
    one membership shard number for all records."""
    msg = M.Attribute.of_records([LogRecord(*r) for r in recs])
    cols = (
        msg.mshard,
        msg.rseqs,
        msg.users,
        msg.cohorts,
        msg.entities,
        msg.types,
        msg.weights,
        msg.timestamps,
    )
    assert _round_trip(cols, {0: 1}) == [tuple(r) for r in recs]


def test_history_columns_with_many_cohorts() -> None:
    recs = [(0, i, i, f"c{i}", i, 1, 1.0, i) for i in range(300)]
    assert _round_trip(tuple(zip(*recs)), None) == recs


pair_records = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 7, 2**40, 2**64 - 1]),  # user (2**64 - 1: no one-key sort)
        st.integers(0, 2),  # cohort
        st.booleans(),  # live (above its shard's eviction watermark)
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(
    pair_records,
    st.dictionaries(
        st.tuples(st.sampled_from([0, 7, 2**40]), st.sampled_from(["a", "b", "c"])),
        st.integers(0, 80),
        max_size=3,
    ),
)
def test_log_load_columns_equals_appending_and_counting(recs, reported) -> None:  # type: ignore[no-untyped-def]
    """The bulk restore of a log equals appending its live records in order and
    counting each pair's evicted records that no earlier purge reported (rseq at or
    above the purge's bound) in item 0."""
    import numpy as np

    from tidal_actors.core.contrib_log import ContributionLog
    from tidal_actors.core.pair_index import pair_positions

    names = ["a", "b", "c"]
    rows = [100 + i for i in range(len(recs))]
    expected = ContributionLog(_agg())
    live_i = [i for i, (_, _, live) in enumerate(recs) if live]
    expected.append_columns(
        [recs[i][0] for i in live_i], [names[recs[i][1]] for i in live_i], [rows[i] for i in live_i]
    )
    want = {k: list(pair_positions(v)[1]) for k, v in expected.index.items()}
    counts: dict[tuple[int, str], int] = {}
    for rseq, (u, c, live) in enumerate(recs):  # rseq = position in the history here
        if not live and rseq >= reported.get((u, names[c]), -1):
            counts[(u, names[c])] = counts.get((u, names[c]), 0) + 1
    want = {k: [counts.get(k, 0), *want.get(k, [])] for k in set(want) | set(counts)}
    got = ContributionLog(_agg())
    got.load_columns(
        np.array([u for u, _, _ in recs], dtype=np.uint64),
        np.array([c for _, c, _ in recs], dtype=np.int64),
        names,
        np.array(rows, dtype=np.int64),
        np.array([lv for _, _, lv in recs], dtype=bool),
        np.arange(len(recs), dtype=np.int64),
        reported,
    )
    assert list(got.d) == list(expected.d)
    assert {k: [pair_positions(v)[0], *pair_positions(v)[1]] for k, v in got.index.items()} == want


def _assert_t_max_bounds(
    one: Aggregates, many: Aggregates, recs: list[Any], rows: list[int], gone: set[int]
) -> None:
    """Each live key's ``t_max``, in both, lies between its latest remaining
    contribution and its latest added one, and so does its ``latest_t_max`` among
    those of its latest bucket (computed here from the records): both are bounds
    after retractions, exact once the key was refolded."""
    left: dict[tuple[str, int, int], int] = {}
    added: dict[tuple[str, int, int], int] = {}
    by_bucket: dict[tuple[str, int, int, int], list[tuple[int, bool]]] = {}
    for row, (_, _, _, c, e, t, _, ts) in zip(rows, recs):
        added[(c, e, t)] = max(added.get((c, e, t), ts), ts)
        by_bucket.setdefault((c, e, t, ts // WIDTH), []).append((ts, row not in gone))
        if row not in gone:
            left[(c, e, t)] = max(left.get((c, e, t), ts), ts)
    for kk, key in enumerate(one.keys):
        if not one.live[kk] or key not in left:
            continue
        for a in (one, many):
            assert left[key] <= int(a.t_max[kk]) <= added[key], (key, int(a.t_max[kk]))
            in_latest = by_bucket.get((*key, int(a.latest_b[kk])), [])
            kept = [ts for ts, k in in_latest if k]
            if kept:  # an emptied latest bucket's (count 0) is not read
                hi = max(ts for ts, _ in in_latest)
                assert max(kept) <= int(a.latest_t_max[kk]) <= hi, (key, int(a.latest_t_max[kk]))


def test_retract_rows_and_one_by_one_may_leave_different_t_max_bounds() -> None:
    """Found by hypothesis: rows 7 (0.5 at 0) and 19 (0.0 at 1) of key b go. One by
    one, the 0.5 cancels the latest bucket's weight (a refold: ``t_max`` becomes 1,
    the latest left then), then the 0.0 goes without one (1 stays); as a batch, one
    refold after both (0, the only row left). Both bound the remaining 0."""
    raw = [("a", 0, 1, 0.0, 0)] * 6 + [("b", 1, 2, 0.0, 0), ("b", 1, 2, 0.5, 0)]
    raw += [("a", 0, 1, 0.0, 0)] * 11 + [("b", 1, 2, 0.0, 1)] + [("a", 0, 1, 0.0, 0)] * 2
    recs = _recs(raw)
    one, many = _agg(), _agg()
    rows = list(one.add_many(recs))
    many.add_many(recs)
    for row in (7, 19):
        one.retract_row(rows[row])
    many.retract_rows([rows[7], rows[19]])
    kb = one.keys.index(("b", 1, 2))
    assert (int(one.t_max[kb]), int(many.t_max[kb])) == (1, 0)
    assert _reads(one, 0) == _reads(many, 0)
    _assert_t_max_bounds(one, many, recs, rows, {rows[7], rows[19]})


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 13_000), st.data())
def test_retract_rows_equals_retracting_one_by_one(raw, at, data) -> None:  # type: ignore[no-untyped-def]
    """A purge's column-wise retraction leaves bit for bit the state that retracting
    its rows one at a time leaves (rows repeated, or retracted before, included),
    but ``t_max``: after retractions it is an upper bound of the key's latest
    remaining contribution, exact once the key was refolded, and whether it was
    depends on how the cancellations were grouped (`core.retraction`)."""
    recs = _recs(raw)
    one, many = _agg(), _agg()
    rows = list(one.add_many(recs))
    many.add_many(recs)
    earlier = data.draw(st.lists(st.sampled_from(rows), max_size=5))
    for row in earlier:
        one.retract_row(row)
        many.retract_row(row)
    now = data.draw(st.lists(st.sampled_from(rows), max_size=len(rows) + 3))
    for row in now:
        one.retract_row(row)
    many.retract_rows(now)
    assert _reads(one, at) == _reads(many, at)
    for name in DETAIL_COLUMNS:
        assert getattr(one, name) == getattr(many, name)
    n = one.key_total
    _assert_t_max_bounds(one, many, recs, rows, set(earlier) | set(now))
    for name in (
        "fd_sum",
        "landmark",
        "latest_b",
        "latest_count",
        "latest_wsum",
        "latest_fd",
        "live",
    ):  # latest_t_max, like t_max, is a bound (`_assert_t_max_bounds`)
        assert getattr(one, name)[:n].tobytes() == getattr(many, name)[:n].tobytes(), name
    assert one.older == many.older and one.index == many.index and one.cohorts == many.cohorts
    many.add_many(recs)  # the arrays can still grow (no numpy view left behind)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_erasure_rewrite_encodes_like_records(data) -> None:  # type: ignore[no-untyped-def]
    """Erasure rewrites a history batch from its decoded columns: the bytes equal
    the kept records (contexts following their records), from a version 1 batch."""
    import numpy as np

    from tidal_actors.storage.format import rewrite_batch_op
    from tidal_actors.storage.stores import decode_batch

    n = data.draw(st.integers(1, 30))
    rec = st.tuples(
        st.integers(0, 3),
        st.integers(0, 2**40),
        st.integers(0, 2**64 - 1),
        st.sampled_from(["a", "b", "@community", "z"]),
        st.integers(0, 2**64 - 1),
        st.integers(0, 9),
        st.sampled_from([0.0, 0.5, 1.0, 0.10000000149011612]),
        st.integers(0, 2**62),
    )
    recs = data.draw(st.lists(rec, min_size=n, max_size=n))
    ctx = (
        data.draw(
            st.dictionaries(
                st.integers(0, n - 1),
                st.dictionaries(st.text(max_size=3), st.integers(-999, 999)),
                max_size=3,
            )
        )
        or None
    )
    b = decode_batch(0, 0, encode_batch(recs, ctx))
    keep = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    want_ctx = {new: ctx[old] for new, old in enumerate(keep) if ctx and old in ctx} or None
    _, key, value = rewrite_batch_op(b"k", b, np.array(keep))
    got = decode_batch(0, 0, value, key)
    assert records_of(got) == [recs[i] for i in keep] and got.contexts == want_ctx


def test_records_evicted_between_prepare_and_apply_stay_counted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A purge reports each evicted record of its pair once. Records that came after
    the purge's bound and were evicted and compacted away while the purge was being
    committed are not in its manifest: the next purge of the pair reports them."""
    from tidal_actors.core import contrib_log as _contrib_log
    from tidal_actors.core.contrib_log import ContributionLog
    from tidal_actors.core.pair_index import pair_positions

    monkeypatch.setattr(
        _contrib_log, "_COMPACT_MIN", 1
    )  # compact as soon as half the column is dead
    agg = _agg()
    log = ContributionLog(agg)

    def add(user: int, rseqs: range) -> None:
        recs = [(0, r, user, "c", 1, 1, 1.0, 10 * r) for r in rseqs]
        log.append_columns([user] * len(recs), ["c"] * len(recs), agg.add_many(recs))

    add(1, range(0, 3))  # rseq 0-2: user 1, before the purge
    log.hold(1, "c", 3)  # the purge's marker: bound 3
    first = log.prepare(1, "c", watermark=0, bound=3)
    assert len(first.records) == 3 and first.evicted == 0
    add(1, range(3, 5))  # rseq 3-4: user 1, after the purge's bound
    add(2, range(5, 10))
    log.set_floor(0, 8)  # rseq 0-7 evicted: the column is compacted, user 1's rows held
    assert log.base == 8 and log.held_rows[(1, "c")].size == 5
    agg.retract_rows(first.rows)
    log.apply(1, "c", first)
    # rseq 0-2 were in the first manifest; rseq 3-4 were evicted and reported by no one
    assert pair_positions(log.index[(1, "c")])[0] == 2
    log.hold(1, "c", 10)
    second = log.prepare(1, "c", watermark=8, bound=10)
    assert second.records == [] and second.evicted == 2
    agg.retract_rows(second.rows)
    log.apply(1, "c", second)
    assert (1, "c") not in log.index and log.holds == {} and log.held_rows == {}


def test_records_evicted_before_a_late_preparation_are_not_its_own(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The purge's preparation can reach the ledger after records the user submitted
    after the purge, and after they were evicted and compacted: its manifest counts
    only the evicted records below its bound; the later ones go to the next purge."""
    from tidal_actors.core import contrib_log as _contrib_log
    from tidal_actors.core.contrib_log import ContributionLog
    from tidal_actors.core.pair_index import pair_positions

    monkeypatch.setattr(_contrib_log, "_COMPACT_MIN", 1)
    agg = _agg()
    log = ContributionLog(agg)

    def add(user: int, rseqs: range) -> None:
        recs = [(0, r, user, "c", 1, 1, 1.0, 10 * r) for r in rseqs]
        log.append_columns([user] * len(recs), ["c"] * len(recs), agg.add_many(recs))

    add(1, range(0, 2))  # rseq 0-1, before the purge
    log.hold(1, "c", 2)  # its marker; the log's watermark was 1 when it was taken
    add(1, range(2, 6))  # rseq 2-5, after it
    add(2, range(6, 10))
    log.set_floor(0, 5)  # rseq 0-4 evicted: user 1's 0-1 (before) and 2-4 (after)
    assert log.base == 5 and log.held_rows[(1, "c")].size == 5
    first = log.prepare(1, "c", watermark=1, bound=2)
    # rseq 0 was evicted when the purge was taken, rseq 1 was live: an entry
    assert first.evicted == 1 and [r.timestamp_ns for r in first.records] == [10]
    agg.retract_rows(first.rows)
    log.apply(1, "c", first)
    assert pair_positions(log.index[(1, "c")])[0] == 3  # rseq 2-4, reported by no one yet
    assert log.holds == {} and log.held_rows == {}
    log.hold(1, "c", 12)
    second = log.prepare(1, "c", watermark=5, bound=12)
    assert second.evicted == 3 and [r.timestamp_ns for r in second.records] == [50]  # rseq 5, live


def test_a_failed_purge_releases_its_hold(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rows held for a purge that then failed are folded into the pair's count of
    evicted records (and a snapshot stores them so while the purge is in flight)."""
    from tidal_actors.core import contrib_log as _contrib_log
    from tidal_actors.core.contrib_log import ContributionLog
    from tidal_actors.core.pair_index import I64, pair_positions

    monkeypatch.setattr(_contrib_log, "_COMPACT_MIN", 1)
    agg = _agg()
    log = ContributionLog(agg)
    recs = [(0, r, 1 if r < 3 else 2, "c", 1, 1, 1.0, 10 * r) for r in range(8)]
    log.append_columns([r[2] for r in recs], ["c"] * 8, agg.add_many(recs))
    log.hold(1, "c", 3)
    log.set_floor(0, 4)  # rseq 0-3 evicted: user 1's three records held, not counted
    assert log.held_rows[(1, "c")].size == 3 and pair_positions(log.index[(1, "c")])[0] == 0
    assert dict(log.snapshot_index())[(1, "c")] == I64.pack(3)
    log.release(1, "c", 99)  # not its bound: nothing changes
    assert log.holds == {(1, "c"): [3]}
    log.release(1, "c", 3)
    assert log.holds == {} and log.held_rows == {} and pair_positions(log.index[(1, "c")])[0] == 3
    assert log.prepare(1, "c", watermark=4, bound=8).evicted == 3
