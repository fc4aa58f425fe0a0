"""Spec leave-stop-forward: each deliverable and the durable layout, end to end."""

from __future__ import annotations

import lmdb

from tidal_actors import (
    COMMUNITY,
    CommunityMembership,
    LeaveEpoch,
    MembershipStatus,
    TidalDb,
    encode_key,
)

from .conftest import HOUR, SEC, T0


def test_leave_sets_left_with_timestamp_and_gates_cohort_and_community(db, clock):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 10, 1, 1.0)
    clock.advance(5 * SEC)
    db.leave_community_layer(1)
    assert db.community_layer_status(1) == CommunityMembership(
        1, MembershipStatus.Left, T0 + 5 * SEC
    )
    db.signal_with_context(1, 10, 1, 4.0)
    # only the pre-leave signal: weight 1 decayed over 5 s of a 7-day half-life
    expected = 2 ** (-(5 * SEC) / (7 * 24 * HOUR))
    assert db.read_decay_score("c", 10, 1) == expected
    assert db.read_decay_score(COMMUNITY, 10, 1) == expected
    assert db.read_window("c", 10, 1) == (1, 1.0)
    s = db.stats()
    assert (s["signals"], s["forwarded"], s["gated"]) == (2, 1, 1)


def test_rejoin_resumes_forwarding_and_preserves_history(db, clock):
    db.leave_community_layer(7)
    clock.advance(10)
    db.rejoin_community_layer(7)
    db.signal_with_context(7, 1, 1, 2.0)
    assert db.read_decay_score(COMMUNITY, 1, 1) == 2.0
    assert db.community_leave_history(7) == [LeaveEpoch(T0, T0 + 10)]
    assert db.community_layer_status(7) == CommunityMembership(7, MembershipStatus.Active, None)


def test_unknown_user_is_active(db):
    assert db.community_layer_status(99) == CommunityMembership(99, MembershipStatus.Active, None)
    assert db.community_leave_history(99) == []


def test_leave_twice_keeps_first_timestamp_and_rejoin_active_is_noop(db, clock):
    db.leave_community_layer(3)
    clock.advance(100)
    db.leave_community_layer(3)
    assert db.community_layer_status(3).left_at_ns == T0
    db.rejoin_community_layer(3)
    db.rejoin_community_layer(3)
    clock.advance(100)
    db.leave_community_layer(3)
    assert db.community_leave_history(3) == [LeaveEpoch(T0, T0 + 100), LeaveEpoch(T0 + 200, None)]


def test_membership_key_and_9_byte_value_exact(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        db.leave_community_layer(0x0102030405060708)
        db.leave_community_layer(5)
        db.rejoin_community_layer(5)
    env = lmdb.open(pdb_path, max_dbs=8, readonly=True, lock=False)
    users = env.open_db(b"users", create=False)
    with env.begin() as txn:
        key = bytes([1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x11])
        assert key == encode_key(0x0102030405060708, 0x11, b"")
        assert txn.get(key, db=users) == b"\x01" + T0.to_bytes(8, "little")
        # Active after rejoin: status 0, left_at stored as 0
        assert txn.get(bytes(7) + b"\x05\x00\x11", db=users) == b"\x00" + bytes(8)
    env.close()


def test_leave_is_durable_across_reopen(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        db.assign_cohort(1, "c")
        db.leave_community_layer(1)
    with TidalDb.open(pdb_path, clock=clock) as db:
        assert db.community_layer_status(1).status is MembershipStatus.Left
        db.signal_with_context(1, 1, 1, 1.0)
        assert db.read_decay_score("c", 1, 1) == 0.0
        assert db.stats()["gated"] == 1
