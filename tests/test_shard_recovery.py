"""Shards that recover by themselves: a failed shard restarts from the store.

Under the pykka host a handler that raises unexpectedly in a durable database
restarts its membership or ledger shard from the store (`runtime.supervision`), and
the deterministic harness's ``crash_shard`` restarts a crashed one; both go through
the same restore step (``LedgerShard.restarted``, ``MembershipShard.restarted``), which
the tests below watch. What was lost is in a ``FaultReport``; the state afterwards
equals the reference model's over what was acknowledged, live and after a reopen.
The coordinator and persistence do not restart: a failure there is answered, the
actor resumes, and the report says so (``action == "resumed"``); the harness refuses
to crash them as shards.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tidal_actors import (
    COMMUNITY,
    ActorFailure,
    Config,
    InvalidArgument,
    ManualClock,
    StorageError,
    TidalDb,
)
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.core.contrib_log import ContributionLog
from tidal_actors.core.routes import RouteTable
from tidal_actors.testing import Harness, ReferenceModel

from ._differential import (
    Recorder,
    assert_matches,
    assert_matches_and_reopened,
    crashed,
    model_without_lost,
)
from ._setups import CFG1, fail_next, in_thread, one_red_signal, red_score
from .conftest import SEC, T0

# one ledger shard: a signal's records travel in one message, so a loss is whole
CFG = Config(membership_shards=2, ledger_shards=1, rematerialize_after_ms=None)
USERS = range(1, 7)


def _spy_restarts(monkeypatch: pytest.MonkeyPatch) -> list[M.Address]:
    """Record each call of the shards' restore step (the product code both hosts use)."""
    calls: list[M.Address] = []
    for cls in (LedgerShard, MembershipShard):
        real = cls.restarted.__func__  # type: ignore[attr-defined]

        def spy(klass: type, ctx: Any, index: int, *args: Any, _real: Any = real) -> Any:
            shard = _real(klass, ctx, index, *args)
            calls.append(shard.address)
            return shard

        monkeypatch.setattr(cls, "restarted", classmethod(spy))
    return calls


class _Both:
    """Applies each operation to the database and to the reference model."""

    def __init__(self, db: TidalDb, model: ReferenceModel) -> None:
        self.db, self.model = db, model

    def __getattr__(self, name: str) -> Callable[..., None]:
        def call(*args: Any) -> None:
            getattr(self.db, name)(*args)
            getattr(self.model, name)(*args)

        return call


def _first_phase(both: _Both) -> None:
    for u, c in ((1, "red"), (2, "blue"), (3, "red"), (4, "blue")):
        both.assign_cohort(u, c)
    for i in range(24):
        both.signal_with_context(1 + i % 6, i % 3, i % 2, 1.0 + i, T0 - (i + 1) * SEC)
    both.leave_community_layer(5)


def _open(path: str, clock: ManualClock) -> TidalDb:
    return TidalDb.open(path, config=CFG, clock=clock)


def _signals(db: TidalDb | _Both, start: int) -> list[tuple[int, int, int, float, int]]:
    """Send 12 signals, numbered from ``start``, to ``db`` (a database, or `_Both`)."""
    out = [
        (1 + i % 6, i % 3, i % 2, 0.5 + i, T0 - (100 + i) * SEC) for i in range(start, start + 12)
    ]
    for s in out:
        db.signal_with_context(*s)
    return out


def _apply_kept(model: ReferenceModel, sent: list[tuple[Any, ...]], lost: set[Any]) -> None:
    """Give ``model`` the ``sent`` signals but those ``lost`` (by (user, ts))."""
    for s in sent:
        if (s[0], s[4]) not in lost:
            model.signal_with_context(*s)


@contextlib.contextmanager
def _checked_run(tmp_path: Any) -> Iterator[tuple[TidalDb, ReferenceModel]]:
    """A database on a store at ``tmp_path/db`` and the reference model, on one
    clock at T0, both through `_first_phase`. When the block ends without an error,
    the database answers every read as the model does, live and after a reopen
    (what it serves is what the store holds)."""
    clock = ManualClock(T0)
    path = str(tmp_path / "db")
    model = ReferenceModel(CFG, clock)
    with _open(path, clock) as db:
        _first_phase(_Both(db, model))
        yield db, model
        assert_matches(db, model, USERS, exact_ids=False, where="live: ")
    with _open(path, clock) as db:
        assert_matches(db, model, USERS, exact_ids=False, where="reopened: ")


def _only_report(db: TidalDb) -> FaultReport:
    reports = db._core.fault_reports()
    assert len(reports) == 1, reports
    return reports[0]


