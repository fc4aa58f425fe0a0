"""A merged message lost at a shard is reported as every batch it carried.

The pykka host's mailbox hands a ledger shard the attributions of one membership
shard queued back to back as one message (`runtime.mailbox.coalesce`), and a
membership shard the signal batches queued back to back. When a handler fails on
such a message, the next flush's `StorageError` counts each signal batch in it, and
its records (or signals). The test's messages queue for the shards' threads
(`conftest.queued_only`): no sender handles one itself. Expected counts are worked out by hand from what the test
sends; scores come from the reference model.
"""

from __future__ import annotations

import threading

import pytest

from tidal_actors import Config, ManualClock, Signal, StorageError, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0, queued_only, until

CFG = Config(
    ledger_shards=1, membership_shards=1, inflight_budget_ms=None, rematerialize_after_ms=None
)
BATCHES, PER_BATCH = 5, 3  # sent while the shard is held: merged into one message
ROUTE = 2  # records per signal of user 1: cohort "red", then "@community"


def _held_then_failing(
    monkeypatch, shard_cls: type, handler: str
) -> tuple[threading.Event, threading.Event]:
    """Patch ``shard_cls.<handler>``: its first call sets ``entered`` and waits for
    ``release`` (so what comes next queues behind it), its second raises. Returns
    ``(entered, release)``."""
    real = getattr(shard_cls, handler)
    entered, release = threading.Event(), threading.Event()
    calls = {"n": 0}

    def patched(self, msg):
        calls["n"] += 1
        if calls["n"] == 1:
            entered.set()
            release.wait(10.0)
        elif calls["n"] == 2:
            raise RuntimeError("merged message broke")
        return real(self, msg)

    monkeypatch.setattr(shard_cls, handler, patched)
    return entered, release


def _queued_units(db: TidalDb, address: M.Address) -> int:
    """The signals or records queued at ``address`` (the pykka host's mailbox)."""
    inbox = db._core.host._inbox(address)  # type: ignore[attr-defined]
    with inbox.mutex:
        msgs = [e.message for e in inbox.queue]
    return sum(
        len(m.signals) if type(m) is M.SignalBatch else len(m)
        for m in msgs
        if type(m) in (M.SignalBatch, M.Attribute)
    )


def _send_held_batches(
    db: TidalDb, address: M.Address, held: tuple[threading.Event, threading.Event], units: int
) -> None:
    """One signal (held at the shard), then ``BATCHES`` batches queued behind it
    (``units``: their signals or records at ``address``)."""
    db.signal_batch([Signal(1, 7, 1, 2.0, T0 - SEC)])
    entered, release = held
    assert entered.wait(10.0)  # the shard holds the first: the rest queue
    for b in range(BATCHES):
        db.signal_batch([Signal(1, 100 + b, 1, 1.0, T0 - SEC) for _ in range(PER_BATCH)])
    assert until(lambda: _queued_units(db, address) == units)
    release.set()


def _expected_scores(db: TidalDb) -> None:
    """Only the first signal was applied: the scores the reference model gives."""
    model = ReferenceModel(CFG, ManualClock(T0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
    for entity in (7, 100, 100 + BATCHES - 1):
        want = model.read_decay_score("red", entity, 1, T0)
        assert db.read_decay_score("red", entity, 1, T0) == want


def test_a_merged_attribution_lost_at_a_ledger_counts_every_batch(monkeypatch) -> None:
    held = _held_then_failing(monkeypatch, LedgerShard, "_on_attribute")
    with queued_only(TidalDb.open(None, config=CFG, clock=ManualClock(T0))) as db:
        db.assign_cohort(1, "red")
        records = BATCHES * PER_BATCH * ROUTE
        _send_held_batches(db, (M.LEDGER, 0), held, records)
        with pytest.raises(StorageError) as info:
            db.flush()
        assert f"lost {BATCHES} signal batch(es) ({records} records)" in str(info.value)
        _expected_scores(db)


def test_a_merged_signal_batch_lost_at_a_membership_shard_counts_every_batch(
    monkeypatch,
) -> None:
    held = _held_then_failing(monkeypatch, MembershipShard, "_on_signals")
    with queued_only(TidalDb.open(None, config=CFG, clock=ManualClock(T0))) as db:
        db.assign_cohort(1, "red")
        signals = BATCHES * PER_BATCH
        _send_held_batches(db, (M.MEMBERSHIP, 0), held, signals)
        with pytest.raises(StorageError) as info:
            db.flush()
        assert f"lost {BATCHES} signal batch(es) ({signals} signals)" in str(info.value)
        _expected_scores(db)
