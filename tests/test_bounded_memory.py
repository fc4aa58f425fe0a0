"""Memory bounded by the log cap.

A ledger drops the 33-byte detail row of records no purge can name any more
(out of the contribution log and, in a durable database, committed to the
history) and keeps their sums per (key, bucket) (`Aggregates.settle`). What it does not
hold it reads back from the durable history: re-materialization
(`storage.rematerialize.RematJob`) and reads inside a settled bucket (`Aggregates._past_terms`).
In an ephemeral database nothing holds that detail: a purge's re-materialization
cannot reach settled records (they stay, as the spec says of evicted entries),
and a read inside a settled bucket leaves its settled records out unless the read
time is at or after the latest of them.

Every expected value here comes from the reference model (which keeps every
record) or by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb
from tidal_actors.core import states as _behaviours
from tidal_actors.testing import ReferenceModel

from ._setups import EVICTING, rounded_rows
from .conftest import SEC, T0

CFG = EVICTING


def _workload(m, user_1_in_c: bool = True) -> None:
    """Users 1..3 in "c"; user 1's 12 signals (then evicted: cap 6) span buckets."""
    for u in (1, 2, 3) if user_1_in_c else (2, 3):
        m.assign_cohort(u, "c")
    for i in range(12):
        m.signal_with_context(1, i % 3, 1, 1.0 + i, T0 + i * SEC)
    for i in range(8):
        m.signal_with_context(2, i % 2, 1, 0.5 + i, T0 + 15 * SEC + i * SEC)
    m.signal_with_context(3, 1, 1, 2.0, T0 + 30 * SEC)


def _held(db) -> int:
    return db.stats()["detail_rows"]


# reads at the end, and inside buckets whose records were settled (user 1's)
READ_TIMES = [T0 + 40 * SEC, T0 + 5 * SEC + 1, T0 + 11 * SEC, T0 + 17 * SEC + SEC // 2, T0]


def test_durable_reads_inside_settled_buckets_are_exact(pdb_path, settle_at_once):
    ref = ReferenceModel(CFG, ManualClock(T0))
    _workload(ref)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db)
        db.flush()
        # 21 signals x 2 records (c, @community); the log holds 6 per membership shard
        assert db.stats()["settled_buckets"] > 0
        assert _held(db) < 42
        for at in READ_TIMES:
            assert rounded_rows(db, at) == rounded_rows(ref, at), at
            for e in (0, 1, 2):
                assert db.read_decay_score("c", e, 1, at) == pytest.approx(
                    ref.read_decay_score("c", e, 1, at), rel=1e-12
                )
    # the snapshot holds the settled sums, not the rows
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        assert _held(db) < 42
        for at in READ_TIMES:
            assert rounded_rows(db, at) == rounded_rows(ref, at), at


def test_durable_purge_removes_settled_records_too(pdb_path, settle_at_once):
    """User 1's records were evicted and settled before the purge: the rebuild reads
    them back from the history and leaves them out, as if user 1 had never been in c."""
    never = ReferenceModel(CFG, ManualClock(T0))  # user 1 never in c: @community only
    _workload(never, user_1_in_c=False)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db)
        db.flush()
        _, manifest = db.request_community_purge(1, "c")
        assert manifest.evicted == 12 and not manifest.entries  # all evicted first
        report = db.rematerialize("c")
        assert report.records_excluded == 12
        for at in READ_TIMES:
            got = [r for r in rounded_rows(db, at) if r[0] in ("c", COMMUNITY)]
            want = [r for r in rounded_rows(never, at) if r[0] in ("c", COMMUNITY)]
            assert got == want, at
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        for at in READ_TIMES:
            got = [r for r in rounded_rows(db, at) if r[0] in ("c", COMMUNITY)]
            assert got == [r for r in rounded_rows(never, at) if r[0] in ("c", COMMUNITY)], at


