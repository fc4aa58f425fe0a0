"""The column-by-column intake check (`signal_columns`, `shard_split`) agrees with the
signal-by-signal one: same items, same rounding, same shard, and anything it does not
accept exactly goes to the per-signal path (which names the bad argument)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors import InvalidArgument, Signal, TidalDb
from tidal_actors.core.sharding import membership_shard_of, shard_split
from tidal_actors.core.validate import (
    check_id,
    check_timestamp,
    check_weight,
    signal_columns,
)

ids = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1]))
weights = st.one_of(
    st.floats(0.0, 3.4028234663852886e38),
    st.sampled_from([0.0, -0.0, 0.1, 1.0, 1e-45, 3.4028234663852886e38]),
)
stamps = st.one_of(st.none(), st.integers(0, 2**63 - 1))
good = st.builds(Signal, ids, ids, ids, weights, stamps, st.none())
odd = {  # per field: values the column check must leave to the per-signal path
    "id": [-1, 2**64, True, 1.5, np.int64(3), np.uint64(3), None, "x"],
    "weight": [
        math.nan,
        math.inf,
        -math.inf,
        -1.0,
        1e39,
        np.float32(1.0),
        np.float64(1.0),
        1,
        True,
        None,
    ],
    "ts": [-1, 2**63, True, 1.5, np.int64(3), "x"],
}


def _per_signal(s: Signal) -> tuple[object, ...]:
    return (
        check_id("user_id", s.user_id),
        check_id("entity_id", s.entity_id),
        check_id("signal_type", s.signal_type),
        check_weight(s.weight),
        None if s.timestamp_ns is None else check_timestamp("timestamp_ns", s.timestamp_ns),
        s.context,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(good, min_size=1, max_size=40))
def test_columns_equal_the_per_signal_items(signals: list[Signal]) -> None:
    got = signal_columns(signals, Signal)
    assert got is not None
    cols, has_none = got
    items = list(zip(*cols))
    want = [_per_signal(s) for s in signals]
    assert items == want
    # float32 rounding: the same numbers, bit for bit (and the sign of zero kept)
    assert [math.copysign(1.0, i[3]) for i in items] == [math.copysign(1.0, w[3]) for w in want]
    assert has_none == any(s.timestamp_ns is None for s in signals)


@settings(max_examples=200, deadline=None)
@given(st.lists(good, min_size=1, max_size=20), st.data())
def test_anything_odd_goes_to_the_per_signal_path(
    signals: list[Signal], data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(signals) - 1))
    field = data.draw(st.integers(0, 4))
    value = data.draw(st.sampled_from(odd["id" if field < 3 else "weight" if field == 3 else "ts"]))
    s = list(signals[i])
    s[field] = value
    signals[i] = Signal(*s)
    assert signal_columns(signals, Signal) is None


def test_a_context_or_a_plain_tuple_goes_to_the_per_signal_path() -> None:
    assert signal_columns([Signal(1, 2, 3, 1.0, None, {"a": 1})], Signal) is None
    assert signal_columns([(1, 2, 3, 1.0, None, None)], Signal) is None
    assert signal_columns([], Signal) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(ids, min_size=1, max_size=50), st.integers(1, 7))
def test_shard_split_matches_membership_shard_of(users: list[int], shards: int) -> None:
    items = list(range(len(users)))
    parts = shard_split(items, users, shards)
    assert len(parts) == shards
    for m, part in enumerate(parts):
        assert part == [i for i in items if membership_shard_of(users[i], shards) == m]


@pytest.mark.parametrize("shards", [1, 3])
def test_batch_and_single_calls_give_the_same_scores(shards: int) -> None:
    from tidal_actors import Config

    cfg = Config(membership_shards=shards)
    sigs = [Signal(u % 7, u % 5, 1, 0.1 * (u % 3), 10**18 + u) for u in range(500)]
    with TidalDb.open(config=cfg) as a, TidalDb.open(config=cfg) as b:
        for db in (a, b):
            db.assign_cohort(3, "c")
        a.signal_batch(sigs)
        for s in sigs:
            b.signal_with_context(*s)
        at = 10**18 + 1000
        for e in range(5):
            for c in ("c", "@community"):
                # with several membership shards the ledger may add in another order
                assert math.isclose(
                    a.read_decay_score(c, e, 1, at), b.read_decay_score(c, e, 1, at), rel_tol=1e-12
                )
                wa, wb = a.read_window(c, e, 1, at), b.read_window(c, e, 1, at)
                assert wa.count == wb.count and math.isclose(wa.weight, wb.weight, rel_tol=1e-12)


def test_a_bad_signal_deep_in_a_batch_is_named_and_nothing_is_queued() -> None:
    with TidalDb.open() as db:
        sigs = [Signal(1, 2, 3, 1.0, 10**18)] * 100 + [Signal(1, 2, 3, math.nan, 10**18)]
        with pytest.raises(InvalidArgument, match=r"signals\[100\]\.weight"):
            db.signal_batch(sigs)
        assert db.read_window("@community", 2, 3, 10**18).count == 0
