"""A purge leaves every key as a fresh fold of its remaining contributions.

Before the fix, a purge subtracted the purged user's contributions from float sums:
user 2's 1.0 added beside user 1's 1e17 in the same bucket was lost to rounding at
the add, and purging user 1 left ``read_window == (1, 0.0)`` and a score of 0.0
(the reference model, which sums what remains, reads ``(1, 1.0)`` and 1.0). The
ledger now bounds how much its retractions amplified rounding and sums a key again
from its detail rows when the bound passes ``REFOLD_AT`` (``Aggregates.retract_rows``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

T0 = 10**18
HOUR = 3600 * 10**9
CFG = Config(rematerialize_after_ms=None, half_life_ns=HOUR, window_width_ns=HOUR, window_buckets=4)


def _both(clock: ManualClock):
    return TidalDb.open(config=CFG, clock=clock), ReferenceModel(CFG, clock)


def test_purging_a_huge_contribution_leaves_the_small_one():
    clock = ManualClock(T0)
    db, ref = _both(clock)
    with db:
        for m in (db, ref):
            m.assign_cohort(1, "c")
            m.assign_cohort(2, "c")
            m.signal_with_context(2, 7, 1, 1.0, timestamp_ns=T0)
            m.signal_with_context(1, 7, 1, 1e17, timestamp_ns=T0 + 1)
        db.request_community_purge(1, "c")
        ref.request_community_purge(1, "c")
        clock.advance(10)
        assert tuple(db.read_window("c", 7, 1)) == (1, 1.0) == tuple(ref.read_window("c", 7, 1))
        expected = 2.0 ** (-(T0 + 10 - T0) / HOUR)
        assert db.read_decay_score("c", 7, 1) == pytest.approx(expected, rel=1e-12)
        assert ref.read_decay_score("c", 7, 1) == pytest.approx(expected, rel=1e-12)


def _f32(x: float) -> float:
    return float(np.float32(x))


# weights spread over float32's whole range: a mantissa and a power of ten
weights = st.builds(
    lambda m, e: _f32(min(m * 10.0**e, 3.4e38)),
    st.floats(1.0, 9.99),
    st.integers(-38, 38),
) | st.sampled_from([0.0, 1.0, _f32(3.4e38), _f32(1.2e-38)])

events = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 2), weights, st.integers(0, 3 * HOUR)),
    min_size=1,
    max_size=30,
)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(0, 4 * HOUR))
def test_every_key_after_purges_reads_a_fresh_fold(evs, purged, read_after) -> None:
    clock = ManualClock(T0)
    db, ref = _both(clock)
    with db:
        for m in (db, ref):
            for u in (1, 2, 3, 4):
                m.assign_cohort(u, "c")
        for u, e, w, dt in evs:
            for m in (db, ref):
                m.signal_with_context(u, e, 1, w, timestamp_ns=T0 + dt)
        for u in purged:
            db.request_community_purge(u, "c")
            ref.request_community_purge(u, "c")
            at = T0 + read_after
            for cohort in ("c", COMMUNITY):
                for e in (0, 1, 2):
                    got, want = db.read_window(cohort, e, 1, at), ref.read_window(cohort, e, 1, at)
                    assert got.count == want.count, (cohort, e)
                    assert _close(got.weight, want.weight), (cohort, e, got, want)
                    s, r = (
                        db.read_decay_score(cohort, e, 1, at),
                        ref.read_decay_score(cohort, e, 1, at),
                    )
                    assert _close(s, r), (cohort, e, s, r)


def test_many_small_adds_beside_a_huge_one_then_its_purge():
    """Each of 40,000 weights 1024 + 2**-13 loses its 2**-13 when added beside 2**41:
    rounding error grows with the number of adds, not only with the cancellation
    (40,000 * 2**-13 = 4.88 short of 40,960,004.88 after the purge, 1.2e-7 relative)."""
    from tidal_actors import Signal

    n, big, small = 40_000, float(2**41), 1024 + 2**-13
    clock = ManualClock(T0)
    db, ref = _both(clock)
    with db:
        for m in (db, ref):
            m.assign_cohort(1, "c")
            m.assign_cohort(2, "c")
            m.signal_with_context(1, 7, 1, big, timestamp_ns=T0)
            m.signal_batch([Signal(2, 7, 1, small, T0) for _ in range(n)])
        db.request_community_purge(1, "c")
        ref.request_community_purge(1, "c")
        exact = n * small  # exact in float64: 40,960,004.8828125
        assert db.read_window("c", 7, 1, T0) == (n, exact) == ref.read_window("c", 7, 1, T0)
        assert db.read_decay_score("c", 7, 1, T0) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("gap_s,read_after_s", [(2000, 500), (1060, 100)])
def test_a_refold_brings_the_landmark_back_before_the_remaining_contributions(gap_s, read_after_s):
    """The purged 1e30 moved the key's landmark ``gap_s`` half-lives on; the refold
    used to keep it, so a read between the kept contribution and that landmark scaled
    a sum far after every row: an OverflowError (ActorFailure) or a subnormal."""
    s = 10**9
    t0 = (10**18 // (3600 * s)) * 3600 * s  # an hour boundary: both in one bucket
    cfg = Config(
        rematerialize_after_ms=None, half_life_ns=s, window_width_ns=3600 * s, window_buckets=4
    )
    clock = ManualClock(t0)
    db, ref = TidalDb.open(config=cfg, clock=clock), ReferenceModel(cfg, clock)
    with db:
        for m in (db, ref):
            m.assign_cohort(1, "c")
            m.assign_cohort(2, "c")
            m.signal_with_context(2, 7, 1, 1.1, timestamp_ns=t0)
            m.signal_with_context(1, 7, 1, 1e30, timestamp_ns=t0 + gap_s * s)
            m.request_community_purge(1, "c")
        at = t0 + read_after_s * s
        want = float(np.float32(1.1)) * 2.0**-read_after_s  # by hand: the kept one, decayed
        assert ref.read_decay_score("c", 7, 1, at_ns=at) == pytest.approx(want, rel=1e-12)
        assert db.read_decay_score("c", 7, 1, at_ns=at) == pytest.approx(want, rel=1e-12)


def test_a_purge_after_a_landmark_move_counts_the_exponents_rounding():
    """A retraction after the landmark moved recomputes the purged term against the new
    landmark, while the bucket holds it rescaled from the old one: the two differ by
    up to |d| ln 2 ulps (d up to 256 half-lives), which the refold rule must count."""
    h, w = 10**9, 100 * 10**9
    worst = 0.0
    for trial in range(40):
        t0 = (10**18 // w) * w
        cfg = Config(
            rematerialize_after_ms=None, half_life_ns=h, window_width_ns=w, window_buckets=8
        )
        clock = ManualClock(t0 + 400 * h)
        db, ref = TidalDb.open(config=cfg, clock=clock), ReferenceModel(cfg, clock)
        with db:
            for m in (db, ref):
                for u in (1, 2, 3):
                    m.assign_cohort(u, "c")
                m.signal_with_context(2, 7, 1, 1.0, timestamp_ns=t0 + 12_345 + trial * 7_919)
                m.signal_with_context(
                    1, 7, 1, float(2**20), timestamp_ns=t0 + 67_891_013 + trial * 104_729
                )
                m.signal_with_context(3, 7, 1, 1.0, timestamp_ns=t0 + 300 * h + 370_000_017 + trial)
                m.request_community_purge(1, "c")
            at = t0 + 150 * h
            a, b = (
                db.read_decay_score("c", 7, 1, at_ns=at),
                ref.read_decay_score("c", 7, 1, at_ns=at),
            )
            worst = max(worst, abs(a - b) / b)
    assert worst <= 1e-9
