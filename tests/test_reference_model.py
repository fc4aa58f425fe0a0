"""The reference model against values computed by hand (arithmetic in the comments).

The model is the oracle of the differential tests, so nothing here is checked against
the model itself: every expected number is worked out below from the semantics
(docs/semantics.md) and the specs. The model stays independent of the runtime: its
modules import only the vocabulary, intake validation and the shard hash
(`test_the_model_imports_nothing_of_the_runtime`).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, UnknownCohort
from tidal_actors._types import (
    COMMUNITY,
    CommunityMembership,
    ContributionRecord,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    Signal,
    WindowCount,
)
from tidal_actors.testing.reference import ReferenceModel

S = 1_000_000_000  # ns per second
A, B, C = 101, 202, 303  # user ids
E, T = 7, 1  # an entity id and a signal type


def model(clock: ManualClock | None = None, **cfg: object) -> ReferenceModel:
    return ReferenceModel(Config(**cfg), clock or ManualClock(0))  # type: ignore[arg-type]


# ---------------------------------------------------------------- independence

TESTING = Path(__file__).resolve().parents[1] / "tidal_actors" / "testing"
VOCABULARY = {f"tidal_actors.{m}" for m in ("_clock", "_config", "_errors", "_types")}
ALLOWED = VOCABULARY | {"tidal_actors.core.validate", "tidal_actors.storage.format"}


def test_the_model_imports_nothing_of_the_runtime() -> None:
    """The oracle shares only vocabulary, intake checks and the shard hash and log
    capacity with the product, so a bug in the product's rules cannot hide in it."""
    for name in ("reference.py", "reference_aggregates.py"):
        tree = ast.parse((TESTING / name).read_text(encoding="utf-8"))
        imported = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            if node.module.startswith("tidal_actors")
        } | {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name.startswith("tidal_actors")
        }
        own = {"tidal_actors.testing.reference_aggregates"}
        assert imported - own <= ALLOWED, (name, sorted(imported - own - ALLOWED))


# ---------------------------------------------------------------- decay


def test_decay_one_and_two_half_lives() -> None:
    m = model(half_life_ns=10 * S)
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=0)
    # 2.0 * 2**(-0/10) = 2.0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 2.0
    # 2.0 * 2**(-10/10) = 1.0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=10 * S) == 1.0
    # 2.0 * 2**(-20/10) = 0.5
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=20 * S) == 0.5
    # 2.0 * 2**(-5/10) = 2 / sqrt(2) = sqrt(2)
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=5 * S) == pytest.approx(
        math.sqrt(2), rel=1e-15
    )


def test_decay_sums_contributions() -> None:
    m = model(half_life_ns=10 * S)
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(B, E, T, weight=3.0, timestamp_ns=10 * S)
    # at 20 s: 1 * 2**-2 + 3 * 2**-1 = 0.25 + 1.5 = 1.75
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=20 * S) == 1.75


def test_half_life_override_per_type() -> None:
    m = model(half_life_ns=10 * S, half_life_ns_by_type={2: 5 * S})
    m.signal_with_context(A, E, 2, weight=4.0, timestamp_ns=0)
    m.signal_with_context(A, E, 3, weight=4.0, timestamp_ns=0)
    # type 2 has half-life 5 s: 4 * 2**(-10/5) = 4 / 4 = 1.0
    assert m.read_decay_score(COMMUNITY, E, 2, at_ns=10 * S) == 1.0
    # type 3 uses the default 10 s: 4 * 2**(-10/10) = 2.0
    assert m.read_decay_score(COMMUNITY, E, 3, at_ns=10 * S) == 2.0


def test_future_stamped_contribution_is_excluded() -> None:
    m = model(half_life_ns=10 * S)
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(A, E, T, weight=5.0, timestamp_ns=30 * S)
    # at 10 s only the first counts: 1 * 2**-1 = 0.5 (not 0.5 + 5 * 2**2 = 20.5)
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=10 * S) == 0.5
    # at 30 s both: 1 * 2**-3 + 5 * 2**0 = 0.125 + 5 = 5.125
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=30 * S) == 5.125