def test_ephemeral_rebuild_cannot_reach_settled_records(settle_at_once):
    """The documented rule: no history, so user 1's settled records stay in c."""
    ref = ReferenceModel(CFG, ManualClock(T0))
    _workload(ref)
    with TidalDb.open(config=CFG, clock=ManualClock(T0)) as db:
        _workload(db)
        db.flush()
        before = rounded_rows(db, T0 + 40 * SEC)
        assert before == rounded_rows(ref, T0 + 40 * SEC)
        _, manifest = db.request_community_purge(1, "c")
        assert manifest.evicted == 12 and not manifest.entries
        report = db.rematerialize("c")
        assert report.records_excluded == 0 and report.matched_live
        assert rounded_rows(db, T0 + 40 * SEC) == before
        # a read inside a settled bucket, before its latest record: the log holds
        # the last 6 records (user 2's at +21s and +22s, user 3's at +30s); the rest
        # are settled. Entity 0 of c at +16s: bucket T0..+10s (user 1's 1.0, 4.0, 7.0,
        # 10.0 at +0, +3, +6, +9s; latest +9s <= +16s) counts as its sum; bucket
        # +10..+20s (user 2's 0.5, 2.5, 4.5 at +15, +17, +19s; latest +19s > +16s)
        # is left out, where the reference model counts the 0.5.
        at = T0 + 16 * SEC
        h = 50 * SEC
        first = sum((1.0 + i) * 2 ** (-(at - T0 - i * SEC) / h) for i in (0, 3, 6, 9))
        second = 0.5 * 2 ** (-(at - T0 - 15 * SEC) / h)
        assert db.read_decay_score("c", 0, 1, at) == pytest.approx(first, rel=1e-12)
        assert ref.read_decay_score("c", 0, 1, at) == pytest.approx(first + second, rel=1e-12)
        # at +7.5s the first bucket's latest settled record (+9s) is after the read
        at = T0 + 7 * SEC + SEC // 2
        assert db.read_decay_score("c", 0, 1, at) == 0.0
        assert ref.read_decay_score("c", 0, 1, at) > 0.0
        # windows count whole buckets: unchanged by settling
        assert tuple(db.read_window("c", 0, 1, at)) == tuple(ref.read_window("c", 0, 1, at))


def test_refold_after_cancellation_counts_settled_records(settle_at_once):
    """Item 5's cancellation with the small contribution already settled: the key
    is summed again from its held rows and its settled sums."""
    cfg = CFG.replace(max_contribution_log_entries=2)  # the last signal's two records
    clock = ManualClock(T0)
    with TidalDb.open(config=cfg, clock=clock) as db:
        db.assign_cohort(1, "c")
        db.assign_cohort(2, "c")
        db.signal_with_context(2, 7, 1, 1.0, timestamp_ns=T0)
        db.signal_with_context(1, 9, 1, 1.0, timestamp_ns=T0)  # evicts user 2's records
        db.flush()
        assert db.stats()["settled_buckets"] >= 1
        db.signal_with_context(1, 7, 1, 1e17, timestamp_ns=T0 + 1)
        db.flush()
        _, m = db.request_community_purge(1, "c")
        assert [r.weight for r in m.entries] == [float(np.float32(1e17))]
        assert tuple(db.read_window("c", 7, 1, T0 + 10)) == (1, 1.0)
        assert db.read_decay_score("c", 7, 1, T0 + 10) == pytest.approx(
            2.0 ** (-10 / (50 * SEC)), rel=1e-12
        )


CRASH_CHILD = """
import os, sys
sys.path.insert(0, sys.argv[2])
from tests.test_bounded_memory import CFG, _workload
from tidal_actors import ManualClock, TidalDb
from tests.conftest import T0
db = TidalDb.open(sys.argv[1], config=CFG, clock=ManualClock(T0))
_workload(db)
db.flush()
os._exit(0)  # a crash: no close, no snapshot
"""


def test_crash_restore_settles_and_reads_back(pdb_path, settle_at_once):
    """After a crash the history is replayed and the detail of records out of the
    log is settled at once; reads inside settled buckets read the history."""
    root = str(Path(__file__).resolve().parent.parent)
    subprocess.run([sys.executable, "-c", CRASH_CHILD, pdb_path, root], check=True, timeout=120)
    ref = ReferenceModel(CFG, ManualClock(T0))
    _workload(ref)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        assert _held(db) <= 6  # the log's records
        for at in READ_TIMES:
            assert rounded_rows(db, at) == rounded_rows(ref, at), at


def test_held_detail_and_data_file_stay_bounded(tmp_path):
    """Default settling: 10x and 100x the cap in records hold about as many rows,
    and with a retention the data file after compact() does not grow with them."""
    cap = 1_000
    sizes = {}
    for n in (20_000, 200_000):
        path = tmp_path / f"s{n}"
        cfg = Config(
            max_contribution_log_entries=cap, history_retention_ns=1, rematerialize_after_ms=None
        )
        clock = ManualClock(T0 + SEC)  # every signal is older than the 1 ns retention
        with TidalDb.open(str(path), config=cfg, clock=clock) as db:
            for lo in range(0, n, 1_000):
                db.signal_batch(
                    [Signal(u % 997, u % 50, 1, 1.0, T0 + u) for u in range(lo, lo + 1_000)]
                )
            db.flush()
            held = _held(db)
            # the log's 1,000, the log column's lazy compaction (< 2**16 + 2**15) and
            # the settling step (< SETTLE_MIN or a quarter of the held rows)
            assert held <= cap + 2**16 + 2**15 + 2 * _behaviours.SETTLE_MIN, held
        with TidalDb.open(str(path), config=cfg, clock=clock) as db:
            db.compact()
        sizes[n] = os.path.getsize(Path(path) / "data.mdb")
    # 50 keys in one bucket: the settled sums do not grow with the records
    assert sizes[200_000] <= 1.25 * sizes[20_000], sizes
    assert sizes[200_000] < 1_000_000, sizes


