"""Re-materialization on columns against the reference model with 64-bit ids, small
signal batches (plain-Python columns) and rebuild steps made small (adversarial
review, session 29).

The seeded workload of `_differential.random_op` covers ids below 6; here users,
entities and signal types are drawn from values around the narrow key codes' limits
(2**44 entities, 2**6 and 2**20 types: `core.key_codes`, `aggregates._pair_codes`)
up to 2**64 - 1, signals also come in `signal_batch` calls of 1 to 5, and
``CHUNK_ROWS``, ``FINISH_ROWS`` and ``HISTORY_BATCHES`` are so small that every
rebuild runs in many steps (each history batch its own step). Found the history
scan's early stop (tests/test_remat_settled_scan.py) with 2 membership shards.
"""

from __future__ import annotations

import random

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb
from tidal_actors.core import remat
from tidal_actors.storage import rematerialize as srem
from tidal_actors.testing import ReferenceModel

from ._differential import assert_matches, rematerialize_both, rows_mismatch
from .conftest import SEC, T0

ENTITIES = [0, 3, 2**40 + 1, 2**44 - 1, 2**44, 2**63, 2**64 - 1]
TYPES = [0, 1, 63, 64, 2**20, 2**64 - 1]
USERS = [0, 1, 2**63, 2**64 - 1, 2**40 + 7]


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(remat, "CHUNK_ROWS", 3)
    monkeypatch.setattr(remat, "FINISH_ROWS", 1)
    monkeypatch.setattr(srem, "HISTORY_BATCHES", 1)


def _signal(rng: random.Random, user: int) -> Signal:
    return Signal(
        user,
        rng.choice(ENTITIES),
        rng.choice(TYPES),
        rng.choice([0.5, 1.0, 2.0, 0.1]),
        T0 + rng.randrange(-5, 40) * SEC,
    )


def _step(db, ref, rng: random.Random, clocks) -> str:
    """One operation on both (returns "reopen" for the caller to do)."""
    op, u = rng.random(), rng.choice(USERS)
    if op < 0.35:
        s = _signal(rng, u)
        db.signal_with_context(*s[:5])
        ref.signal_with_context(*s[:5])
    elif op < 0.55:
        batch = [_signal(rng, rng.choice(USERS)) for _ in range(rng.randint(1, 5))]
        db.signal_batch(batch)
        for s in batch:
            ref.signal_with_context(*s[:5])
    elif op < 0.65:
        c = rng.choice("abc")
        db.assign_cohort(u, c)
        ref.assign_cohort(u, c)
    elif op < 0.68:
        c = rng.choice("abc")
        db.unassign_cohort(u, c)
        ref.unassign_cohort(u, c)
    elif op < 0.71:
        db.leave_community_layer(u)
        ref.leave_community_layer(u)
    elif op < 0.74:
        db.rejoin_community_layer(u)
        ref.rejoin_community_layer(u)
    elif op < 0.84:
        c = rng.choice(["a", "b", "c", COMMUNITY])
        _, m = db.request_community_purge(u, c)
        _, rm = ref.request_community_purge(u, c)
        assert (len(m.entries), m.evicted) == (len(rm.entries), rm.evicted)
    elif op < 0.92:
        rematerialize_both(db, ref, rng.choice(["a", "b", "c", COMMUNITY]))
    elif op < 0.96:
        d = rng.randrange(-3, 10) * SEC
        for clock in clocks:
            clock.advance(d)
    else:
        return "reopen"
    return ""


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 8, 9, 41, 45])
def test_wide_ids_and_small_rebuild_steps_match_the_reference(seed, tmp_path, small_steps):
    rng = random.Random(seed)
    cfg = Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=rng.choice([5, 40, 5_000_000]),
        membership_shards=rng.choice([1, 2]),
        ledger_shards=rng.choice([1, 2, 3]),
        rematerialize_after_ms=None,
        signal_batch_size=rng.choice([None, 3]),
    )
    clock, rclock = ManualClock(T0), ManualClock(T0)
    path = str(tmp_path / "s")
    ref = ReferenceModel(cfg, rclock, history=True)
    db = TidalDb.open(path, config=cfg, clock=clock)
    try:
        for step in range(300):
            if _step(db, ref, rng, (clock, rclock)) == "reopen":
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 10 == 0:
                bad = rows_mismatch(db.aggregate_rows(clock.now_ns()), ref.aggregate_rows())
                assert bad is None, f"step {step}: {bad}"
        assert_matches(db, ref, USERS, ats=(None, T0 + 17 * SEC), exact_ids=False)
        db.close()
        db = TidalDb.open(path, config=cfg, clock=clock)
        assert_matches(db, ref, USERS, ats=(None,), exact_ids=False, where="reopened: ")
    finally:
        db.close()