def test_clock_moved_backwards_never_inflates() -> None:
    clock = ManualClock(100 * S)
    m = model(clock, half_life_ns=10 * S)
    m.signal_with_context(A, E, T, weight=2.0)  # stamped with now = 100 s
    assert m.read_decay_score(COMMUNITY, E, T) == 2.0
    clock.set(50 * S)
    # now = 50 s < 100 s: excluded, so 0.0 (the naive 2 * 2**(50/10) would be 64)
    assert m.read_decay_score(COMMUNITY, E, T) == 0.0
    m.signal_with_context(A, E, T, weight=1.0)  # stamped 50 s
    # at 50 s: only the 50 s one: 1.0
    assert m.read_decay_score(COMMUNITY, E, T) == 1.0
    clock.set(110 * S)
    # 2 * 2**(-10/10) + 1 * 2**(-60/10) = 1 + 1/64 = 1.015625
    assert m.read_decay_score(COMMUNITY, E, T) == 1.015625


def test_unknown_cohort_or_key_reads_zero() -> None:
    m = model()
    assert m.read_decay_score("nobody", E, T, at_ns=0) == 0.0
    assert m.read_window("nobody", E, T, at_ns=0) == WindowCount(0, 0.0)
    assert m.top_entities("nobody", T, 5, at_ns=0) == []
    m.signal_with_context(A, E, T, timestamp_ns=0)
    assert m.read_decay_score(COMMUNITY, E + 1, T, at_ns=0) == 0.0


# ---------------------------------------------------------------- window


def test_window_bucket_edges() -> None:
    # width 10 ns, 3 buckets; at = 35 -> b(at) = 35 // 10 = 3, covers buckets 1..3,
    # i.e. timestamps 10..39
    m = model(window_width_ns=10, window_buckets=3)
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=9)  # bucket 0: out
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=10)  # bucket 1 = b(at)-n+1: in
    m.signal_with_context(A, E, T, weight=4.0, timestamp_ns=39)  # bucket 3 = b(at), t > at: in
    m.signal_with_context(A, E, T, weight=8.0, timestamp_ns=40)  # bucket 4: out
    # count 2, weight 2 + 4 = 6
    assert m.read_window(COMMUNITY, E, T, at_ns=35) == WindowCount(2, 6.0)
    # at = 40 -> buckets 2..4 = timestamps 20..49: 4 + 8 = 12
    assert m.read_window(COMMUNITY, E, T, at_ns=40) == WindowCount(2, 12.0)
    # at = 9 -> buckets -2..0 = timestamps <= 9: only the 1.0
    assert m.read_window(COMMUNITY, E, T, at_ns=9) == WindowCount(1, 1.0)


def test_window_defaults_hour_by_24() -> None:
    hour = 3600 * S
    m = model()
    m.signal_with_context(A, E, T, timestamp_ns=0)  # bucket 0
    m.signal_with_context(A, E, T, timestamp_ns=24 * hour)  # bucket 24
    # at 23h59: b = 23, covers 0..23 -> just the first
    assert m.read_window(COMMUNITY, E, T, at_ns=24 * hour - 1) == WindowCount(1, 1.0)
    # at 24h: b = 24, covers 1..24 -> just the second
    assert m.read_window(COMMUNITY, E, T, at_ns=24 * hour) == WindowCount(1, 1.0)


# ---------------------------------------------------------------- weights


def test_weight_rounded_to_float32_once() -> None:
    m = model()
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=0.1, timestamp_ns=0)
    # float32(0.1) = 13421773 / 2**27 = 0.100000001490116119384765625
    f32 = 13421773 / 2**27
    assert f32 == 0.10000000149011612
    assert m.read_decay_score("c", E, T, at_ns=0) == 0.10000000149011612
    assert m.read_window("c", E, T, at_ns=0) == WindowCount(1, 0.10000000149011612)
    _, manifest = m.request_community_purge(A, "c")
    assert manifest.entries[0].weight == 0.10000000149011612
    # the same number went in and came out: exactly 0
    assert m.read_decay_score("c", E, T, at_ns=0) == 0.0
    assert m.read_window("c", E, T, at_ns=0) == WindowCount(0, 0.0)


