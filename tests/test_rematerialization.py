"""Issue 7: re-materialization after purge, erasure that leaves nothing on disk, and
purges interrupted by a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    InvalidArgument,
    ManualClock,
    PurgeId,
    TidalDb,
    UnknownCohort,
    UnknownPurge,
)
from tidal_actors.testing import ReferenceModel

from ._setups import EVICTING, rounded_rows
from .conftest import SEC, T0

CFG = EVICTING


def _workload(db, *, with_user_1_in_c: bool) -> None:
    """Users 1..3; user 1 signals a lot, so most of its records are evicted."""
    for u in (1, 2, 3):
        if u != 1 or with_user_1_in_c:
            db.assign_cohort(u, "c")
        db.assign_cohort(u, "d")
    for i in range(12):
        db.signal_with_context(1, i % 3, 1, 1.0 + i, T0 - i * SEC)
    db.signal_with_context(2, 0, 1, 0.5, T0 - 3 * SEC)
    db.signal_with_context(3, 1, 1, 2.0, T0 - 30 * SEC)


def test_purge_then_rematerialize_equals_never_attributed(pdb_path, clock):
    # reference: a run in which user 1's signals were never attributed to "c"
    never = ReferenceModel(CFG, ManualClock(T0))
    _workload(never, with_user_1_in_c=False)
    with TidalDb.open(pdb_path, config=CFG, clock=clock) as db:
        _workload(db, with_user_1_in_c=True)
        pid, manifest = db.request_community_purge(1, "c")
        # the log (cap 6) only held the newest records: most of user 1's were evicted
        assert manifest.evicted > 0
        assert len(manifest.entries) + manifest.evicted == 12
        assert rounded_rows(db, T0) != rounded_rows(never, T0)  # evicted records still counted live
        status = db.purge_status(pid)
        assert (status.retracted_live, status.rematerialized) == (len(manifest.entries), False)
        report = db.rematerialize("c")
        assert report.records_excluded == manifest.evicted
        assert report.matched_live is False
        assert report.records_read == 12 + 2 - len(manifest.entries)
        assert rounded_rows(db, T0) == rounded_rows(never, T0)
        assert rounded_rows(db, T0 + 7 * SEC) == rounded_rows(never, T0 + 7 * SEC)
        status = db.purge_status(pid)
        assert status.rematerialized and status.rematerialized_at_ns == T0
        assert status.excluded_by_rematerialization == manifest.evicted
        # nothing left to do: a second rebuild matches the live state
        again = db.rematerialize("c")
        assert (again.records_excluded, again.matched_live) == (0, True)


@pytest.mark.parametrize("newest_at, matched", [(T0, False), (T0 - 10 * SEC, True)])
def test_matched_live_is_false_when_a_purged_record_was_a_keys_newest(
    pdb_path, clock, newest_at, matched
):
    """Nothing evicted: the live retraction already gives the rebuild's scores and
    windows, but a purged record's own timestamp (here the key's newest) is only
    erased by the rebuild; a purged record sharing every timestamp with one that
    stays leaves nothing to erase."""
    with TidalDb.open(pdb_path, config=CFG, clock=clock) as db:
        for u in (1, 2):
            db.assign_cohort(u, "c")
        db.signal_with_context(1, 0, 1, 1.0, T0 - 10 * SEC)
        db.signal_with_context(2, 0, 1, 2.0, newest_at)
        _, manifest = db.request_community_purge(2, "c")
        assert (len(manifest.entries), manifest.evicted) == (1, 0)
        report = db.rematerialize("c")
        assert (report.records_excluded, report.matched_live) == (0, matched)
        # by hand: user 1's record left, 1.0 ten seconds before T0, half-life 50 s
        assert db.read_decay_score("c", 0, 1, T0) == pytest.approx(2.0**-0.2, rel=1e-12)


def test_ephemeral_rebuild_leaves_the_evicted_records(clock):
    """No history to rebuild from: the log's records were retracted by the purge,
    the evicted ones stay (as the reference model with ``history=False``)."""
    ref = ReferenceModel(CFG, ManualClock(T0), history=False)
    _workload(ref, with_user_1_in_c=True)
    with TidalDb.open(config=CFG, clock=clock) as db:
        _workload(db, with_user_1_in_c=True)
        _, manifest = db.request_community_purge(1, "c")
        ref.request_community_purge(1, "c")
        assert manifest.evicted > 0
        before = rounded_rows(db, T0)
        report = db.rematerialize("c")
        assert (report.records_excluded, report.matched_live) == (0, True)
        assert ref.rematerialize("c") == 0
        assert rounded_rows(db, T0) == before == rounded_rows(ref, T0)


def test_signals_after_the_purge_stay(pdb_path, clock):
    with TidalDb.open(pdb_path, config=CFG, clock=clock) as db:
        db.assign_cohort(1, "c")
        for _i in range(10):
            db.signal_with_context(1, 0, 1, 1.0, T0)
        db.request_community_purge(1, "c")
        db.signal_with_context(1, 0, 1, 8.0, T0)
        db.rematerialize("c")
        assert db.read_decay_score("c", 0, 1, T0) == 8.0
        assert db.read_window("c", 0, 1, T0) == (1, 8.0)


def test_background_rematerialization_after_purge(pdb_path, clock):
    cfg = CFG.replace(rematerialize_after_ms=0.0)
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        _workload(db, with_user_1_in_c=True)
        pid, _ = db.request_community_purge(1, "c")
        deadline = time.monotonic() + 10
        while not db.purge_status(pid).rematerialized:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        never = ReferenceModel(CFG, ManualClock(T0))
        _workload(never, with_user_1_in_c=False)
        assert rounded_rows(db, T0) == rounded_rows(never, T0)


def test_rematerialization_runs_in_chunks_and_loses_no_concurrent_signal(
    pdb_path, clock, monkeypatch
):
    from tidal_actors.core import remat as _remat
    from tidal_actors.storage import rematerialize as _rematerialize

    monkeypatch.setattr(_remat, "CHUNK_ROWS", 500)
    monkeypatch.setattr(_rematerialize, "HISTORY_BATCHES", 3)
    cfg = Config(max_contribution_log_entries=2_000, rematerialize_after_ms=None)
    # durable: the rebuild reads the evicted (and settled) records back from the history
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        for u in range(20):
            db.assign_cohort(u, "big")
        for _k in range(20):
            db.signal_batch([_sig(u, e) for u in range(20) for e in range(50)])
        db.request_community_purge(0, "big")
        stop = threading.Event()
        sent = {"big": 0, "other": 0}

        def producer() -> None:
            while not stop.is_set():
                db.signal_with_context(1, 999, 1, 1.0, T0)  # same cohort ("big" and @community)
                sent["big"] += 1

        t = threading.Thread(target=producer)
        t.start()
        report = db.rematerialize("big")
        stop.set()
        t.join()
        db.flush()
        # user 0 had 1,000 records per cohort; the log kept 2,000 of 42,000
        assert report.records_excluded + len(db.list_purge_manifests(0)[0].entries) == 1000
        assert db.read_window("big", 999, 1, T0).count == sent["big"]
        assert db.read_window(COMMUNITY, 999, 1, T0).count == sent["big"]
        expected_other_users = 19 * 20 * 1  # each of users 1..19 signalled entity 7 20 times
        assert db.read_window("big", 7, 1, T0).count == expected_other_users


def _sig(u: int, e: int):
    from tidal_actors import Signal

    return Signal(u, e, 1, 1.0, T0)


def test_rematerialize_errors(db):
    with pytest.raises(InvalidArgument):
        db.rematerialize("")
    with pytest.raises(UnknownCohort):
        db.rematerialize("never-seen")
    # the id in the printed form the CLI and PurgeId(str) take: 12345 = 0x3039
    with pytest.raises(UnknownPurge, match=f"no purge with id {'0' * 28}3039 in"):
        db.purge_status(PurgeId(12345))
    with pytest.raises(InvalidArgument):
        db.purge_status(-1)


def test_erasure_leaves_no_bytes_of_the_purged_pair(pdb_path, clock):
    user = 0x1122334455667788  # little-endian bytes of this id mark its history records
    marker = user.to_bytes(8, "little")
    with TidalDb.open(pdb_path, config=CFG, clock=clock) as db:
        db.assign_cohort(user, "c")
        db.assign_cohort(7, "c")
        for i in range(20):
            db.signal_with_context(user, i, 1, 1.0, T0 - i)
        db.signal_with_context(7, 1, 1, 1.0, T0)
        db.flush()
        with open(os.path.join(pdb_path, "data.mdb"), "rb") as fh:
            assert marker in fh.read()  # the history holds the user's records
        pid, manifest = db.request_community_purge(user, "c")
        db.rematerialize("c")
        db.request_community_purge(user, COMMUNITY)
        db.rematerialize(COMMUNITY)
        sizes = db.compact()
        assert sizes["bytes_after"] <= sizes["bytes_before"]
        assert db.list_purge_manifests(user)[0] == manifest  # the audit record remains
        assert db.read_decay_score("c", 1, 1, T0) == 1.0
    with open(os.path.join(pdb_path, "data.mdb"), "rb") as fh:
        raw = fh.read()
    assert marker not in raw
    with TidalDb.open(pdb_path, config=CFG, clock=clock) as db:
        assert db.read_decay_score("c", 1, 1, T0) == 1.0
        assert db.list_purge_manifests(user)[0] == manifest
        assert db.purge_status(pid).rematerialized


def _history_records(path: str, user: int, cohort: str) -> int:
    """How many of ``user``'s records to ``cohort`` the durable history holds."""
    import lmdb

    from tidal_actors.storage.stores import decode_batch

    env = lmdb.open(path, max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            n = 0
            for key, raw in txn.cursor(db=env.open_db(b"history", txn=txn, create=False)):
                b = decode_batch(0, 0, bytes(raw), bytes(key))
                if cohort in b.cohorts:
                    n += int(((b.u == user) & (b.ci == b.cohorts.index(cohort))).sum())
            return n
    finally:
        env.close()


def test_repeated_purges_erase_exactly_what_each_covers(pdb_path, clock):
    """Each re-materialization erases the records its new purges cover (a pair's
    latest purge covers its earlier ones); records attributed after a purge stay in
    the history until a later purge of that pair covers them."""
    u, v = 0x0102030405060708, 0x1112131415161718
    cfg = CFG.replace(max_contribution_log_entries=1000)
    for user in (u, v):
        with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
            db.assign_cohort(user, "c")
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        for i in range(10):
            db.signal_with_context(u, i, 1, 1.0, T0 + i)
        db.signal_with_context(v, 1, 1, 1.0, T0)
        db.flush()
        db.request_community_purge(u, "c")
        db.rematerialize("c")
        for i in range(5):
            db.signal_with_context(u, i, 1, 1.0, T0 + 100 + i)  # after the first purge
        db.flush()
    assert _history_records(pdb_path, u, "c") == 5 and _history_records(pdb_path, v, "c") == 1
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        db.request_community_purge(u, "c")
        db.rematerialize("c")
        for i in range(3):
            db.signal_with_context(u, i, 1, 1.0, T0 + 200 + i)  # after the second
        db.flush()
    assert _history_records(pdb_path, u, "c") == 3
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        db.request_community_purge(v, "c")  # erases v's record only
        db.rematerialize("c")
        assert db.read_window("c", 0, 1, T0 + 300).count == 1  # u's three, one per entity
    assert _history_records(pdb_path, u, "c") == 3 and _history_records(pdb_path, v, "c") == 0
    assert _history_records(pdb_path, u, COMMUNITY) == 18  # @community was never purged


def test_history_retention_by_age_drops_old_records_at_compaction(pdb_path, clock):
    cfg = CFG.replace(history_retention_ns=100 * SEC)
    old_user = 0x0A0B0C0D0E0F1011
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        db.signal_with_context(old_user, 1, 1, 1.0, T0 - 1000 * SEC)  # older than retention
        db.signal_with_context(5, 1, 1, 1.0, T0)
        db.compact()
        # aggregates keep what the history forgot
        assert db.read_window(COMMUNITY, 1, 1, T0 - 1000 * SEC).count == 1
    # the durable history (what re-materialization reads) no longer has the old record
    assert _history_records(pdb_path, old_user, COMMUNITY) == 0
    assert _history_records(pdb_path, 5, COMMUNITY) == 1


CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from tidal_actors import TidalDb, ManualClock, Config
    SEC = 10**9; T0 = 10**18
    point = sys.argv[2]
    cfg = Config(half_life_ns=50 * SEC, window_width_ns=10 * SEC, window_buckets=3,
                 max_contribution_log_entries=6, rematerialize_after_ms=60_000)
    db = TidalDb.open(sys.argv[1], config=cfg, clock=ManualClock(T0))
    for u in (1, 2, 3):
        db.assign_cohort(u, "d")
        if u != 1 or True:
            db.assign_cohort(u, "c")
    for i in range(12):
        db.signal_with_context(1, i % 3, 1, 1.0 + i, T0 - i * SEC)
    db.signal_with_context(2, 0, 1, 0.5, T0 - 3 * SEC)
    db.signal_with_context(3, 1, 1, 2.0, T0 - 30 * SEC)
    db.flush()
    db.request_community_purge(1, "c")   # committed: manifest + tombstones
    if point == "during":
        threading.Thread(target=db.rematerialize, args=("c",), daemon=True).start()
        time.sleep(0.002)
    print("ready", flush=True)
    os._exit(0)   # killed: no close, no re-materialization finished
    """
)


@pytest.mark.parametrize("point", ["before", "during"])
def test_purge_interrupted_by_crash_resumes_on_reopen(pdb_path, point):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, pdb_path, point], capture_output=True, text=True, timeout=60
    )
    assert "ready" in out.stdout, out.stderr
    never = ReferenceModel(CFG, ManualClock(T0))
    _workload(never, with_user_1_in_c=False)
    cfg = CFG.replace(rematerialize_after_ms=1000.0)  # automatic mode: resume at open
    with TidalDb.open(pdb_path, config=cfg, clock=ManualClock(T0)) as db:
        [manifest] = db.list_purge_manifests(1)
        deadline = time.monotonic() + 20
        while not db.purge_status(manifest.purge_id).rematerialized:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert rounded_rows(db, T0) == rounded_rows(never, T0)
    # and once more after a clean close
    with TidalDb.open(pdb_path, config=cfg, clock=ManualClock(T0)) as db:
        assert rounded_rows(db, T0) == rounded_rows(never, T0)


def test_inspect_shows_purge_status(tmp_path):
    events = tmp_path / "e.csv"
    events.write_text(
        "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n"
        "1,assign,5,c,,,\n2,signal,5,,9,1,1.0\n3,purge,5,c,,,\n"
    )
    data = tmp_path / "db"
    run = [sys.executable, "-m", "tidal_actors.cli"]
    subprocess.run(
        [*run, "replay", str(events), "--data-dir", str(data), "--quiet"], check=True, timeout=120
    )
    out = subprocess.run(
        [*run, "inspect", "--data-dir", str(data), "manifests", "5"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    pid = next(line.split()[1] for line in out.splitlines() if line.startswith("manifest "))
    assert "retracted live 1" in out
    out = subprocess.run(
        [*run, "inspect", "--data-dir", str(data), "purge", pid],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert f"purge {pid}" in out and "cohort      c" in out and "retracted live 1" in out
    bad = subprocess.run(
        [*run, "inspect", "--data-dir", str(data), "purge", "zz"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "purge_id" in bad.stderr
