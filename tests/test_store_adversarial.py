"""Adversarial review of the columnar history and ``compact()``: readers of the
history while a compaction commits under them, crashes, erasure and retention
beside merged blocks, extreme values. Every expected value comes from the
reference model (which keeps every record) or from a plain computation."""

from __future__ import annotations

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.core import states as _behaviours
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.history_compact import compact_history_ops
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0

CFG = Config(
    half_life_ns=50 * SEC,
    window_width_ns=10 * SEC,
    window_buckets=3,
    max_contribution_log_entries=6,
    rematerialize_after_ms=None,
    ledger_shards=1,
)
FLUSHED = 80  # signals, each flushed alone: one history batch each, past a read's chunk


@pytest.fixture
def settle_at_once(monkeypatch):
    """Settle every row as soon as it may be (the default waits for 16,384)."""
    monkeypatch.setattr(_behaviours, "SETTLE_MIN", 1)


@pytest.fixture
def compact_after_listing(monkeypatch):
    """The persistence actor's history compaction commits right after a reader has
    listed the history's keys (once): every batch listed is merged into one block,
    under the last key, so the first chunks the reader reads are all gone."""
    done: list[int] = []
    listing = HistoryReader.batch_keys

    def batch_keys(self: HistoryReader) -> list[bytes]:
        keys = listing(self)
        if not done:
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


def _rows(x, at):
    return [(r[0], r[1], r[2], round(r[3], 9), r[4], round(r[5], 9)) for r in x.aggregate_rows(at)]


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
            assert _rows(db, at) == _rows(ref, at), at
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
            got = [r for r in _rows(db, at) if r[0] in ("c", COMMUNITY)]
            want = [r for r in _rows(never, at) if r[0] in ("c", COMMUNITY)]
            assert got == want, at
    assert compact_after_listing and compact_after_listing[0] >= FLUSHED
