"""Adversarial review of the columnar history and ``compact()``: readers of the
history while a compaction commits under them, crashes, erasure and retention
beside merged blocks, extreme values. Every expected value comes from the
reference model (which keeps every record) or from a plain computation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors._errors import StorageError
from tidal_actors.core import states as _behaviours
from tidal_actors.storage import history_rewrite as rewrite_mod
from tidal_actors.storage import lmdb_compact
from tidal_actors.storage.format import (
    batch_key_shard_seq,
    batch_op,
    decode_batches,
    seal,
    unseal,
)
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.history_compact import compact_history_ops
from tidal_actors.storage.stores import MemoryStore
from tidal_actors.testing import ReferenceModel

from . import _crash_worker as W
from ._setups import EVICTING, rounded_rows
from .conftest import SEC, T0
from .test_cli import ROOT
from .test_store_safety import _entries, _rewrite

CFG = EVICTING.replace(ledger_shards=1)
FLUSHED = 80  # signals, each flushed alone: one history batch each, past a read's chunk


@pytest.fixture(params=["listed", "with-a-new-batch"])
def compact_after_listing(monkeypatch, request):
    """The persistence actor's history compaction commits right after a reader has
    listed the history's keys (once): every batch listed is merged into one block,
    so the first chunks the reader reads are all gone. The block is under the last
    key listed, or (``with-a-new-batch``) under the key of a batch written after the
    listing: records no pass reads as settled (cohort "zz", rseq 2**40, membership
    shard 0), so the listed batches' records are under a key the reader never
    listed."""
    done: list[int] = []
    listing = HistoryReader.batch_keys

    def batch_keys(self: HistoryReader) -> list[bytes]:
        keys = listing(self)
        if not done:
            if request.param == "with-a-new-batch":
                shard, seq = batch_key_shard_seq(keys[-1])
                late = [(0, 2**40, 9, "zz", 1, 1, 1.0, T0)]
                self.store.commit([batch_op(shard, seq + 1, tuple(zip(*late)), None)])
            ops, stats = compact_history_ops(self.store.history_items(), block=1 << 14)
            self.store.commit(ops)
            self.store.history_marks.rewritten()
            done.append(stats["batches_before"])
        return keys

    monkeypatch.setattr(HistoryReader, "batch_keys", batch_keys)
    return done


def _workload(m, db: TidalDb | None = None) -> None:
    """Users 1..3 in "c"; signals spread over 40 s, each flushed alone."""
    for u in (1, 2, 3):
        m.assign_cohort(u, "c")
    for i in range(FLUSHED):
        m.signal_with_context(1 + i % 3, i % 4, 1, 1.0 + i % 7, T0 + i * SEC // 2)
        if db is not None:
            db.flush()


READ_TIMES = [T0 + 41 * SEC, T0 + 5 * SEC + 1, T0 + 11 * SEC, T0 + 17 * SEC + SEC // 2]


def test_a_read_inside_settled_buckets_while_a_compaction_merges_is_exact(
    pdb_path, settle_at_once, compact_after_listing
):
    ref = ReferenceModel(CFG, ManualClock(T0))
    _workload(ref)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db, db)
        assert db.stats()["settled_buckets"] > 0
        for at in READ_TIMES:
            assert rounded_rows(db, at) == rounded_rows(ref, at), at
    assert compact_after_listing and compact_after_listing[0] >= FLUSHED


def test_a_rematerialization_while_a_compaction_merges_reads_every_settled_record(
    pdb_path, settle_at_once, compact_after_listing
):
    never = ReferenceModel(CFG, ManualClock(T0))  # user 1's records of c never there
    _workload(never)
    never.request_community_purge(1, "c")
    never.rematerialize("c")
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db, db)
        db.request_community_purge(1, "c")
        db.rematerialize("c")
        for at in READ_TIMES:
            got = [r for r in rounded_rows(db, at) if r[0] in ("c", COMMUNITY)]
            want = [r for r in rounded_rows(never, at) if r[0] in ("c", COMMUNITY)]
            assert got == want, at
    assert compact_after_listing and compact_after_listing[0] >= FLUSHED


# -- a crash (SIGKILL) inside compact() ----------------------------------------------

CRASH_CFG: dict[str, Any] = {
    "ledger_shards": 2,
    "max_contribution_log_entries": 8,
    "rematerialize_after_ms": None,
    "half_life_ns": 50 * SEC,
    "window_width_ns": 10 * SEC,
    "window_buckets": 3,
}


def _crash_workload(m: Any, db: Any = None) -> None:
    """Users 1..4 in "c" and "d"; 72 signals, a few with contexts, flushed every 6."""
    for u in (1, 2, 3, 4):
        m.assign_cohort(u, "c")
        m.assign_cohort(u, "d" if u % 2 else "c")
    for i in range(72):
        ctx = {"i": i, (1, 2): "t"} if i % 7 == 0 else None
        m.signal_with_context(1 + i % 4, i % 5, 1 + i % 2, 0.5 + i % 6, T0 + i * SEC // 3, ctx)
        if db is not None and i % 6 == 5:
            db.flush()


def _kill(db: Any, point: str) -> None:
    """Leave a mark beside the store naming the point reached, then die."""
    Path(db._core.store.path).with_name(f"killed-{point}").touch()
    os.kill(os.getpid(), signal.SIGKILL)


def _compact_and_die_history_merge(db: Any) -> None:
    _behaviours.SETTLE_MIN = 1
    _crash_workload(db, db)
    store = db._core.store
    commit = store.commit

    def dying(ops: Any) -> None:
        ops = list(ops)
        commit(ops)
        if ops and all(o[0] == "history" for o in ops) and any(o[2] is None for o in ops):
            _kill(db, "history_merge")

    store.commit = dying
    db.compact()


def _compact_and_die_in_file_step(db: Any, step: str) -> None:
    _behaviours.SETTLE_MIN = 1
    _crash_workload(db, db)
    store = db._core.store
    fsync = lmdb_compact.fsync_path

    def dying_fsync(path: Path, directory: bool = False) -> None:
        fsync(path, directory)
        if (step == "copied" and not directory) or (step == "replaced" and directory):
            _kill(db, step)

    lmdb_compact.fsync_path = dying_fsync  # type: ignore[assignment]
    if step == "invalidated":
        probe = store._probe
        invalidate = probe.invalidate

        def dying_invalidate() -> None:
            invalidate()
            _kill(db, step)

        probe.invalidate = dying_invalidate
    db.compact()


def _compact_and_die_copied(db: Any) -> None:
    _compact_and_die_in_file_step(db, "copied")


def _compact_and_die_invalidated(db: Any) -> None:
    _compact_and_die_in_file_step(db, "invalidated")


def _compact_and_die_replaced(db: Any) -> None:
    _compact_and_die_in_file_step(db, "replaced")


CRASH_READS = [T0 + 30 * SEC, T0 + 5 * SEC + 1, T0 + 11 * SEC, T0 + 17 * SEC + SEC // 2]


def _same(db: Any, ref: Any) -> None:
    for at in CRASH_READS:
        assert rounded_rows(db, at) == rounded_rows(ref, at), at


@pytest.fixture(scope="module")
def mp():
    return W.forkserver()


@pytest.mark.parametrize("point", ["history_merge", "copied", "invalidated", "replaced"])
def test_a_crash_inside_compact_loses_nothing_and_a_purge_after_it_is_exact(
    mp, tmp_path, settle_at_once, point
):
    path = str(tmp_path / "db")
    scenario = f"tests.test_store_adversarial:_compact_and_die_{point}"
    W.run_until_killed(mp, path, scenario, T0, CRASH_CFG)
    assert (tmp_path / f"killed-{point}").exists()  # died at that point, not after
    cfg = Config(**CRASH_CFG)
    ref = ReferenceModel(cfg, ManualClock(T0))
    _crash_workload(ref)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _same(db, ref)
        db.compact()
        _same(db, ref)
        for cohort in ("c", COMMUNITY):
            db.request_community_purge(1, cohort)
            ref.request_community_purge(1, cohort)
            db.rematerialize(cohort)
            ref.rematerialize(cohort)
        _same(db, ref)
        db.compact()
        users = _history_users(db)
        assert 1 not in users["c"] and 1 not in users[COMMUNITY] and 1 in users["d"]
        _same(db, ref)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _same(db, ref)


def _history_users(db: Any) -> dict[str, set[int]]:
    """cohort -> users of its records in the stored history (decoded)."""
    store = db._core.store
    out: dict[str, set[int]] = {}
    for b in decode_batches([(0, 0, v, k) for k, v in store.history_items()]):
        for ci, u in zip(b.ci.tolist(), b.u.tolist()):
            out.setdefault(b.cohorts[ci], set()).add(u)
    return out


# -- a crash (SIGKILL) in a purge's erasure of the history -------------------------


def _erasure_workload(m: Any, db: Any = None) -> None:
    """`_crash_workload`, a compaction (merged blocks), 24 more signals (batches
    not merged), then user 1 purged from "c": its records span both."""
    _crash_workload(m, db)
    if db is not None:
        db.compact()
    for i in range(72, 96):
        m.signal_with_context(1 + i % 4, i % 5, 1 + i % 2, 0.5 + i % 6, T0 + i * SEC // 3)
        if db is not None and i % 6 == 5:
            db.flush()
    m.request_community_purge(1, "c")


def _erase_and_die(db: Any, after: bool) -> None:
    _behaviours.SETTLE_MIN = 1
    _erasure_workload(db, db)
    store = db._core.store
    erase, commit = rewrite_mod.erase_history_ops, store.commit
    erasing: list[int] = []

    def dying_erase(*args: Any) -> Any:
        ops, n = erase(*args)
        assert n > 0
        if not after:
            _kill(db, "erase-before")
        erasing.append(n)
        return ops, n

    def dying_commit(ops: Any) -> None:
        commit(ops)
        if erasing:
            _kill(db, "erase-after")

    rewrite_mod.erase_history_ops = dying_erase
    store.commit = dying_commit
    db.rematerialize("c")


def _erase_and_die_before(db: Any) -> None:
    _erase_and_die(db, after=False)


def _erase_and_die_after(db: Any) -> None:
    _erase_and_die(db, after=True)


@pytest.mark.parametrize("point", ["before", "after"])
def test_a_crash_in_a_purges_erasure_of_merged_and_unmerged_batches(
    mp, tmp_path, settle_at_once, point
):
    path = str(tmp_path / "db")
    scenario = f"tests.test_store_adversarial:_erase_and_die_{point}"
    W.run_until_killed(mp, path, scenario, T0, CRASH_CFG)
    assert (tmp_path / f"killed-erase-{point}").exists()
    cfg = Config(**CRASH_CFG)
    ref = ReferenceModel(cfg, ManualClock(T0))
    _erasure_workload(ref)
    ref.rematerialize("c")
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        db.rematerialize("c")  # done already (after) or resumed (before)
        _same(db, ref)
        db.compact()
        users = _history_users(db)
        assert 1 not in users["c"] and 1 in users[COMMUNITY]
        _same(db, ref)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _same(db, ref)


# -- corrupt or truncated history values under compact() ----------------------------


def _sealed_cut(key: bytes, value: bytes) -> bytes:
    """The value's payload cut short by 5 bytes, sealed again (its CRC-32 right)."""
    return seal(key, bytes(unseal(value, "history", key))[:-5])


