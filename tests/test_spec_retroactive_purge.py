"""Spec retroactive-purge: its six acceptance criteria, FR-1..FR-5, and the manifest key."""

from __future__ import annotations

import lmdb
import msgpack

from tidal_actors import COMMUNITY, Config, ContributionRecord, PurgeId, TidalDb, encode_key

from .conftest import SEC, T0

HL = 10 * SEC  # a short half-life so decay shows in the numbers


def cfg(**kw):
    return Config(half_life_ns=HL, **kw)


def test_ac1_read_decay_score_reflects_subtracted_contributions(clock):
    with TidalDb.open(config=cfg(), clock=clock) as db:
        db.assign_cohort(1, "c")
        db.assign_cohort(2, "c")
        db.signal_with_context(1, 5, 1, 1.0, timestamp_ns=T0)
        db.signal_with_context(2, 5, 1, 2.0, timestamp_ns=T0 + 10 * SEC)
        at = T0 + 20 * SEC
        # 1 * 2^-2 + 2 * 2^-1 = 0.25 + 1.0
        assert db.read_decay_score("c", 5, 1, at) == 1.25
        _, manifest = db.request_community_purge(1, "c")
        assert db.read_decay_score("c", 5, 1, at) == 1.0
        assert manifest.entries == (ContributionRecord(1, "c", 5, 1, 1.0, T0),)
        # @community untouched by a purge of "c"
        assert db.read_decay_score(COMMUNITY, 5, 1, at) == 1.25


def test_ac2_manifest_durable_and_listable(pdb_path, clock):
    with TidalDb.open(pdb_path, config=cfg(), clock=clock) as db:
        db.assign_cohort(9, "c")
        db.signal_with_context(9, 1, 2, 0.5, timestamp_ns=T0 - SEC)
        pid, manifest = db.request_community_purge(9, "c")
        assert db.list_purge_manifests(9) == [manifest]
    # the spec's key: [user 8B BE][0x00][0x10][purge_id 16B BE], items keyspace
    env = lmdb.open(pdb_path, max_dbs=8, readonly=True, lock=False)
    items = env.open_db(b"items", create=False)
    key = (9).to_bytes(8, "big") + b"\x00\x10" + int(pid).to_bytes(16, "big")
    assert key == encode_key(9, 0x10, pid.to_bytes16())
    with env.begin() as txn:
        raw = txn.get(key, db=items)
    env.close()
    decoded = msgpack.unpackb(raw)
    assert decoded[0] == int(pid).to_bytes(16, "big")
    assert decoded[1:4] == [9, "c", T0]
    assert decoded[4] == [[9, "c", 1, 2, 0.5, T0 - SEC]]
    with TidalDb.open(pdb_path, config=cfg(), clock=clock) as db:
        assert db.list_purge_manifests(9) == [manifest]


def test_ac3_second_purge_no_double_retraction(db):
    db.assign_cohort(1, "c")
    db.assign_cohort(2, "c")
    db.signal_with_context(1, 1, 1, 1.0)
    db.signal_with_context(2, 1, 1, 2.0)
    pid1, m1 = db.request_community_purge(1, "c")
    pid2, m2 = db.request_community_purge(1, "c")
    assert pid2 > pid1 and isinstance(pid2, PurgeId)
    assert len(m1.entries) == 1 and m2.entries == ()
    assert db.read_decay_score("c", 1, 1) == 2.0
    assert db.list_purge_manifests(1) == [m1, m2]


def test_ac4_scores_never_negative_after_purge(clock):
    with TidalDb.open(config=cfg(), clock=clock) as db:
        db.assign_cohort(1, "c")
        for i in range(50):
            db.signal_with_context(1, 1, 1, 0.1 * (i + 1), timestamp_ns=T0 - i * SEC)
        db.request_community_purge(1, "c")
        assert db.read_decay_score("c", 1, 1) == 0.0
        assert db.read_window("c", 1, 1) == (0, 0.0)
        assert db.top_entities("c", 1, 5) == []


def test_ac5_purging_a_does_not_affect_b(db):
    for u in (1, 2):
        db.assign_cohort(u, "c")
        db.assign_cohort(u, "d")
    db.signal_with_context(1, 1, 1, 1.0)
    db.signal_with_context(2, 1, 1, 2.0)
    db.request_community_purge(1, "c")
    assert db.read_decay_score("c", 1, 1) == 2.0
    assert db.read_decay_score("d", 1, 1) == 3.0
    assert db.read_decay_score(COMMUNITY, 1, 1) == 3.0
    assert db.read_window("c", 1, 1) == (1, 2.0)


def test_ac6_purge_of_non_member_returns_empty_manifest(db):
    db.signal_with_context(4, 1, 1, 1.0)
    _pid, m = db.request_community_purge(4, "never")
    assert m.entries == () and m.user_id == 4 and m.cohort == "never"
    assert db.read_decay_score(COMMUNITY, 1, 1) == 1.0


def test_fr4_purge_works_for_left_user_and_community(db):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 3, 1, 1.5)
    db.leave_community_layer(1)
    _, m = db.request_community_purge(1, COMMUNITY)
    assert [e.cohort for e in m.entries] == [COMMUNITY]
    assert db.read_decay_score(COMMUNITY, 3, 1) == 0.0
    assert db.read_decay_score("c", 3, 1) == 1.5


def test_fr1_eviction_oldest_first_evicted_not_retracted(clock):
    # cap 3 records; each signal of user 1 makes 2 records (c, @community)
    with TidalDb.open(config=cfg(max_contribution_log_entries=3), clock=clock) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 1, 1, 1.0, timestamp_ns=T0)  # records 0 (c) 1 (@)
        db.signal_with_context(1, 1, 1, 2.0, timestamp_ns=T0)  # records 2 (c) 3 (@): 0 evicted
        _, m = db.request_community_purge(1, "c")
        assert [e.weight for e in m.entries] == [2.0]
        assert m.evicted == 1
        assert db.read_decay_score("c", 1, 1, T0) == 1.0  # the evicted weight stays
        # the drain freed room: record 1 (@community, weight 1) is still retractable
        db.signal_with_context(2, 1, 1, 4.0, timestamp_ns=T0)  # record 4 (@); log: 1, 3, 4
        _, m2 = db.request_community_purge(1, COMMUNITY)
        assert [e.weight for e in m2.entries] == [1.0, 2.0]
        assert db.read_decay_score(COMMUNITY, 1, 1, T0) == 4.0