# ---------------------------------------------------------------- cohorts and attribution


def test_attribution_follows_cohorts_at_call_time_in_assignment_order() -> None:
    m = model()
    m.signal_with_context(A, E, T, timestamp_ns=0)  # before any assignment: @community only
    m.assign_cohort(A, "z")
    m.assign_cohort(A, "a")
    m.assign_cohort(A, "z")  # no-op: stays first
    assert m.cohorts_of(A) == frozenset({"z", "a"})
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=0)
    m.unassign_cohort(A, "z")
    m.unassign_cohort(A, "never")  # no-op
    m.signal_with_context(A, E, T, weight=4.0, timestamp_ns=0, context={"src": "feed"})
    assert m.cohorts_of(A) == frozenset({"a"})
    assert m.contribution_log() == [
        ContributionRecord(A, COMMUNITY, E, T, 1.0, 0),
        ContributionRecord(A, "z", E, T, 2.0, 0),
        ContributionRecord(A, "a", E, T, 2.0, 0),
        ContributionRecord(A, COMMUNITY, E, T, 2.0, 0),
        ContributionRecord(A, "a", E, T, 4.0, 0),
        ContributionRecord(A, COMMUNITY, E, T, 4.0, 0),
    ]
    # z: 2; a: 2 + 4 = 6; @community: 1 + 2 + 4 = 7
    assert m.read_decay_score("z", E, T, at_ns=0) == 2.0
    assert m.read_decay_score("a", E, T, at_ns=0) == 6.0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 7.0
    assert m.stats() == {
        "signals": 3,
        "forwarded": 3,
        "gated": 0,
        "records": 6,
        "purges": 0,
        "retracted": 0,
    }


def test_aggregate_rows_sorted_and_listing_future_only_keys() -> None:
    m = model(half_life_ns=10 * S, window_width_ns=S, window_buckets=2)
    m.assign_cohort(A, "b")
    m.signal_with_context(A, 9, T, weight=2.0, timestamp_ns=0)
    m.signal_with_context(A, 3, T, weight=1.0, timestamp_ns=100 * S)  # after `at`
    rows = m.aggregate_rows(at_ns=10 * S)
    # at 10 s: entity 9 -> 2 * 2**-1 = 1.0; window buckets 9..10 hold nothing (t=0 is
    # bucket 0). Entity 3 -> score 0 (t > at), bucket 100 not in 9..10, but listed.
    assert rows == [
        (COMMUNITY, 3, T, 0.0, 0, 0.0),
        (COMMUNITY, 9, T, 1.0, 0, 0.0),
        ("b", 3, T, 0.0, 0, 0.0),
        ("b", 9, T, 1.0, 0, 0.0),
    ]


# ---------------------------------------------------------------- leave / rejoin


def test_leave_gates_signals() -> None:
    clock = ManualClock(5)
    m = model(clock)
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=5)
    m.leave_community_layer(A)
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=5)  # gated
    m.signal_batch([Signal(A, E, T, 4.0, 5)])  # gated too
    assert m.community_layer_status(A) == CommunityMembership(A, MembershipStatus.Left, 5)
    # only the first reached anything: 1.0 in c and in @community
    assert m.read_decay_score("c", E, T, at_ns=5) == 1.0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=5) == 1.0
    assert m.read_window("c", E, T, at_ns=5) == WindowCount(1, 1.0)
    assert len(m.contribution_log()) == 2
    assert m.stats() == {
        "signals": 3,
        "forwarded": 1,
        "gated": 2,
        "records": 2,
        "purges": 0,
        "retracted": 0,
    }


def test_unknown_user_is_active() -> None:
    m = model()
    assert m.community_layer_status(C) == CommunityMembership(C, MembershipStatus.Active, None)
    assert m.community_leave_history(C) == []
    m.rejoin_community_layer(C)  # never left: no change
    assert m.community_leave_history(C) == []