# -- the pykka host -------------------------------------------------------------------


def test_a_ledger_handler_failure_restarts_the_shard_from_the_store(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    restarts = _spy_restarts(monkeypatch)
    with _checked_run(tmp_path) as (db, model):
        db.flush()
        # the aggregates take the batch, then the log fails: a half-updated shard
        raised = fail_next(ContributionLog, "append_columns", monkeypatch)
        sent = _signals(db, 0)
        with caplog.at_level(logging.ERROR, "tidal_actors"), pytest.raises(StorageError) as info:
            db.flush()  # the batch it failed on is lost, and said so
        assert raised and "lost 1 signal batch" in str(info.value)
        report = _only_report(db)
        assert report.address == (M.LEDGER, 0) and report.action == "restarted"
        assert "injected fault" in report.cause and "ledger[0] failed" in caplog.text
        lost = {(rec.user, rec.ts) for rec in report.lost_records}
        assert lost and lost <= {(s[0], s[4]) for s in sent}
        assert restarts == [(M.LEDGER, 0)]
        _apply_kept(model, sent, lost)
        # the restarted shard serves on: more signals, a purge, reads
        both = _Both(db, model)
        both.request_community_purge(1, "red")
        _signals(both, 50)
        both.flush()
        assert db.stats()["handler_errors"] == 1


def test_a_membership_failure_after_the_commit_restarts_with_the_committed_state(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    restarts = _spy_restarts(monkeypatch)
    with _checked_run(tmp_path) as (db, model):
        # the write commits, applying it fails: resumed, the shard would not hold
        # what the store holds; restarted, it does
        fail_next(MembershipShard, "_set_cohorts", monkeypatch)
        with pytest.raises(ActorFailure):
            db.assign_cohort(6, "red")
        model.assign_cohort(6, "red")
        # the caller is answered first; the next call to the shard comes after its restart
        assert db.cohorts_of(6) == frozenset({"red"})
        report = _only_report(db)
        address = report.address
        assert address[0] == M.MEMBERSHIP and report.action == "restarted"
        assert restarts == [address]
        both = _Both(db, model)
        both.leave_community_layer(6)
        _signals(both, 0)
        db.flush()


def test_a_membership_failure_on_signals_loses_that_batch_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _checked_run(tmp_path) as (db, model):
        db.flush()
        fail_next(RouteTable, "expand_few", monkeypatch)  # 12 signals: laid out in Python
        sent = _signals(db, 0)
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.flush()
        report = _only_report(db)
        assert report.action == "restarted" and report.lost_signals
        _apply_kept(model, sent, {(s[0], s[4]) for s in report.lost_signals})
        both = _Both(db, model)
        _signals(both, 40)  # record numbers go on where the store left them
        both.request_community_purge(2, COMMUNITY)


def test_an_ephemeral_database_resumes_the_shard_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with TidalDb.open(config=CFG, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "red")
        fail_next(MembershipShard, "_set_cohorts", monkeypatch)
        with pytest.raises(ActorFailure):
            db.assign_cohort(2, "red")
        assert db.cohorts_of(1) == frozenset({"red"})
        report = _only_report(db)
        assert report.action == "resumed"  # nothing durable to restart from


def test_the_coordinator_cannot_restart_it_resumes_and_reports(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidal_actors.actors import coordinator

    fail_next(coordinator, "encode_manifest", monkeypatch)
    with _open(str(tmp_path / "db"), ManualClock(T0)) as db:
        db.assign_cohort(1, "red")
        db.signal_with_context(1, 1, 1, 1.0, T0 - SEC)
        with pytest.raises(ActorFailure):
            db.request_community_purge(1, "red")
        _pid, manifest = db.request_community_purge(1, "red")  # later purges run
        assert len(manifest.entries) == 1
        report = _only_report(db)
        assert report.address == M.COORD_ADDR and report.action == "resumed"


# -- the harness --------------------------------------------------------------------


def _harness_workload(r: Recorder) -> None:
    t0 = r.h.clock.now_ns()
    for u, c in ((1, "red"), (2, "blue"), (3, "red"), (4, "blue")):
        r.assign_cohort(u, c)
    for i in range(10):
        r.signal_with_context(1 + i % 5, i % 3, i % 2, 1.0 + i, t0 - (i + 1) * SEC)
    r.request_community_purge(1, "red")
    r.leave_community_layer(2)
    for i in range(10, 20):
        r.signal_with_context(1 + i % 5, i % 3, i % 2, 1.0 + i, t0 - (i + 1) * SEC)


@pytest.mark.parametrize("address", [(M.LEDGER, 0), (M.MEMBERSHIP, 0), (M.MEMBERSHIP, 1)])
@pytest.mark.parametrize("crash_at", [4, 15, 30])
def test_the_harness_crash_restarts_through_the_same_step(
    address: M.Address, crash_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    restarts = _spy_restarts(monkeypatch)
    for seed in range(4):
        restarts.clear()
        h, r, report = crashed(seed, CFG, _harness_workload, address, crash_at)
        assert restarts == [address]
        model = model_without_lost(r, CFG, report)
        assert_matches_and_reopened(h, model, USERS, f"seed {seed}, {address} at {crash_at}")


def test_the_harness_cannot_crash_the_coordinator_or_persistence_as_a_shard() -> None:
    h = Harness(seed=0, config=CFG)
    for address in (M.COORD_ADDR, M.PERSIST_ADDR):
        with pytest.raises(InvalidArgument, match="membership or ledger"):
            h.crash_shard(address)


# -- review fixes ---------------------------------------------------------------------


def test_a_purge_whose_marker_reached_the_ledger_before_its_restart_completes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The membership shard tells the ledgers its marker, then the coordinator the
    purge; a ledger restarting between the two took the marker, and the coordinator
    cannot list the purge yet: the new incarnation takes the marker over from the
    old one, so the preparation does not wait for it forever."""
    import threading
    import time

    from tidal_actors.storage.format import membership_shard_of

    u1 = 1
    u2 = next(u for u in range(2, 100) if membership_shard_of(u, 2) != membership_shard_of(u1, 2))
    at_marker = threading.Event()

    def slow_on_purge(self: MembershipShard, msg: M.PurgeRequest) -> None:
        # as the product's, the thread preempted between its tells
        self._token += 1
        marker = (self.index, self._token)
        bound = self.state.next_rseq
        for li in range(self.ctx.config.ledger_shards):
            self.ctx.tell(
                (M.LEDGER, li), M.PurgeMarker(marker, self.index, msg.user, msg.cohort, bound)
            )
        at_marker.set()
        time.sleep(0.3)
        self.ctx.tell(
            M.COORD_ADDR,
            M.Purge(msg.user, msg.cohort, self.index, bound, msg.now_ns, msg.reply, marker),
        )

    monkeypatch.setattr(MembershipShard, "_on_purge", slow_on_purge)
    clock = ManualClock(T0)
    db = _open(str(tmp_path / "db"), clock)
    try:
        one_red_signal(db, T0)  # u1's
        t, out = in_thread(lambda: db.request_community_purge(u1, "red"))
        assert at_marker.wait(10)
        raised = fail_next(ContributionLog, "append_columns", monkeypatch)
        db.signal_with_context(u2, 8, 1, 1.0, T0 - 1)  # another user's batch fails
        t.join(10)
        assert not t.is_alive(), "the purge hangs"
        assert raised
        _, manifest = out["r"]
        assert [(e.user_id, e.weight) for e in manifest.entries] == [(u1, 2.0)]
        assert db.read_decay_score("red", 7, 1, T0) == 0.0
        assert _only_report(db).action == "restarted"
    finally:
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.close()


@pytest.mark.parametrize("load_failures", [1, 100])
def test_a_failed_restart_is_tried_again_or_fences_the_shard(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, load_failures: int
) -> None:
    """A shard whose restart fails is never resumed half-updated: a transient store
    error is tried again; a lasting one fences the shard (every message to it fails,
    no snapshot at close), and the reopened database serves what the store holds."""
    path = str(tmp_path / "db")
    clock = ManualClock(T0)
    db = TidalDb.open(path, config=CFG1, clock=clock)
    one_red_signal(db, T0)
    before = db.read_decay_score("red", 7, 1, T0)
    assert before > 0
    raised = fail_next(ContributionLog, "append_columns", monkeypatch)
    loads = fail_next(
        db._core.store,
        "load",
        monkeypatch,
        times=load_failures,
        message="injected fault in store.load",
    )  # the restart's read
    db.signal_with_context(1, 7, 1, 5.0, T0 - 1)  # the aggregates take it, the log fails
    with pytest.raises((StorageError, ActorFailure)):
        db.flush()
    assert raised and loads
    report = next(r for r in db._core.fault_reports() if r.address == (M.LEDGER, 0))
    if load_failures == 1:
        assert report.action == "restarted" and "store.load" in report.cause
        assert db.read_decay_score("red", 7, 1, T0) == before  # the lost signal is gone
        db.close()
    else:
        assert report.action == "fenced"
        with pytest.raises(ActorFailure, match="fenced"):
            db.read_decay_score("red", 7, 1, T0)
        db.signal_with_context(1, 7, 1, 1.0, T0 - 1)
        with pytest.raises((StorageError, ActorFailure), match="fenced"):
            db.flush()
        with pytest.raises((StorageError, ActorFailure)):
            db.close()
        monkeypatch.undo()
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        assert db.read_decay_score("red", 7, 1, T0) == before
        db.request_community_purge(1, "red")
        assert db.read_decay_score("red", 7, 1, T0) == 0.0
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        assert db.read_decay_score("red", 7, 1, T0) == 0.0


def test_a_rebuild_that_failed_with_its_ledger_is_queued_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild step fails (the ledger restarts and the rebuild ends with an error):
    the purge's re-materialization is scheduled again, so it completes and the
    purged user's evicted records leave the aggregates."""
    import time

    from tidal_actors.storage.rematerialize import RematJob

    raised = fail_next(RematJob, "step", monkeypatch)
    cfg = Config(
        membership_shards=1,
        ledger_shards=1,
        max_contribution_log_entries=10,
        rematerialize_after_ms=50,
    )
    with TidalDb.open(str(tmp_path / "db"), clock=ManualClock(T0), config=cfg) as db:
        db.assign_cohort(1, "red")
        for i in range(5):
            db.signal_with_context(1, 7, 1, 1.0, T0 - 100 + i)
        for i in range(20):
            db.signal_with_context(2, 8, 1, 1.0, T0 - 50 + i)
        db.flush()
        pid, manifest = db.request_community_purge(1, COMMUNITY)
        assert (len(manifest.entries), manifest.evicted) == (0, 5)  # all evicted
        deadline = time.monotonic() + 30
        while not db.purge_status(pid).rematerialized and time.monotonic() < deadline:
            time.sleep(0.02)
        assert raised
        assert db.purge_status(pid).rematerialized
        assert db.read_decay_score(COMMUNITY, 7, 1, T0) == 0.0
        assert db.read_decay_score(COMMUNITY, 8, 1, T0) == pytest.approx(20.0, rel=1e-6)


def test_a_crash_failing_the_first_step_of_a_two_step_call_ends_it() -> None:
    """A rebuild's barrier fails with the crashed membership shard, so its second
    message is never sent: the handle is done with the barrier's error."""
    h = Harness(seed=0, config=CFG)
    t0 = h.clock.now_ns()
    h.assign_cohort(1, "red")
    h.signal_with_context(1, 1, 1, 1.0, t0 - SEC)
    h.request_community_purge(1, "red")
    rm = h.rematerialize("red")
    report = h.crash_shard((M.MEMBERSHIP, 0))
    h.run_until_idle()
    assert report.failed == ["rematerialize#3.0"]
    assert rm.done
    with pytest.raises(ActorFailure, match="crashed"):
        rm.result()


def test_the_blocking_facade_stops_waiting_when_a_first_reply_fails() -> None:
    """The blocking facade waits for a call, not for each reply in turn."""
    import threading

    from tidal_actors.actors.reply import Reply
    from tidal_actors.facades.blocking_base import BlockingBase
    from tidal_actors.runtime.call import Call

    class _Core:
        def track(self, reply: Reply) -> None:
            pass

        def untrack(self, reply: Reply) -> None:
            pass

    first, second = Reply("sync"), Reply("action")  # the second is never settled
    call: Call[int] = Call("two-step", [first, second], lambda v: v[1])
    timer = threading.Timer(0.05, first.set_exception, (ActorFailure("barrier failed"),))
    timer.start()
    t, out = in_thread(lambda: BlockingBase(_Core())._run(call))  # type: ignore[arg-type]
    t.join(10)
    assert not t.is_alive(), "the facade waits for a reply that never comes"
    assert isinstance(out["r"], ActorFailure) and "barrier failed" in str(out["r"])


def test_an_attribution_failing_after_its_history_write_is_in_doubt_not_lost(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger sent the batch's history write, then failed: the restart reads it
    back, so the report says in doubt (not lost) and the flush reports no loss."""
    from tidal_actors.core.states import LedgerState

    path = str(tmp_path / "db")
    clock = ManualClock(T0)
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        one_red_signal(db, T0)
        raised = fail_next(LedgerState, "raise_floors", monkeypatch)  # after the write
        db.signal_with_context(1, 7, 1, 5.0, T0 - 1)
        db.flush()  # no loss to report
        assert raised
        report = _only_report(db)
        assert report.action == "restarted" and report.in_doubt
        assert not report.lost_records and not report.dropped
        expected = red_score(CFG1, T0, (5.0, T0 - 1))
        assert db.read_decay_score("red", 7, 1, T0) == pytest.approx(expected)
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        assert db.read_decay_score("red", 7, 1, T0) == pytest.approx(expected)


def test_a_signal_batch_failing_halfway_through_its_fan_out_is_in_doubt(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The membership shard failed after sending one ledger its records: the report
    says the batch is in doubt rather than listing its signals as lost."""
    from tidal_actors.storage.format import ledger_shard_of

    cfg = Config(membership_shards=1, ledger_shards=2, rematerialize_after_ms=None)
    other = next(
        c
        for c in ("red", "blue", "green", "teal", "gold")
        if ledger_shard_of(c, 2) == 1 - ledger_shard_of(COMMUNITY, 2)
    )
    sent: list[int] = []

    def tell(address: M.Address, message: object) -> None:
        if isinstance(message, M.Attribute) and sent:
            sent.clear()
            raise RuntimeError("injected fault in the fan-out")
        real_tell(address, message)
        if isinstance(message, M.Attribute) and armed:
            sent.append(1)

    armed = False
    with TidalDb.open(str(tmp_path / "db"), config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, other)
        db.flush()
        ctx = db._core.host.ctx
        real_tell = ctx.tell
        monkeypatch.setattr(ctx, "tell", tell)
        armed = True
        db.signal_with_context(1, 7, 1, 5.0, T0 - 1)
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.flush()
        armed = False
        report = _only_report(db)
        assert report.address == (M.MEMBERSHIP, 0) and report.action == "restarted"
        assert report.in_doubt and "SignalBatch" in report.in_doubt[0]
        assert not report.lost_signals


def test_a_rebuild_step_failing_during_an_attribution_keeps_the_batch(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running rebuild advances after each attribution batch; its step failing there
    ends the rebuild with the error, and the unrelated batch is applied and kept."""
    import sys

    from tidal_actors.storage.rematerialize import RematJob

    real_step = RematJob.step
    fired: list[int] = []

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if fired:
            return real_step(self, *args, **kwargs)
        if sys._getframe(2).f_code.co_name == "_on_attribute":
            fired.append(1)
            raise RuntimeError("injected fault in RematJob.step")
        return False  # not done: the rebuild waits for an attribution

    monkeypatch.setattr(RematJob, "step", step)
    path = str(tmp_path / "db")
    clock = ManualClock(T0)
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        one_red_signal(db, T0)
        t, out = in_thread(lambda: db.rematerialize("red"))
        import time

        time.sleep(0.2)
        db.signal_with_context(1, 7, 1, 5.0, T0 - 1)
        db.flush()  # the batch is not lost
        t.join(10)
        assert fired and not t.is_alive()
        assert isinstance(out["r"], ActorFailure)
        report = _only_report(db)
        assert report.in_doubt and not report.lost_records
        expected = red_score(CFG1, T0, (5.0, T0 - 1))
        assert db.read_decay_score("red", 7, 1, T0) == pytest.approx(expected)
    with TidalDb.open(path, config=CFG1, clock=clock) as db:
        assert db.read_decay_score("red", 7, 1, T0) == pytest.approx(expected)


def test_a_ledger_restart_names_the_purge_it_ended_in_its_report() -> None:
    """The coordinator ends a purge prepared at the restarting ledger: its answer
    names the purge's reply, so the FaultReport's ``failed`` lists what callers got."""
    from tidal_actors.actors.coordinator import PurgeCoordinator
    from tidal_actors.actors.recovery import LedgerRecovery, RecoverLedger
    from tidal_actors.actors.reply import Reply

    class _Ctx:
        config = CFG
        clock = ManualClock(T0)
        durable = True

        def __init__(self) -> None:
            self.sent: list[tuple[M.Address, object]] = []

        def tell(self, address: M.Address, message: object) -> None:
            self.sent.append((address, message))

    ctx = _Ctx()
    coord = PurgeCoordinator(ctx)  # type: ignore[arg-type]
    caller = Reply("purge-caller")
    coord.receive(M.Purge(1, "red", 0, 1, T0, caller, (0, 1)))
    assert any(isinstance(m, M.PreparePurge) for _, m in ctx.sent)
    answer = Reply("recover")
    coord.receive(RecoverLedger(0, answer))
    recovery = answer.get(1)
    assert isinstance(recovery, LedgerRecovery)
    assert recovery.failed == ("purge-caller",)
    with pytest.raises(ActorFailure, match="restarted during this purge"):
        caller.result()
