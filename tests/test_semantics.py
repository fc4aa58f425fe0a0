"""Issue 2 semantic rules 1-9, each with values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    DatabaseClosed,
    InvalidArgument,
    ManualClock,
    Signal,
    TidalDb,
    TidalError,
    WindowCount,
)

from .conftest import DAY, HOUR, SEC, T0


def test_rule1_attribution_uses_cohorts_at_the_signals_turn(db):
    db.signal_with_context(1, 1, 1, 1.0)  # no cohort yet: only @community
    db.assign_cohort(1, "a")
    db.signal_with_context(1, 1, 1, 2.0)
    db.unassign_cohort(1, "a")
    db.assign_cohort(1, "b")
    db.signal_with_context(1, 1, 1, 4.0)
    assert db.read_decay_score("a", 1, 1) == 2.0
    assert db.read_decay_score("b", 1, 1) == 4.0
    assert db.read_decay_score(COMMUNITY, 1, 1) == 7.0
    assert db.cohorts_of(1) == frozenset({"b"})
    assert db.stats()["records"] == 1 + 2 + 2


def test_rule2_gated_signal_reaches_no_aggregate_and_no_log(db):
    db.assign_cohort(1, "a")
    db.leave_community_layer(1)
    db.signal_with_context(1, 1, 1, 1.0)
    s = db.stats()
    assert s["gated"] == 1 and s["records"] == 0 and s["log_records"] == 0
    _, m = db.request_community_purge(1, "a")
    assert m.entries == ()


def test_rule3_decay_formula_default_half_life_seven_days(clock):
    with TidalDb.open(clock=clock) as db:
        db.signal_with_context(1, 1, 1, 3.0, timestamp_ns=T0)
        assert db.read_decay_score(COMMUNITY, 1, 1, T0 + 7 * DAY) == 1.5
        assert db.read_decay_score(COMMUNITY, 1, 1, T0 + 14 * DAY) == 0.75
        # default at = the clock's now
        clock.advance(21 * DAY)
        assert db.read_decay_score(COMMUNITY, 1, 1) == 0.375


def test_rule3_half_life_override_per_signal_type(clock):
    cfg = Config(half_life_ns=10 * SEC, half_life_ns_by_type={2: 1 * SEC})
    with TidalDb.open(config=cfg, clock=clock) as db:
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0)
        db.signal_with_context(1, 1, 2, 1.0, timestamp_ns=T0)
        assert db.read_decay_score(COMMUNITY, 1, 1, T0 + 10 * SEC) == 0.5
        assert db.read_decay_score(COMMUNITY, 1, 2, T0 + 10 * SEC) == 2.0**-10


def test_rule3_future_contribution_excluded_and_never_above_weight(clock):
    cfg = Config(half_life_ns=10 * SEC)
    with TidalDb.open(config=cfg, clock=clock) as db:
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0 + 5 * SEC)  # stamped in the future
        db.signal_with_context(1, 1, 1, 2.0, timestamp_ns=T0 - 10 * SEC)
        assert db.read_decay_score(COMMUNITY, 1, 1) == 1.0  # 2 * 2^-1; the future one not counted
        # the clock steps back 20 s: only contributions at or before the read count
        clock.advance(-20 * SEC)
        assert db.read_decay_score(COMMUNITY, 1, 1) == 0.0
        clock.set(T0 + 5 * SEC)
        # 2 * 2^-1.5 + 1 * 2^0
        assert db.read_decay_score(COMMUNITY, 1, 1) == pytest.approx(2 * 2**-1.5 + 1.0, rel=1e-12)
        for at in range(T0 - 30 * SEC, T0 + 30 * SEC, SEC):
            assert db.read_decay_score(COMMUNITY, 1, 1, at) <= 3.0


def test_rule3_read_inside_a_bucket_excludes_later_records_of_that_bucket(clock):
    cfg = Config(half_life_ns=HOUR)
    with TidalDb.open(config=cfg, clock=clock) as db:
        base = (T0 // HOUR) * HOUR
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=base + 10 * SEC)
        db.signal_with_context(1, 1, 1, 4.0, timestamp_ns=base + 20 * SEC)
        at = base + 15 * SEC
        assert db.read_decay_score(COMMUNITY, 1, 1, at) == 2 ** (-(5 * SEC) / HOUR)


def test_rule4_window_bucket_edges(clock):
    width = HOUR
    with TidalDb.open(config=Config(window_width_ns=width, window_buckets=3), clock=clock) as db:
        at = 1000 * width + 7  # b(at) = 1000; window covers buckets 998..1000
        for b, w in ((997, 1.0), (998, 2.0), (999, 4.0), (1000, 8.0), (1001, 16.0)):
            db.signal_with_context(1, 1, 1, w, timestamp_ns=b * width)
        db.signal_with_context(
            1, 1, 1, 32.0, timestamp_ns=1000 * width + width - 1
        )  # same bucket, after at
        assert db.read_window(COMMUNITY, 1, 1, at) == WindowCount(4, 2.0 + 4.0 + 8.0 + 32.0)
        assert db.read_window(COMMUNITY, 1, 1, 997 * width) == WindowCount(1, 1.0)


def test_rule4_window_defaults_one_hour_times_24(clock):
    with TidalDb.open(clock=clock) as db:
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0 - 23 * HOUR)
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0 - 25 * HOUR)
        b_at = T0 // HOUR
        expected = sum(
            1 for t in (T0 - 23 * HOUR, T0 - 25 * HOUR) if b_at - 23 <= t // HOUR <= b_at
        )
        assert db.read_window(COMMUNITY, 1, 1).count == expected == 1


def test_rule5_leave_returns_after_commit(pdb_path, clock):
    import subprocess
    import sys

    probe = (
        "import lmdb,sys; env=lmdb.open(sys.argv[1], max_dbs=8, readonly=True, lock=False);"
        "txn=env.begin(); v=txn.get(bytes(7)+b'\\x01\\x00\\x11', db=env.open_db(b'users', txn=txn, create=False));"
        "print(v.hex())"
    )
    with TidalDb.open(pdb_path, clock=clock) as db:
        db.leave_community_layer(1)
        # committed before the call returned: another process reads it now
        out = subprocess.run(
            [sys.executable, "-c", probe, pdb_path], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == (b"\x01" + T0.to_bytes(8, "little")).hex()


def test_rule7_weights_rounded_to_float32_once(db):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 1, 1, 0.1)
    assert db.read_window("c", 1, 1).weight == float(np.float32(0.1)) == 0.10000000149011612
    _, m = db.request_community_purge(1, "c")
    assert m.entries[0].weight == 0.10000000149011612
    assert db.read_window("c", 1, 1) == (0, 0.0)


def test_rule7_log_cap_evicts_oldest_first(clock):
    with TidalDb.open(config=Config(max_contribution_log_entries=4), clock=clock) as db:
        for i in range(6):  # 6 signals, each one record (@community only)
            db.signal_with_context(1, i, 1, 1.0)
        assert db.stats()["log_records"] <= 6
        _, m = db.request_community_purge(1, COMMUNITY)
        assert [e.entity_id for e in m.entries] == [2, 3, 4, 5]
        assert m.evicted == 2
        assert db.read_decay_score(COMMUNITY, 0, 1) == 1.0
        assert db.read_decay_score(COMMUNITY, 5, 1) == 0.0


def test_rule8_reopen_restores_every_read(pdb_path, clock):
    # no background re-materialization: what was read before the close is the state
    cfg = Config(half_life_ns=HOUR, max_contribution_log_entries=5, rematerialize_after_ms=None)
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        db.assign_cohort(1, "a")
        db.assign_cohort(2, "a")
        db.assign_cohort(2, "b")
        for i in range(6):
            db.signal_with_context(1 + i % 2, i % 3, 1, 1.0 + i, timestamp_ns=T0 - i * SEC)
        db.leave_community_layer(1)
        db.request_community_purge(2, "a")
        rows = db.aggregate_rows()
        before = (
            [db.community_layer_status(u) for u in (1, 2)],
            [db.community_leave_history(u) for u in (1, 2)],
            [db.cohorts_of(u) for u in (1, 2)],
            [db.list_purge_manifests(u) for u in (1, 2)],
            db.top_entities("b", 1, 10),
        )
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        assert db.aggregate_rows() == rows
        after = (
            [db.community_layer_status(u) for u in (1, 2)],
            [db.community_leave_history(u) for u in (1, 2)],
            [db.cohorts_of(u) for u in (1, 2)],
            [db.list_purge_manifests(u) for u in (1, 2)],
            db.top_entities("b", 1, 10),
        )
        assert after == before
        # the log survived too: a purge after reopen retracts what was still logged
        _, m = db.request_community_purge(2, "b")
        live = [e for e in m.entries]
        assert all(e.user_id == 2 and e.cohort == "b" for e in live)


BAD = [
    ("signal_with_context", (True, 1, 1), "user_id"),
    ("signal_with_context", (1.0, 1, 1), "user_id"),
    ("signal_with_context", (-1, 1, 1), "user_id"),
    ("signal_with_context", (2**64, 1, 1), "user_id"),
    ("signal_with_context", (1, np.bool_(True), 1), "entity_id"),
    ("signal_with_context", (1, 1, "x"), "signal_type"),
    ("signal_with_context", (1, 1, 1, float("nan")), "weight"),
    ("signal_with_context", (1, 1, 1, float("inf")), "weight"),
    ("signal_with_context", (1, 1, 1, -0.5), "weight"),
    ("signal_with_context", (1, 1, 1, 1e39), "weight"),
    ("signal_with_context", (1, 1, 1, True), "weight"),
    ("signal_with_context", (1, 1, 1, 1.0, -1), "timestamp_ns"),
    ("signal_with_context", (1, 1, 1, 1.0, 2**63), "timestamp_ns"),
    ("signal_with_context", (1, 1, 1, 1.0, None, {"k": object()}), "context"),
    ("signal_with_context", (1, 1, 1, 1.0, None, [1]), "context"),
    ("assign_cohort", (1, ""), "cohort"),
    ("assign_cohort", (1, "x" * 201), "cohort"),
    ("assign_cohort", (1, "é" * 101), "cohort"),
    ("assign_cohort", (1, "@community"), "cohort"),
    ("assign_cohort", (1, "@x"), "cohort"),
    ("assign_cohort", (1, "\udcff"), "cohort"),
    ("assign_cohort", (1, b"c"), "cohort"),
    ("request_community_purge", (1, "@other"), "cohort_name"),
    ("read_decay_score", ("c", 1, 1, -5), "at_ns"),
    ("top_entities", ("c", 1, 0), "k"),
    ("leave_community_layer", (None,), "user_id"),
]


@pytest.mark.parametrize(("method", "args", "field"), BAD)
def test_rule9_bad_input_named_and_changes_nothing(db, method, args, field):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 1, 1, 1.0)
    before = (db.aggregate_rows(), db.stats()["signals"], db.cohorts_of(1))
    with pytest.raises(InvalidArgument) as ei:
        getattr(db, method)(*args)
    assert ei.value.field == field
    assert field in str(ei.value)
    assert isinstance(ei.value, TidalError)
    assert (db.aggregate_rows(), db.stats()["signals"], db.cohorts_of(1)) == before


def test_rule9_numpy_scalars_accepted_as_python_values(db):
    db.signal_with_context(np.uint64(5), np.int32(6), np.int64(1), np.float32(0.5), np.int64(T0))
    assert db.read_decay_score(COMMUNITY, 6, 1) == 0.5


def test_rule9_signal_batch_all_or_nothing(db):
    good = Signal(1, 1, 1, 1.0)
    with pytest.raises(InvalidArgument) as ei:
        db.signal_batch([good, Signal(1, 1, 1, float("nan")), good])
    assert ei.value.field == "signals[1].weight"
    db.signal_batch([good, Signal(2, 1, 1, 2.0)])
    assert db.read_decay_score(COMMUNITY, 1, 1) == 3.0


def test_rule9_closed_database_raises(clock):
    db = TidalDb.open(clock=clock)
    db.close()
    db.close()  # second close is a no-op
    for call in (
        lambda: db.signal_with_context(1, 1, 1),
        lambda: db.assign_cohort(1, "c"),
        lambda: db.read_decay_score("c", 1, 1),
        lambda: db.flush(),
        lambda: db.list_purge_manifests(1),
    ):
        with pytest.raises(DatabaseClosed):
            call()


def test_context_is_accepted_and_does_not_change_attribution(db):
    db.signal_with_context(1, 1, 1, 1.0, context={"page": "home", "rank": 3})
    assert db.read_decay_score(COMMUNITY, 1, 1) == 1.0


def test_top_entities_order_and_ties(clock):
    with TidalDb.open(config=Config(half_life_ns=SEC), clock=clock) as db:
        for e, w in ((5, 1.0), (3, 2.0), (4, 2.0), (9, 0.5)):
            db.signal_with_context(1, e, 7, w, timestamp_ns=T0)
        db.signal_with_context(1, 8, 7, 100.0, timestamp_ns=T0 + SEC)  # future: not counted
        assert db.top_entities(COMMUNITY, 7, 3) == [(3, 2.0), (4, 2.0), (5, 1.0)]
        assert db.top_entities(COMMUNITY, 7, 10, T0 + SEC) == [
            (8, 100.0),
            (3, 1.0),
            (4, 1.0),
            (5, 0.5),
            (9, 0.25),
        ]


def test_landmark_renormalization_keeps_scores_exact(clock):
    # 2000 half-lives apart would overflow 2**x without renormalization
    cfg = Config(half_life_ns=SEC)
    with TidalDb.open(config=cfg, clock=clock) as db:
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0)
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0 + 2000 * SEC)
        assert db.read_decay_score(COMMUNITY, 1, 1, T0 + 2001 * SEC) == 0.5
        assert math.isfinite(db.read_decay_score(COMMUNITY, 1, 1, T0 + 10**6 * SEC))


def test_manual_clock_is_the_only_time_source():
    clk = ManualClock(5 * HOUR)
    with TidalDb.open(clock=clk) as db:
        db.signal_with_context(1, 1, 1)
        db.leave_community_layer(1)
        assert db.community_layer_status(1).left_at_ns == 5 * HOUR
        assert db.read_window(COMMUNITY, 1, 1, 5 * HOUR) == (1, 1.0)
