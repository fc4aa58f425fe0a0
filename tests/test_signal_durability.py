"""What a signal call accepted is what is stored, and a loss is never silent.

Before the fix a signal context was checked at the call but encoded only when the
ledger wrote its history batch: a context the caller mutated after the call, or one
nested near msgpack's depth limit, failed there, the whole batch (other users'
context-free signals too) was dropped from the durable history, and ``flush()``
returned normally.
"""

from __future__ import annotations

import re

import msgpack
import pytest

from tidal_actors import Config, InvalidArgument, ManualClock, StorageError, TidalDb
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.storage.format import ledger_shard_of
from tidal_actors.storage.stores import decode_batch

from ._setups import refuse_history_writes

T0 = 10**18


def _reopened_counts(path: str, users: list[int]) -> dict[int, int]:
    """Counts per user's cohort after a reopen that replays the durable history (a
    different half-life makes the clean-close snapshot unusable)."""
    cfg = Config(half_life_ns=3_600 * 10**9 + 1, rematerialize_after_ms=None)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        return {u: db.read_window(f"c{u}", 7, 1).count for u in users}


def _stored_contexts(path: str) -> list[object]:
    from tidal_actors.storage.stores import LmdbStore

    store = LmdbStore(path, Config(), read_only=True)
    try:
        out: list[object] = []
        for key, raw in store.history_items():
            b = decode_batch(0, 0, raw, key)
            out.extend((b.contexts or {}).values())
        return out
    finally:
        store.close()


