"""The pykka runtime against the reference model on seeded random workloads."""

from __future__ import annotations

import random

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb, UnknownCohort
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0


def _compare(db, ref, at):
    rows, expect = db.aggregate_rows(at), ref.aggregate_rows(at)
    assert [r[:3] for r in rows] == [r[:3] for r in expect]
    for got, want in zip(rows, expect):
        assert got[3] == pytest.approx(want[3], rel=1e-9, abs=1e-300)
        assert got[4] == want[4]
        assert got[5] == pytest.approx(want[5], rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shards", [(1, 1), (1, 3), (3, 2)])
def test_random_workload_matches_reference(seed, shards, tmp_path):
    rng = random.Random(seed)
    cap = rng.choice([7, 40, 5_000_000])
    cfg = Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=cap,
        membership_shards=shards[0],
        ledger_shards=shards[1],
        rematerialize_after_ms=None,
    )
    clock, rclock = ManualClock(T0), ManualClock(T0)
    path = str(tmp_path / "s") if seed % 2 else None
    ref = ReferenceModel(cfg, rclock, history=path is not None)
    db = TidalDb.open(path, config=cfg, clock=clock)
    cohorts = ["a", "b", "c"]
    try:
        for step in range(400):
            op = rng.random()
            u = rng.randrange(6)
            if op < 0.6:
                args = (
                    u,
                    rng.randrange(5),
                    rng.randrange(2),
                    rng.choice([0.5, 1.0, 2.0, 0.1]),
                    T0 + rng.randrange(-5, 40) * SEC,
                )
                db.signal_with_context(*args)
                ref.signal_with_context(*args)
            elif op < 0.7:
                c = rng.choice(cohorts)
                db.assign_cohort(u, c)
                ref.assign_cohort(u, c)
            elif op < 0.75:
                c = rng.choice(cohorts)
                db.unassign_cohort(u, c)
                ref.unassign_cohort(u, c)
            elif op < 0.8:
                db.leave_community_layer(u)
                ref.leave_community_layer(u)
            elif op < 0.85:
                db.rejoin_community_layer(u)
                ref.rejoin_community_layer(u)
            elif op < 0.93:
                c = rng.choice(cohorts + [COMMUNITY])
                _, m = db.request_community_purge(u, c)
                _, rm = ref.request_community_purge(u, c)
                assert m.entries == rm.entries and m.evicted == rm.evicted
            elif op < 0.945:
                c = rng.choice(cohorts + [COMMUNITY])
                try:
                    excluded = ref.rematerialize(c)
                except UnknownCohort:
                    with pytest.raises(UnknownCohort):
                        db.rematerialize(c)
                else:
                    # the reference counts the pair's live-retracted records too; the
                    # runtime reports only what the rebuild itself left out
                    assert db.rematerialize(c).records_excluded <= excluded
            elif op < 0.97:
                d = rng.randrange(-3, 10) * SEC
                clock.advance(d)
                rclock.advance(d)
            elif path is not None:
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 50 == 0:
                _compare(db, ref, clock.now_ns())
        _compare(db, ref, clock.now_ns())
        _compare(db, ref, T0 + 17 * SEC)
        for u in range(6):
            assert db.community_layer_status(u) == ref.community_layer_status(u)
            assert db.community_leave_history(u) == ref.community_leave_history(u)
            assert db.cohorts_of(u) == ref.cohorts_of(u)
            got = [
                (m.user_id, m.cohort, m.created_at_ns, m.entries, m.evicted)
                for m in db.list_purge_manifests(u)
            ]
            want = [
                (m.user_id, m.cohort, m.created_at_ns, m.entries, m.evicted)
                for m in ref.list_purge_manifests(u)
            ]
            assert got == want
        if path is not None:
            return  # stats() counts since open; a reopen starts them again
        s, rs = db.stats(), ref.stats()
        for k in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
            assert s[k] == rs[k], k
    finally:
        db.close()