CORRUPTIONS = {
    "flipped": lambda k, v: v[:-3] + bytes([v[-3] ^ 0x10]) + v[-2:],
    "truncated": lambda k, v: v[: len(v) // 2],
    "sealed-cut": _sealed_cut,
    "sealed-version-9": lambda k, v: seal(k, b"\x09" + bytes(unseal(v, "history", k))[1:]),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
@pytest.mark.parametrize("retention", [None, 10**9 * 3600])
def test_compact_over_a_corrupt_history_value_names_the_key_and_changes_nothing(
    tmp_path, how, retention
):
    path = tmp_path / "s"
    cfg = Config(**{**CRASH_CFG, "history_retention_ns": retention})
    ref = ReferenceModel(cfg, ManualClock(T0))
    _crash_workload(ref)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _crash_workload(db, db)
    history = _entries(path)["history"]
    key = sorted(history)[len(history) // 2]
    _rewrite(path, [("history", key, CORRUPTIONS[how](key, history[key]))])
    before = _entries(path)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:  # from the snapshot
        with pytest.raises(StorageError, match=key.hex()):
            db.compact()
        # a read after every record needs no history (one inside a bucket reads it)
        assert rounded_rows(db, CRASH_READS[0]) == rounded_rows(ref, CRASH_READS[0])
    after = _entries(path)
    assert {ks: v for ks, v in after.items() if ks != "meta"} == {
        ks: v for ks, v in before.items() if ks != "meta"
    }


# -- another process reading the store while compact() runs --------------------------

READER = """
import json, sys
from tidal_actors import Config, ManualClock, TidalDb
path, times = sys.argv[1], json.loads(sys.argv[2])
with TidalDb.open(path, read_only=True, clock=ManualClock(times[0])) as db:
    rows = [[list(r) for r in db.aggregate_rows(at)] for at in times]
print(json.dumps(rows))
"""


def _read_beside(path: Path) -> list[list[tuple[Any, ...]]]:
    """`aggregate_rows` at `CRASH_READS`, read by another process opening read-only."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run(
        [sys.executable, "-c", READER, str(path), json.dumps(CRASH_READS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, f"the read-only open failed: {res.stderr[-2000:]}"
    out = res.stdout
    return [
        [(r[0], r[1], r[2], round(r[3], 9), r[4], round(r[5], 9)) for r in rows]
        for rows in json.loads(out)
    ]


@pytest.mark.xfail(
    strict=False,
    reason=(
        "the read-only open made while compact() swaps the file failed now and then "
        "in full runs under load (twice, load 2-5; never in 10 runs alone, 6 of them "
        "under 3 CPU hogs): not diagnosed yet; the reader's error is now in the "
        "assertion message"
    ),
)
def test_a_read_only_open_in_another_process_while_compact_runs(tmp_path, settle_at_once):
    """Another process opens the store read-only before and after compact()'s history
    merge commits, and while the file swap holds lock.mdb (it waits, then reads the
    new file): each read equals the reference model's."""
    path = tmp_path / "s"
    cfg = Config(**CRASH_CFG)
    ref = ReferenceModel(cfg, ManualClock(T0))
    _crash_workload(ref)
    want = [rounded_rows(ref, at) for at in CRASH_READS]
    got: dict[str, Any] = {}
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _crash_workload(db, db)
        store = db._core.store
        commit, invalidate = store.commit, store._probe.invalidate

        def reading_commit(ops: Any) -> None:
            ops = list(ops)
            merge = bool(ops) and all(o[0] == "history" for o in ops)
            if merge:
                got["before merge"] = _read_beside(path)
            commit(ops)
            if merge:
                got["after merge"] = _read_beside(path)

        def reading_invalidate() -> None:
            invalidate()
            t = threading.Thread(target=lambda: got.update(swap=_read_beside(path)))
            t.start()
            got["thread"] = t
            time.sleep(0.5)  # the reader attaches while the lock is held

        store.commit, store._probe.invalidate = reading_commit, reading_invalidate
        db.compact()
        got.pop("thread").join(300)
        _same(db, ref)
    assert sorted(got) == ["after merge", "before merge", "swap"]
    for when, rows in got.items():
        assert rows == want, when


# -- extreme values through a crash, compact() and a purge ---------------------------

BIG = 2**64 - 1
TS_TOP = 2**63 - 1
EXTREME_CFG = Config(membership_shards=255, ledger_shards=3, rematerialize_after_ms=None)
WEIGHTS = (-0.0, 1e-45, 1.1754942e-38, 3.4028234e38, 0.0, 1.5)  # float32 values


def _extreme_workload(m: Any, db: Any = None) -> list[tuple[str, int, int, int, float, int]]:
    """Users at the ends of u64 in 300 cohorts, entities and types at 2**64-1,
    timestamps up to 2**63-1, subnormal, -0.0 and the largest float32 weights, one
    signal in three with a context; returns the records ``(cohort, user, entity,
    type, weight, ts)`` the history must hold (a signal's record in each of its
    user's cohorts and in @community)."""
    users = {BIG: [f"k{i:03d}" for i in range(300)], BIG - 1: ["k007", "z"], 1: ["z"], 0: []}
    for u, cohorts in users.items():
        for c in cohorts:
            m.assign_cohort(u, c)
    recs = []
    for i in range(60):
        u = list(users)[i % 4]
        e, t = (BIG - i % 3, BIG - i % 2) if i % 5 else (i, 0)
        w, ts = WEIGHTS[i % len(WEIGHTS)], TS_TOP - 10**9 * (59 - i) - i % 2
        ctx = {(1, "a"): [i, {"n": None}], "big": BIG} if i % 3 == 0 else None
        m.signal_with_context(u, e, t, w, ts, ctx)
        recs += [(c, u, e, t, w, ts) for c in [*users[u], COMMUNITY]]
        if db is not None and i % 7 == 6:
            db.flush()
    return recs


def _stored_records(path: Path | TidalDb) -> list[tuple[Any, ...]]:
    """``(cohort, user, entity, type, weight, ts)`` of each record in the stored
    history of a closed store (its path) or an open database."""
    if isinstance(path, Path):
        items = list(_entries(path)["history"].items())
    else:
        items = list(path._core.store.history_items())
    out = []
    for k, v in items:
        (b,) = decode_batches([(0, 0, v, k)])
        for j in range(len(b.r)):
            w = float(b.w[j])
            out.append((b.cohorts[b.ci[j]], int(b.u[j]), int(b.e[j]), int(b.t[j]), w, int(b.ts[j])))
    return out


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _key(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*r[:4], struct.pack("<f", r[4]), r[5])  # -0.0 apart from 0.0


def _close(db: Any, ref: Any, times: list[int]) -> None:
    """Equal rows at ``times``, the sums to float rounding (near 2**128 they differ
    in the last place with the order of the additions)."""
    for t in times:
        got, want = db.aggregate_rows(t), ref.aggregate_rows(t)
        assert [r[:3] + r[4:5] for r in got] == [r[:3] + r[4:5] for r in want], t
        for g, w in zip(got, want):
            assert (g[3], g[5]) == pytest.approx((w[3], w[5]), rel=1e-12), (t, g, w)


def test_extreme_values_survive_a_crash_compact_and_a_purge(tmp_path):
    path = tmp_path / "s"
    ref = ReferenceModel(EXTREME_CFG, ManualClock(TS_TOP))
    recs = _extreme_workload(ref)
    want = sorted(_key((*r[:4], _f32(r[4]), r[5])) for r in recs)
    crashed = tmp_path / "crashed"
    db = TidalDb.open(path, config=EXTREME_CFG, clock=ManualClock(TS_TOP))
    try:
        _extreme_workload(db, db)
        db.flush()
        crashed.mkdir()
        for name in ("data.mdb", "tidal.store"):
            shutil.copy(path / name, crashed / name)
    finally:
        db.close()
    at = [TS_TOP, TS_TOP - 30 * 10**9]
    for store in (crashed, path):
        assert sorted(map(_key, _stored_records(store))) == want
        with TidalDb.open(store, config=EXTREME_CFG, clock=ManualClock(TS_TOP)) as db:
            _close(db, ref, at)
            db.compact()
            db.compact()
        assert sorted(map(_key, _stored_records(store))) == want
    ref.request_community_purge(BIG, "k007")
    ref.rematerialize("k007")
    with TidalDb.open(crashed, config=EXTREME_CFG, clock=ManualClock(TS_TOP)) as db:
        db.request_community_purge(BIG, "k007")
        db.rematerialize("k007")
        _close(db, ref, at)
        db.compact()
    left = sorted(map(_key, _stored_records(crashed)))
    assert left == [r for r in want if not (r[0] == "k007" and r[1] == BIG)]
    with TidalDb.open(crashed, config=EXTREME_CFG, clock=ManualClock(TS_TOP)) as db:
        _close(db, ref, at)


# -- retention with compact() ------------------------------------------------------


def test_retention_drops_records_from_merged_blocks_and_batches_at_each_compact(tmp_path):
    """Retention of 10 s: each compact() leaves exactly the records stamped at or after
    now - 10 s, from the blocks an earlier compact() merged and from the batches
    written since; the aggregates keep every record (the reference model's reads)."""
    path = tmp_path / "s"
    cfg = Config(**{**CRASH_CFG, "history_retention_ns": 10 * SEC})
    ref = ReferenceModel(cfg, ManualClock(T0))
    _erasure_workload(ref)
    clock = ManualClock(T0 + 12 * SEC)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        _crash_workload(db, db)
        all_recs = sorted(map(_key, _stored_records(db)))
        db.compact()
        after_1 = sorted(map(_key, _stored_records(db)))
        assert after_1 == [r for r in all_recs if r[5] >= T0 + 2 * SEC]
        for i in range(72, 96):  # `_erasure_workload`'s later signals
            db.signal_with_context(1 + i % 4, i % 5, 1 + i % 2, 0.5 + i % 6, T0 + i * SEC // 3)
            if i % 6 == 5:
                db.flush()
        db.request_community_purge(1, "c")
        more = sorted(map(_key, _stored_records(db)))
        clock.advance(10 * SEC)
        db.compact()
        assert sorted(map(_key, _stored_records(db))) == [r for r in more if r[5] >= T0 + 12 * SEC]
        assert rounded_rows(db, CRASH_READS[0]) == rounded_rows(ref, CRASH_READS[0])
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        assert rounded_rows(db, CRASH_READS[0]) == rounded_rows(ref, CRASH_READS[0])


# -- a purge whose records span merged blocks and batches: no byte left on disk ------

SECRET_ENTITY = 0x5A17_C0DE_9E3D_4B21  # only user 1 ever touched it
SECRET_CONTEXT = "only-user-1-said-this-7f3a9c"


@pytest.mark.parametrize("ledger_shards", [1, 2])
def test_a_purge_spanning_merged_blocks_and_batches_leaves_no_byte(tmp_path, ledger_shards):
    """User 1's records (a unique entity, a unique context string) are in blocks a
    compact() merged and in batches written after it; once purged from every cohort,
    re-materialized and compacted, neither the decoded history nor the data file
    holds any of them (docs/guarantees.md)."""
    path = tmp_path / "s"
    cfg = Config(
        max_contribution_log_entries=20, rematerialize_after_ms=None, ledger_shards=ledger_shards
    )
    clock = ManualClock(T0 + 10**12)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in (1, 2):
            db.assign_cohort(u, "c")
        for part in range(2):  # merged by the compact() between, then batches
            for i in range(6):
                db.signal_with_context(
                    1, SECRET_ENTITY, 1, 3.0, T0 + 1000 * part + i, {"note": SECRET_CONTEXT}
                )
                db.flush()
            for i in range(40):  # evicts user 1's records from the log (cap 20)
                db.signal_with_context(2, 1000 + i % 5, 1, 1.0, T0 + 1000 * part + 100 + i)
            db.flush()
            if part == 0:
                db.compact()
        for cohort in ("c", COMMUNITY):
            db.request_community_purge(1, cohort)
            db.rematerialize(cohort)
        db.compact()
        assert {r[1] for r in _stored_records(db)} == {2}
        assert db.read_window("c", SECRET_ENTITY, 1).count == 0
        assert db.read_window("c", 1000, 1).count == 16
    data = (path / "data.mdb").read_bytes()
    needles = [SECRET_CONTEXT.encode(), SECRET_ENTITY.to_bytes(8, "little")]
    assert [n for n in needles if n in data] == []
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        assert db.read_window("c", 1000, 1).count == 16
    data = (path / "data.mdb").read_bytes()
    assert [n for n in needles if n in data] == []


# -- compact() twice -------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 40])
def test_a_second_compact_rewrites_nothing_when_nothing_came_since(n):
    """A lone block the first compact() wrote is left as it is by the second, also
    when LZ4 could not shorten it (a block of one record is stored uncompressed)."""
    store = MemoryStore()
    recs = [(0, i, 7 + i, "c", 1, 1, 1.0, T0 + i) for i in range(n)]
    for seq, r in enumerate(recs):
        store.commit([batch_op(0, seq, tuple(zip(r)), None)])
    ops, stats = compact_history_ops(store.history_items())
    # n - 1 deletes and one block (a lone batch too: it is marked, codec 3 when LZ4
    # cannot shorten it, as a block of one record is not)
    assert (stats["batches_rewritten"], len(ops)) == (1, n)
    assert unseal(ops[-1][2], "history", ops[-1][1])[1] == (3 if n == 1 else 2)
    store.commit(ops)
    ops, stats = compact_history_ops(store.history_items())
    assert (ops, stats["batches_rewritten"], stats["batches_after"]) == ([], 0, 1)


# -- compact() refused after the history's merge ----------------------------------


def test_a_compaction_refused_after_the_history_merge_keeps_the_merge_and_says_so(
    tmp_path, monkeypatch
):
    """A process attaches between ``check_compact`` and the file's compaction: the
    history's merge (one transaction) is committed already and stays; the refusal
    names the process and says the history was rewritten; every read is unchanged,
    the next compact() (the process gone) compacts the file, and a reopen reads
    the same."""
    from tidal_actors.storage.lmdb_lock import LockProbe

    from .test_store_safety import CFG as SAFE_CFG
    from .test_store_safety import _export, _outside_reader, _populate, _reopened

    path, clock = tmp_path / "s", ManualClock(T0)
    real = LockProbe.holder
    calls: list[int] = []

    def late(self):  # the check sees nobody; the compaction sees the reader
        calls.append(1)
        return None if len(calls) == 1 else real(self)

    with TidalDb.open(path, config=SAFE_CFG, clock=clock) as db:
        _populate(db, clock)
        for i in range(6):  # more batches: a merge to do
            db.signal_with_context(1 + i, 5, 1, 1.0, T0 + i)
            db.flush()
        want = _export(db)
        store = db._core.store
        before = [k for k, _ in store.history_items()]
        records = sorted(
            r
            for b in decode_batches(
                [(*batch_key_shard_seq(k), v, k) for k, v in store.history_items()]
            )
            for r in zip(b.m.tolist(), b.r.tolist())
        )
        reader = _outside_reader(path, False)
        try:
            monkeypatch.setattr(LockProbe, "holder", late)
            with pytest.raises(StorageError) as exc:
                db.compact()
            monkeypatch.undo()
            assert f"process {reader.pid} has" in str(exc.value)
            assert "before this refusal the history was rewritten" in str(exc.value)
            items = [(bytes(k), bytes(v)) for k, v in store.history_items()]
            after = [k for k, _ in items]
            assert len(after) < len(before)  # merged, and committed
            merged = decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in items])
            assert sorted(r for b in merged for r in zip(b.m.tolist(), b.r.tolist())) == records
            assert _export(db) == want
        finally:
            reader.kill()
            reader.wait()
        got = db.compact()  # the reader gone: the file is compacted, the history left as is
        assert got["bytes_after"] <= got["bytes_before"]
        assert [k for k, _ in store.history_items()] == after
        assert _export(db) == want
    assert _reopened(path, clock) == want