def test_leave_twice_keeps_first_left_at() -> None:
    clock = ManualClock(5)
    m = model(clock)
    m.leave_community_layer(A)
    clock.set(9)
    m.leave_community_layer(A)
    assert m.community_layer_status(A) == CommunityMembership(A, MembershipStatus.Left, 5)
    assert m.community_leave_history(A) == [LeaveEpoch(5, None)]


def test_rejoin_closes_epoch_and_resumes_forwarding() -> None:
    clock = ManualClock(5)
    m = model(clock)
    m.leave_community_layer(A)
    clock.set(12)
    m.rejoin_community_layer(A)
    assert m.community_layer_status(A) == CommunityMembership(A, MembershipStatus.Active, None)
    assert m.community_leave_history(A) == [LeaveEpoch(5, 12)]
    clock.set(20)
    m.rejoin_community_layer(A)  # already active: no change
    assert m.community_leave_history(A) == [LeaveEpoch(5, 12)]
    m.signal_with_context(A, E, T, weight=3.0, timestamp_ns=20)
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=20) == 3.0
    clock.set(30)
    m.leave_community_layer(A)
    assert m.community_leave_history(A) == [LeaveEpoch(5, 12), LeaveEpoch(30, None)]


# ---------------------------------------------------------------- purge


def test_purge_is_exact_and_leaves_others_untouched() -> None:
    clock = ManualClock(10 * S)
    m = model(clock, half_life_ns=10 * S)
    for u in (A, B):
        m.assign_cohort(u, "c")
    m.assign_cohort(B, "d")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(B, E, T, weight=2.0, timestamp_ns=0)
    # before: c at 10 s = (1 + 2) * 2**-1 = 1.5
    assert m.read_decay_score("c", E, T) == 1.5
    pid, manifest = m.request_community_purge(A, "c")
    # after: only B's 2 * 2**-1 = 1.0; window: B's single 2.0
    assert m.read_decay_score("c", E, T) == 1.0
    assert m.read_window("c", E, T) == WindowCount(1, 2.0)
    # other cohorts untouched: @community still 1.5, d (B only) 1.0
    assert m.read_decay_score(COMMUNITY, E, T) == 1.5
    assert m.read_decay_score("d", E, T) == 1.0
    assert pid == PurgeId(10 * S << 64)
    assert manifest.purge_id == pid
    assert (manifest.user_id, manifest.cohort, manifest.created_at_ns) == (A, "c", 10 * S)
    assert manifest.entries == (ContributionRecord(A, "c", E, T, 1.0, 0),)
    assert manifest.evicted == 0
    assert m.list_purge_manifests(A) == [manifest]
    assert m.list_purge_manifests(B) == []
    # A's @community record is still in the log; B's three records too: 4 of 5 left
    assert ContributionRecord(A, COMMUNITY, E, T, 1.0, 0) in m.contribution_log()
    assert len(m.contribution_log()) == 4
    assert m.stats()["purges"] == 1 and m.stats()["retracted"] == 1


def test_second_purge_is_empty_with_a_new_id() -> None:
    clock = ManualClock(5)
    m = model(clock)
    m.assign_cohort(A, "c")
    m.assign_cohort(B, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=5)
    m.signal_with_context(B, E, T, weight=2.0, timestamp_ns=5)
    pid1, m1 = m.request_community_purge(A, "c")
    pid2, m2 = m.request_community_purge(A, "c")  # same clock: previous + 1
    assert pid1 == 5 << 64 and pid2 == (5 << 64) + 1
    assert len(m1.entries) == 1 and m2.entries == ()
    # no double retraction: still B's 2.0
    assert m.read_decay_score("c", E, T, at_ns=5) == 2.0
    assert m.list_purge_manifests(A) == [m1, m2]
    clock.set(1)  # clock stepped back: ids still increase
    pid3, _ = m.request_community_purge(A, "c")
    assert pid3 == (5 << 64) + 2
    clock.set(7)
    pid4, _ = m.request_community_purge(A, "c")
    assert pid4 == 7 << 64
    assert m.stats()["purges"] == 4 and m.stats()["retracted"] == 1


