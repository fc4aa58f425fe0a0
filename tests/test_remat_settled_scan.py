"""Re-materialization's scan of the settled history does not stop at batches whose
records a purge retracted live (adversarial review, session 29).

A ledger's settled rows are a prefix of its held rows; `LedgerState.settle` records
per membership shard the next rseq past the *unretracted* ones (``settled_upto``), so
a history batch of the settled prefix whose records were all retracted live has no
record below that bound. The scan of the history (`storage.rematerialize.RematJob`,
and the reads inside a settled bucket, `storage.history.HistoryReader.settled_detail`)
took such a batch for one past every settled record and stopped: the settled records
of the batches after it were left out of the rebuild (their keys dropped) or of the
read.
"""

from __future__ import annotations

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.core.sharding import membership_shard_of
from tidal_actors.storage import rematerialize as srem
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from .conftest import SEC, T0

CFG = Config(
    half_life_ns=30 * SEC,
    window_width_ns=10 * SEC,
    window_buckets=4,
    max_contribution_log_entries=3,
    membership_shards=2,
    ledger_shards=1,
    rematerialize_after_ms=None,
)


# users of the membership shard user 2 is not on (`membership_shard_of`)
OTHERS = [u for u in range(100, 400) if membership_shard_of(u, 2) != membership_shard_of(2, 2)]


def _workload(db, purged_batches: int) -> None:
    """Users of the other membership shard than user 2's: one signal each, flushed
    (one history batch each) and purged from the community at once (retracted live:
    the record is in the log), in ``purged_batches`` rounds; then user 2's 40
    signals, each flushed, most evicted from the log (cap 3) and so settled. The
    settled rows then start with the retracted ones, and the settled bound of their
    membership shard is none."""
    for i, u in enumerate(OTHERS[:purged_batches]):
        db.signal_with_context(u, i, 0, 1.0, T0 + i * SEC)
        db.flush()
        _, manifest = db.request_community_purge(u, COMMUNITY)
        assert (len(manifest.entries), manifest.evicted) == (1, 0)
    for i in range(40):
        db.signal_with_context(2, i % 4, 0, 0.5 + i, T0 + (i % 13 - 6) * SEC)
        db.flush()


def test_rebuild_reads_the_settled_records_after_batches_retracted_live(
    pdb_path, settle_at_once
) -> None:
    # more purged batches than a step reads, so a whole step's batches are retracted
    n = srem.HISTORY_BATCHES + 1
    ref = ReferenceModel(CFG, ManualClock(T0), history=True)
    _workload(ref, n)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db, n)
        assert db.stats()["records"] == n + 40  # every signal attributed (once)
        before = db.aggregate_rows(T0 + 10 * SEC)
        assert rows_mismatch(before, ref.aggregate_rows(T0 + 10 * SEC)) is None
        report = db.rematerialize(COMMUNITY)
        assert report.matched_live is True  # nothing but live retractions to redo
        assert report.records_excluded == 0
        bad = rows_mismatch(db.aggregate_rows(T0 + 10 * SEC), ref.aggregate_rows(T0 + 10 * SEC))
        assert bad is None, bad


def test_read_inside_a_settled_bucket_reads_past_batches_retracted_live(
    pdb_path, settle_at_once
) -> None:
    # a read at a time inside a bucket sums its settled records from the history,
    # 64 batches a chunk: 65 batches of the purged user come first
    ref = ReferenceModel(CFG, ManualClock(T0), history=True)
    _workload(ref, 65)
    with TidalDb.open(pdb_path, config=CFG, clock=ManualClock(T0)) as db:
        _workload(db, 65)
        for at in (T0 - 4 * SEC + SEC // 2, T0 + SEC // 2, T0 + 3 * SEC + SEC // 2):
            bad = rows_mismatch(db.aggregate_rows(at), ref.aggregate_rows(at))
            assert bad is None, (at, bad)