def test_context_mutated_after_the_call_is_stored_as_accepted(tmp_path):
    path = str(tmp_path / "s")
    with TidalDb.open(
        path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:
        for u in (1, 2, 3):
            db.assign_cohort(u, f"c{u}")
        ctx = {"page": "home"}
        db.signal_with_context(1, 7, 1, 1.0, context=ctx)
        ctx["later"] = object()  # msgpack cannot encode this: the call already packed it
        ctx["page"] = "changed"
        for _ in range(5):
            db.signal_with_context(2, 7, 1, 1.0)
            db.signal_with_context(3, 7, 1, 1.0)
        db.flush()
        assert db.stats()["handler_errors"] == 0
    assert _reopened_counts(path, [1, 2, 3]) == {1: 1, 2: 5, 3: 5}
    # one record per cohort the user is in (c1, @community), each with the context
    assert _stored_contexts(path) == [msgpack.packb({"page": "home"})] * 2


def _nested(depth: int) -> dict[str, object]:
    d: dict[str, object] = {}
    for _ in range(depth):
        d = {"k": d}
    return d


def test_deep_context_is_refused_or_stored_whole(tmp_path):
    path = str(tmp_path / "s")
    limit = 1024  # the deepest mapping msgpack.packb encodes (measured: 1,025 raises)
    with TidalDb.open(
        path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:
        db.assign_cohort(1, "c1")
        db.assign_cohort(2, "c2")
        with pytest.raises(InvalidArgument) as info:
            db.signal_with_context(1, 7, 1, 1.0, context=_nested(limit + 1))
        assert info.value.field == "context"
        # just inside the limit at the call: once nested in a history batch's payload
        # it used to pass the limit and cost the whole batch
        db.signal_with_context(1, 7, 1, 1.0, context=_nested(limit))
        db.signal_with_context(2, 7, 1, 1.0)
        db.flush()
    assert _reopened_counts(path, [1, 2]) == {1: 1, 2: 1}
    assert _stored_contexts(path) == [msgpack.packb(_nested(limit))] * 2


@pytest.mark.parametrize("durable", [True, False])
def test_a_lost_signal_batch_is_reported_by_the_next_flush(tmp_path, monkeypatch, durable):
    real = LedgerShard._on_attribute
    calls = {"n": 0}

    def failing_once(self, msg):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected ledger failure")
        return real(self, msg)

    monkeypatch.setattr(LedgerShard, "_on_attribute", failing_once)
    path = str(tmp_path / "s") if durable else None
    with TidalDb.open(
        path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:
        db.assign_cohort(1, "c1")
        db.signal_with_context(1, 7, 1, 1.0)
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.flush()
        db.signal_with_context(1, 7, 1, 1.0)
        db.flush()  # reported once: what came after is durable
        assert db.read_window("c1", 7, 1).count == 1


def _fail_attribute(monkeypatch, nth: int = 1) -> None:
    real = LedgerShard._on_attribute
    calls = {"n": 0}

    def failing_once(self, msg):
        calls["n"] += 1
        if calls["n"] == nth:
            raise RuntimeError("injected ledger failure")
        return real(self, msg)

    monkeypatch.setattr(LedgerShard, "_on_attribute", failing_once)


def test_only_flush_reports_a_loss_not_rematerialize_or_compact(tmp_path, monkeypatch):
    _fail_attribute(monkeypatch, nth=2)
    cfg = Config(ledger_shards=1, rematerialize_after_ms=None)
    with TidalDb.open(str(tmp_path / "s"), config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c1")
        db.signal_with_context(1, 7, 1, 1.0)
        db.flush()
        db.signal_with_context(1, 7, 1, 1.0)  # lost
        db.rematerialize("c1")  # its sync barrier passes the loss on, untaken
        db.compact()
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.flush()


def test_close_raises_a_loss_no_flush_reported(tmp_path, monkeypatch):
    _fail_attribute(monkeypatch)
    path = str(tmp_path / "s")
    db = TidalDb.open(path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0))
    db.assign_cohort(1, "c1")
    db.signal_with_context(1, 7, 1, 1.0)
    db.signal_with_context(1, 8, 1, 1.0)
    with pytest.raises(StorageError, match="lost 1 signal batch"):
        db.close()
    assert db.closed
    with TidalDb.open(path, clock=ManualClock(T0)) as again:  # closed for good: reopens
        assert again.cohorts_of(1) == frozenset({"c1"})


def test_losses_on_two_ledger_shards_are_both_reported(monkeypatch):
    real = LedgerShard._on_attribute
    failed: set[int] = set()

    def failing_once_per_shard(self, msg):
        if self.index not in failed:
            failed.add(self.index)
            raise RuntimeError(f"injected failure on ledger {self.index}")
        return real(self, msg)

    monkeypatch.setattr(LedgerShard, "_on_attribute", failing_once_per_shard)
    with TidalDb.open(
        config=Config(ledger_shards=2, rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:
        db.signal_with_context(1, 7, 1, 1.0)  # @community: one shard
        cohort = next(
            c
            for c in (f"c{i}" for i in range(50))
            if ledger_shard_of(c, 2) != ledger_shard_of("@community", 2)
        )
        db.assign_cohort(2, cohort)
        db.signal_with_context(2, 7, 1, 1.0)
        with pytest.raises(StorageError) as info:
            db.flush()
        # each shard reports its loss: the other shard's first attribution (signal 1's
        # alone, or signal 1's and 2's when its mailbox merged the two queued back to
        # back: a merged message is one failure that loses both batches)
        lost = re.findall(r"ledger\[(\d)\] lost (\d) signal batch", str(info.value))
        assert sorted(int(shard) for shard, _ in lost) == [0, 1]
        by_shard = {int(shard): int(n) for shard, n in lost}
        community = ledger_shard_of("@community", 2)
        assert by_shard[1 - community] == 1
        assert by_shard[community] in (1, 2)


def test_a_failed_history_write_waits_for_the_flush_past_a_rebuild_and_a_compaction(tmp_path):
    with TidalDb.open(
        str(tmp_path / "s"), config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:
        db.assign_cohort(1, "c1")
        db.signal_with_context(1, 7, 1, 1.0)
        db.flush()
        store = db._core.store
        store.fault = refuse_history_writes
        db.signal_with_context(1, 7, 1, 1.0)
        db.rematerialize("c1")  # its sync commits first, and passes the failure on
        store.fault = None
        db.compact()
        with pytest.raises(StorageError, match="1 history write"):
            db.flush()
        db.flush()


def test_a_cancelled_trio_flush_hands_its_loss_to_the_next_flush(monkeypatch):
    import trio

    from tidal_actors import open_tidal

    _fail_attribute(monkeypatch)

    async def main() -> None:
        async with open_tidal(
            None, config=Config(ledger_shards=1, rematerialize_after_ms=None), clock=ManualClock(T0)
        ) as db:
            await db.assign_cohort(1, "c1")
            await db.signal_with_context(1, 7, 1, 1.0)  # lost
            with trio.move_on_after(0):
                await db.flush()  # sent, its answer abandoned
            await trio.sleep(0.2)
            with pytest.raises(StorageError, match="lost 1 signal batch"):
                await db.flush()
            await db.flush()

    trio.run(main)


def test_close_waits_for_a_final_flush_slower_than_its_step_wait(tmp_path, monkeypatch):
    """A final flush that outlasts close()'s wait for it is looked at again once the
    actors have stopped (their mailboxes drained): it finished, so close() returns
    and the signal is durable. (One that still had not finished would make close()
    raise StorageError "did not finish within ..."; that needs a stall longer than
    stopping the actors allows, 30 s, too long for a test.)"""
    import time

    from tidal_actors.runtime import engine as _core
    from tidal_actors.storage.lmdb_env import LmdbStore

    monkeypatch.setattr(_core, "CLOSE_WAIT_S", 0.3)
    real_commit = LmdbStore.commit
    stalled = {"n": 0}

    def slow_commit(self, ops):
        ops = list(ops)
        if any(ks == "history" for ks, _, _ in ops) and not stalled["n"]:
            stalled["n"] += 1
            time.sleep(1.5)  # a slow disk: longer than close() waits for its flush
        return real_commit(self, ops)

    monkeypatch.setattr(LmdbStore, "commit", slow_commit)
    path = str(tmp_path / "s")
    db = TidalDb.open(path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0))
    db.assign_cohort(1, "c1")
    db.signal_with_context(1, 7, 1, 1.0)
    db.close()
    assert stalled["n"] == 1
    monkeypatch.setattr(LmdbStore, "commit", real_commit)
    with TidalDb.open(
        path, config=Config(half_life_ns=3_600 * 10**9 + 1), clock=ManualClock(T0)
    ) as again:
        assert again.read_window("c1", 7, 1).count == 1  # from the history, not a snapshot
