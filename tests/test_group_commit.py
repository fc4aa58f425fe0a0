"""Control writes waiting together share one transaction, and each is answered only
after that commit; same-user writes never share one. Driven by the seeded harness
and checked against the reference model; and end to end with 16 threads. The
message-by-message cases are in test_group_commit_pipeline.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tidal_actors import Config, ManualClock, MembershipStatus, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.testing import Harness, ReferenceModel

from .conftest import T0


def _persist(h: Harness):  # type: ignore[no-untyped-def]
    return h.host.behaviours[M.PERSIST_ADDR]


@pytest.mark.parametrize("ordering", ["mailbox", "pair"])
@pytest.mark.parametrize("seed", range(10))
def test_writes_on_other_users_go_on_while_one_commits(seed: int, ordering: str) -> None:
    h = Harness(seed=seed, config=Config(ledger_shards=2, membership_shards=1), ordering=ordering)  # type: ignore[arg-type]
    model = ReferenceModel(h.config, h.clock)
    shard = h.host.behaviours[(M.MEMBERSHIP, 0)]
    first = h.assign_cohort(0, "a")
    # once the first write is on its way to persistence, a control write on another
    # user is handled at once (its write sent on), one on the same user waits
    while not shard.in_doubt():  # the write is on its way
        assert h.step()
    ops = [h.assign_cohort(u, "a") for u in range(1, 6)] + [h.leave_community_layer(7)]
    ops.append(h.assign_cohort(3, "b"))  # user 3 again: waits for its first write
    commits_before = _persist(h).commits
    h.run(first)
    assert _persist(h).commits >= commits_before + 1
    h.run_until_idle()
    # 8 writes; writes waiting together share a commit (with one mailbox per receiver
    # and pair order alike: a seeded schedule may still deliver them one at a time)
    assert _persist(h).commits <= commits_before + 8
    assert all(op.done and op.result() is None for op in ops)
    for u in range(6):
        model.assign_cohort(u, "a")
    model.leave_community_layer(7)
    model.assign_cohort(3, "b")
    for u in range(8):
        assert h.run(h.cohorts_of(u)) == model.cohorts_of(u)
        assert h.run(h.community_layer_status(u)) == model.community_layer_status(u)
    assert h.run(h.community_layer_status(7)).status is MembershipStatus.Left


def test_sixteen_threads_of_assigns_persist_exactly(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    per, callers = 40, 16
    with TidalDb.open(
        path, config=Config(rematerialize_after_ms=None), clock=ManualClock(T0)
    ) as db:

        def work(k: int) -> None:
            for i in range(per):
                db.assign_cohort(k * per + i, f"c{i % 3}")
                db.assign_cohort(k * per + i, f"d{k % 2}")

        threads = [threading.Thread(target=work, args=(k,)) for k in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        commits = db.stats()["commits"]
    # 1,280 writes; with 16 callers they share commits (at most one each otherwise)
    assert commits < 2 * per * callers
    with TidalDb.open(path, clock=ManualClock(T0)) as again:
        for k in range(callers):
            for i in range(per):
                assert again.cohorts_of(k * per + i) == frozenset({f"c{i % 3}", f"d{k % 2}"})


class _Recording:
    """Wraps a store: the keyspaces of each transaction committed, in order."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store = store
        self.transactions: list[set[str]] = []

    def commit(self, ops):  # type: ignore[no-untyped-def]
        ops = list(ops)
        self.transactions.append({op[0] for op in ops})
        return self.store.commit(ops)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.store, name)


@pytest.mark.parametrize("seed", range(12))
def test_a_control_write_commits_ahead_of_the_history_writes_queued_with_it(seed: int) -> None:
    """Persistence commits a membership shard's control write on its own, not in the
    transaction of the history batches queued around it (``Write.ahead``); the state
    is the model's all the same."""
    from tidal_actors.storage.stores import MemoryStore

    cfg = Config(ledger_shards=2, membership_shards=2)
    h = Harness(seed=seed, config=cfg, store=MemoryStore())
    model = ReferenceModel(cfg, h.clock)
    persistence = _persist(h)
    recording = _Recording(persistence.store)
    persistence.store = recording
    for u in range(8):
        h.run(h.assign_cohort(u, "a"))
        model.assign_cohort(u, "a")
    h.run_until_idle()
    recording.transactions.clear()
    calls = []
    for u in range(8):  # signals, and leaves among them: history and control writes together
        h.signal_with_context(u, 1, 0, 1.0 + u)
        model.signal_with_context(u, 1, 0, 1.0 + u)
        if u % 3 == 0:
            calls.append(h.leave_community_layer(u))
            model.leave_community_layer(u)
    h.run_until_idle()
    for call in calls:
        h.run(call)
    mixed = [t for t in recording.transactions if "users" in t and "history" in t]
    assert not mixed, recording.transactions
    assert sum("users" in t for t in recording.transactions) >= 1
    assert sorted(h.run(h.aggregate_rows())) == sorted(model.aggregate_rows())
    for u in range(8):
        assert h.run(h.community_layer_status(u)) == model.community_layer_status(u)


@pytest.mark.parametrize("seed", range(5))
def test_an_ephemeral_control_write_is_answered_by_its_shard_alone(seed: int) -> None:
    """With no store there is nothing to commit: assign, leave and rejoin are applied
    and answered by the membership shard in the one delivery of their message, with
    nothing sent to persistence, and with the effects the reference model gives."""
    h = Harness(seed=seed, config=Config(ledger_shards=2, membership_shards=1), store="null")
    model = ReferenceModel(h.config, h.clock)
    for call, ref in (
        (h.assign_cohort(4, "a"), lambda: model.assign_cohort(4, "a")),
        (h.leave_community_layer(4), lambda: model.leave_community_layer(4)),
        (h.rejoin_community_layer(4), lambda: model.rejoin_community_layer(4)),
        (h.leave_community_layer(5), lambda: model.leave_community_layer(5)),
    ):
        assert h.step()  # the one delivery: the membership shard's
        assert call.done and call.result() is None
        ref()
        assert not h.pending_messages().get(M.PERSIST_ADDR)
    for u in (4, 5):
        assert h.run(h.community_layer_status(u)) == model.community_layer_status(u)
        assert h.run(h.community_leave_history(u)) == model.community_leave_history(u)
    assert h.run(h.cohorts_of(4)) == model.cohorts_of(4) == frozenset({"a"})


def test_an_ephemeral_database_counts_only_its_purges_commits() -> None:
    """``stats()["commits"]`` with no store: control writes and the signals' history
    skip persistence (nothing to commit), so they count none; each purge's records
    (manifest, tombstones, status) go through it, one commit for a purge awaited
    alone. The counts are those of the operations run here."""
    with TidalDb.open(None, config=Config(), clock=ManualClock(T0)) as db:
        for u in range(4):
            db.assign_cohort(u, "c")
            db.signal_with_context(u, 3, 10 + u, 1.0, T0)
        db.leave_community_layer(1)
        db.rejoin_community_layer(1)
        db.unassign_cohort(2, "c")
        db.flush()
        db.rematerialize("c")
        assert db.stats()["commits"] == 0
        for n, u in enumerate((0, 3), start=1):
            db.request_community_purge(u, "c")
            db.flush()
            assert db.stats()["commits"] == n