def test_read_only_open_reads_settled_buckets_back(pdb_path, settle_at_once):
    """A read-only open (one read transaction, then detached) keeps the history it
    read, so reads inside settled buckets are exact there too."""
    ref = ReferenceModel(CFG, ManualClock(T0))
    _workload(ref)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0), read_only=True) as db:
        assert _held(db) <= 6
        for at in READ_TIMES:
            assert rounded_rows(db, at) == rounded_rows(ref, at), at


@pytest.mark.parametrize("durable", [False, True])
def test_a_purge_after_settling_retracts_the_right_rows(tmp_path, settle_at_once, durable):
    """Found by review: with settled rows still in front of the held ones,
    retract_rows zeroed the user and rseq of other rows; user 2's live records then
    read as evicted and stayed in the aggregates."""
    cfg = Config(
        half_life_ns=50 * SEC,
        window_width_ns=10 * SEC,
        max_contribution_log_entries=4,
        ledger_shards=1,
        rematerialize_after_ms=None,
    )
    ref = ReferenceModel(cfg, ManualClock(T0), history=durable)
    with TidalDb.open(
        str(tmp_path / "s") if durable else None, config=cfg, clock=ManualClock(T0)
    ) as db:
        for u, e in ((1, 10), (1, 11), (2, 20), (2, 21), (3, 30), (3, 31)):
            for m in (db, ref):
                m.signal_with_context(u, e, 1, 1.0, T0 + e)  # cap 4: user 1's two are evicted
            db.flush()
        for u in (3, 2):
            _, got = db.request_community_purge(u, COMMUNITY)
            _, want = ref.request_community_purge(u, COMMUNITY)
            assert (len(got.entries), got.evicted) == (len(want.entries), want.evicted) == (2, 0)
        for e in (20, 21, 30, 31):
            assert db.read_decay_score(COMMUNITY, e, 1, T0 + 100) == 0.0
        assert db.read_decay_score(COMMUNITY, 10, 1, T0 + 100) == ref.read_decay_score(
            COMMUNITY, 10, 1, T0 + 100
        )


@pytest.mark.parametrize("durable", [False, True])
def test_settled_sums_do_not_overflow_with_buckets_of_many_half_lives(
    tmp_path, settle_at_once, durable
):
    """Found by review: a settled sum decayed against its bucket's start reached
    inf once the bucket spanned ~1,024 half-lives (1 s half-life, 1 h buckets); a
    cancelling purge then read inf. Sums are now decayed to their latest timestamp."""
    hour = 3600 * SEC
    t0 = (T0 // hour) * hour
    cfg = Config(
        half_life_ns=SEC,
        window_width_ns=hour,
        max_contribution_log_entries=2,
        rematerialize_after_ms=None,
    )
    now = t0 + 1040 * SEC
    ref = ReferenceModel(cfg, ManualClock(now), history=durable)
    with TidalDb.open(
        str(tmp_path / "s") if durable else None, config=cfg, clock=ManualClock(now)
    ) as db:
        for m in (ref, db):
            m.assign_cohort(1, "c")
            m.assign_cohort(2, "c")
            m.signal_with_context(2, 7, 1, 1.0, t0 + 1030 * SEC)  # 1,030 half-lives into its bucket
            m.signal_with_context(1, 9, 1, 1.0, t0)  # evicts user 2's records: settled
            m.signal_with_context(1, 7, 1, 1e17, t0 + 1030 * SEC + 1)
            m.request_community_purge(1, "c")  # cancels: refold from the settled sum
        want = 2.0**-10  # 1.0, 10 half-lives before now
        assert db.read_decay_score("c", 7, 1) == pytest.approx(want, rel=1e-12)
        assert ref.read_decay_score("c", 7, 1) == pytest.approx(want, rel=1e-12)
        got, wanted = db.top_entities("c", 1, 3), ref.top_entities("c", 1, 3)
        assert [e for e, _ in got] == [e for e, _ in wanted] == [7, 9]
        assert got[0][1] == pytest.approx(wanted[0][1], rel=1e-12)
        # a past read at or after the bucket's latest settled record is exact too
        at = t0 + 1035 * SEC
        assert db.read_decay_score("c", 7, 1, at) == pytest.approx(2.0**-5, rel=1e-12)


def test_a_failure_inside_a_rematerialization_reaches_the_caller_as_a_tidal_error(monkeypatch):
    from tidal_actors import ActorFailure
    from tidal_actors.storage import rematerialize as _remat

    def boom(self):
        raise ValueError("simulated failure inside RematJob.step")

    monkeypatch.setattr(_remat.RematJob, "step", boom)
    with TidalDb.open(config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 1, 1, 1.0)
        db.flush()
        with pytest.raises(ActorFailure, match="simulated failure") as info:
            db.rematerialize("c")
        assert isinstance(info.value.__cause__, ValueError)
