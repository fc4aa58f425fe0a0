"""The pykka runtime against the reference model on seeded random workloads."""

from __future__ import annotations

import random

import pytest

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

from ._differential import assert_matches, random_op
from .conftest import SEC, T0

# of random_op's draws: 60 % signals, 10 % assigns, 5 % unassigns, 5 % leaves, 5 %
# rejoins, 8 % purges, 1.5 % rebuilds, 2.5 % clock moves, 3 % reopens (of a store)
MIX = (
    (0.6, "signal"),
    (0.7, "assign"),
    (0.75, "unassign"),
    (0.8, "leave"),
    (0.85, "rejoin"),
    (0.93, "purge"),
    (0.945, "rematerialize"),
    (0.97, "advance"),
    (1.0, "reopen"),
)


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
    try:
        for step in range(400):
            if random_op(db, ref, rng, (clock, rclock), MIX) == "reopen" and path is not None:
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 50 == 0:
                _compare(db, ref, clock.now_ns())
        _compare(db, ref, clock.now_ns())
        _compare(db, ref, T0 + 17 * SEC)
        assert_matches(db, ref, range(6), ats=(), exact_ids=False)
        if path is not None:
            return  # stats() counts since open; a reopen starts them again
        s, rs = db.stats(), ref.stats()
        for k in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
            assert s[k] == rs[k], k
    finally:
        db.close()