def test_purge_of_non_member_is_empty_without_error() -> None:
    m = model()
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    _, manifest = m.request_community_purge(C, "c")
    assert manifest.entries == () and manifest.evicted == 0
    _, manifest = m.request_community_purge(C, "no-such-cohort")
    assert manifest.entries == ()
    assert m.read_decay_score("c", E, T, at_ns=0) == 1.0


def test_purge_works_for_left_user_and_community() -> None:
    m = model()
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(B, E, T, weight=2.0, timestamp_ns=0)
    m.leave_community_layer(A)
    _, manifest = m.request_community_purge(A, COMMUNITY)
    assert manifest.entries == (ContributionRecord(A, COMMUNITY, E, T, 1.0, 0),)
    # @community: 1 + 2 - 1 = 2; c keeps A's 1
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 2.0
    assert m.read_decay_score("c", E, T, at_ns=0) == 1.0


def test_purge_with_eviction() -> None:
    # one shard, capacity 3; A in c signals twice -> 4 records:
    #   [cA1, @A1, cA2, @A2]; 4 > 3 -> the oldest, cA1, is evicted -> [@A1, cA2, @A2]
    m = model(half_life_ns=10 * S, max_contribution_log_entries=3, membership_shards=1)
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=10 * S)
    assert [(r.cohort, r.weight) for r in m.contribution_log()] == [
        (COMMUNITY, 1.0),
        ("c", 2.0),
        (COMMUNITY, 2.0),
    ]
    _, mc = m.request_community_purge(A, "c")
    # only cA2 is retracted; cA1 stays: c at 10 s = 1 * 2**-1 = 0.5
    assert mc.entries == (ContributionRecord(A, "c", E, T, 2.0, 10 * S),)
    assert mc.evicted == 1
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 0.5
    assert m.read_window("c", E, T, at_ns=10 * S) == WindowCount(1, 1.0)
    _, mcom = m.request_community_purge(A, COMMUNITY)
    # both @community records were still in the log: all retracted, none evicted
    assert [r.weight for r in mcom.entries] == [1.0, 2.0] and mcom.evicted == 0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=10 * S) == 0.0
    # the evicted count is reported once: a repeat says 0
    _, again = m.request_community_purge(A, "c")
    assert again.entries == () and again.evicted == 0


def test_purge_with_two_oldest_evicted() -> None:
    # capacity 2: [cA1, @A1, cA2, @A2] keeps [cA2, @A2]; cA1 and @A1 evicted
    m = model(max_contribution_log_entries=2, membership_shards=1)
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=0)
    _, mc = m.request_community_purge(A, "c")
    _, mcom = m.request_community_purge(A, COMMUNITY)
    assert [r.weight for r in mc.entries] == [2.0] and mc.evicted == 1
    assert [r.weight for r in mcom.entries] == [2.0] and mcom.evicted == 1
    # what stays is the evicted 1.0 in each
    assert m.read_decay_score("c", E, T, at_ns=0) == 1.0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 1.0


def test_drained_records_free_capacity() -> None:
    # capacity 3, one shard.
    m = model(max_contribution_log_entries=3, membership_shards=1)
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)  # [@A1]
    m.assign_cohort(B, "c")
    m.signal_with_context(B, E, T, weight=4.0, timestamp_ns=0)  # [@A1, cB, @B]  (full)
    m.request_community_purge(B, "c")  # drains cB -> [@A1, @B]  (length 2)
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=0)  # [@A1, @B, @A2]: no eviction
    assert len(m.contribution_log()) == 3
    _, manifest = m.request_community_purge(A, COMMUNITY)
    # both of A's records were retractable (a ring that ignored the drain would have
    # evicted @A1): entries 1.0 and 2.0, evicted 0; @community left with B's 4.0
    assert [r.weight for r in manifest.entries] == [1.0, 2.0] and manifest.evicted == 0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 4.0


def test_log_split_over_membership_shards() -> None:
    from tidal_actors.storage.format import membership_shard_of

    # total 5 over 2 shards: shard 0 holds 3, shard 1 holds 2
    users = {0: [], 1: []}  # type: dict[int, list[int]]
    for u in range(100):
        users[membership_shard_of(u, 2)].append(u)
    u0, u1 = users[0][0], users[1][0]
    m = model(max_contribution_log_entries=5, membership_shards=2)
    for ts in range(4):
        m.signal_with_context(u0, E, T, timestamp_ns=ts)
        m.signal_with_context(u1, E, T, timestamp_ns=ts)
    # 4 records each; shard 0 keeps the last 3 (ts 1..3), shard 1 the last 2 (ts 2..3)
    _, m0 = m.request_community_purge(u0, COMMUNITY)
    _, m1 = m.request_community_purge(u1, COMMUNITY)
    assert [r.timestamp_ns for r in m0.entries] == [1, 2, 3] and m0.evicted == 1
    assert [r.timestamp_ns for r in m1.entries] == [2, 3] and m1.evicted == 2


def test_rematerialize_after_eviction() -> None:
    # capacity 3, one shard, half-life 10 s, all reads at 10 s
    m = model(half_life_ns=10 * S, max_contribution_log_entries=3, membership_shards=1)
    m.assign_cohort(A, "c")
    m.assign_cohort(B, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)  # [cA1, @A1]
    m.signal_with_context(A, E, T, weight=2.0, timestamp_ns=10 * S)
    # [cA1, @A1, cA2, @A2] -> evict cA1 -> [@A1, cA2, @A2]
    m.signal_with_context(B, E, T, weight=4.0, timestamp_ns=10 * S)
    # [@A1, cA2, @A2, cB, @B] -> evict @A1, cA2 -> [@A2, cB, @B]
    _, manifest = m.request_community_purge(A, "c")
    assert manifest.entries == () and manifest.evicted == 2
    # live c: nothing retracted: 1 * 2**-1 + 2 + 4 = 6.5
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 6.5
    # A keeps signalling to c after the purge: not covered by it
    m.signal_with_context(A, E, T, weight=8.0, timestamp_ns=10 * S)
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 14.5  # 6.5 + 8
    excluded = m.rematerialize("c")
    # cA1 and cA2 left out: 4 + 8 = 12
    assert excluded == 2
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 12.0
    assert m.read_window("c", E, T, at_ns=10 * S) == WindowCount(2, 12.0)
    # @community untouched by both: 0.5 + 2 + 4 + 8 = 14.5
    assert m.rematerialize(COMMUNITY) == 0
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=10 * S) == 14.5
    # idempotent
    assert m.rematerialize("c") == 2
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 12.0
    with pytest.raises(UnknownCohort):
        m.rematerialize("never-used")


def test_rematerialize_keeps_live_retractions_consistent() -> None:
    # no eviction: rematerializing after a purge changes nothing
    m = model()
    m.assign_cohort(A, "c")
    m.assign_cohort(B, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    m.signal_with_context(B, E, T, weight=2.0, timestamp_ns=0)
    m.request_community_purge(A, "c")
    before = m.aggregate_rows(at_ns=0)
    assert m.rematerialize("c") == 1  # A's one record to c
    assert m.aggregate_rows(at_ns=0) == before
    # and the rows equal B's alone: c 2.0, @community 1 + 2 = 3
    assert before == [(COMMUNITY, E, T, 3.0, 2, 3.0), ("c", E, T, 2.0, 1, 2.0)]


# ---------------------------------------------------------------- top entities


def test_top_entities_order_and_ties() -> None:
    m = model()
    m.assign_cohort(A, "c")
    for entity, weight in [(5, 2.0), (3, 2.0), (9, 1.0), (4, 3.0), (8, 0.0)]:
        m.signal_with_context(A, entity, T, weight=weight, timestamp_ns=0)
    m.signal_with_context(A, 7, 2, weight=10.0, timestamp_ns=0)  # other type: not listed
    # at 0 scores equal weights; 8 has score 0: left out; the 2.0 tie goes 3 before 5
    assert m.top_entities("c", T, 10, at_ns=0) == [(4, 3.0), (3, 2.0), (5, 2.0), (9, 1.0)]
    assert m.top_entities("c", T, 2, at_ns=0) == [(4, 3.0), (3, 2.0)]
    assert m.top_entities("c", 2, 1, at_ns=0) == [(7, 10.0)]


# ---------------------------------------------------------------- bad input


def _fingerprint(m: ReferenceModel) -> object:
    return (
        m.stats(),
        m.aggregate_rows(at_ns=0),
        m.contribution_log(),
        m.cohorts_of(A),
        m.community_leave_history(A),
        m.list_purge_manifests(A),
    )


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda m: m.signal_with_context(True, E, T, timestamp_ns=0), "user_id"),
        (lambda m: m.signal_with_context(A, 2**64, T, timestamp_ns=0), "entity_id"),
        (lambda m: m.signal_with_context(A, E, 1.0, timestamp_ns=0), "signal_type"),
        (lambda m: m.signal_with_context(A, E, T, weight=math.nan, timestamp_ns=0), "weight"),
        (lambda m: m.signal_with_context(A, E, T, weight=-1.0, timestamp_ns=0), "weight"),
        (lambda m: m.signal_with_context(A, E, T, timestamp_ns=-1), "timestamp_ns"),
        (lambda m: m.signal_with_context(A, E, T, timestamp_ns=0, context=[1]), "context"),
        (lambda m: m.assign_cohort(A, "@x"), "cohort"),
        (lambda m: m.assign_cohort(A, COMMUNITY), "cohort"),
        (lambda m: m.assign_cohort(A, "a" * 201), "cohort"),
        (lambda m: m.assign_cohort(A, "é" * 100 + "a"), "cohort"),  # 2 * 100 + 1 = 201 bytes
        (lambda m: m.assign_cohort(A, ""), "cohort"),
        (lambda m: m.unassign_cohort(False, "c"), "user_id"),
        (lambda m: m.leave_community_layer(-1), "user_id"),
        (lambda m: m.request_community_purge(A, "@x"), "cohort_name"),
        (lambda m: m.read_decay_score("c", E, T, at_ns=-1), "at_ns"),
        (lambda m: m.read_window("@x", E, T), "cohort"),
        (lambda m: m.top_entities("c", T, 0), "k"),
        (
            lambda m: m.signal_batch(
                [Signal(A, E, T, 1.0, 0), Signal(A, E, T, math.inf, 0), Signal(A, E, T, 2.0, 0)]
            ),
            "weight",
        ),
        (lambda m: m.signal_batch([Signal(A, E, T, 1.0, 0), (A, E, T)]), "signals[1]"),
    ],
)
def test_bad_input_raises_and_changes_nothing(call, field) -> None:  # type: ignore[no-untyped-def]
    m = model()
    m.assign_cohort(A, "c")
    m.signal_with_context(A, E, T, weight=1.0, timestamp_ns=0)
    before = _fingerprint(m)
    with pytest.raises(InvalidArgument) as info:
        call(m)
    assert info.value.field == field
    assert _fingerprint(m) == before


def test_edge_values_are_accepted() -> None:
    m = model()
    m.assign_cohort(A, "é" * 100)  # exactly 200 bytes
    m.signal_with_context(2**64 - 1, 2**64 - 1, 0, weight=0.0, timestamp_ns=2**63 - 1)
    assert m.read_window(COMMUNITY, 2**64 - 1, 0, at_ns=2**63 - 1) == WindowCount(1, 0.0)
    assert m.cohorts_of(A) == frozenset({"é" * 100})


def test_signal_batch_applies_in_order() -> None:
    m = model(half_life_ns=10 * S)
    m.assign_cohort(A, "c")
    m.signal_batch([Signal(A, E, T, 1.0, 0), Signal(B, E, T, 2.0, 10 * S)])
    # c: A's 1 at 0 -> at 10 s: 0.5; @community: 0.5 + 2 = 2.5
    assert m.read_decay_score("c", E, T, at_ns=10 * S) == 0.5
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=10 * S) == 2.5
    assert m.stats()["signals"] == 2 and m.stats()["records"] == 3


def test_context_manager_close_flush_are_no_ops() -> None:
    with model() as m:
        m.signal_with_context(A, E, T, timestamp_ns=0)
        m.flush()
    m.close()
    assert m.read_decay_score(COMMUNITY, E, T, at_ns=0) == 1.0
