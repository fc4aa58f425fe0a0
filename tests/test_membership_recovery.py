"""What a shard or the coordinator restarted with its memory gone (the Ray host's
restart in place, `runtime.ray_membership_restart`, `runtime.ray_coordinator_restart`)
asks of the others, driven by hand in process: a membership shard's purges not
committed end with an error that says so, one committing completes first, and the
markers of its failed incarnation that the ledgers still hold are dropped
(`RecoverMembership`, `ForgetMarkers`); the facade fails the calls in flight
(`InFlight`); a restarted coordinator applies a committed purge from the ledger's
own preparation, once (`CoordinatorLost`)."""

from __future__ import annotations

from tidal_actors.actors import messages as M
from tidal_actors.actors.coordinator import PurgeCoordinator
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.recovery import (
    CoordinatorLost,
    ForgetMarkers,
    RecoverLedger,
    RecoverMembership,
)
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import EMPTY, LogRecord
from tidal_actors.runtime.ray_in_flight import InFlight

from ._setups import RecordingContext
from .conftest import T0

BELOW = 7 << 40  # the restarted incarnation's first marker number


def _purge(user: int, n: int, reply: Reply) -> M.Purge:
    return M.Purge(user, "c", 0, 10 + n, T0, reply, (0, n))


def test_the_purges_not_committed_fail_and_every_ledger_forgets_their_markers() -> None:
    ctx = RecordingContext()
    coord = PurgeCoordinator(ctx)
    first, second = Reply("p1"), Reply("p2")
    coord.receive(_purge(1, 1, first))  # prepared at the ledger: in progress
    coord.receive(_purge(2, 2, second))  # waits for the first
    assert [type(m) for _, m in ctx.sent] == [M.PreparePurge]
    ctx.sent.clear()
    done = Reply("recover")
    coord.receive(RecoverMembership(0, BELOW, done))
    assert done.done and done.result() is None
    for r in (first, second):
        assert r.done and "nothing of it was committed" in str(r.error)
    kinds = [(a, type(m).__name__) for a, m in ctx.sent]
    # both abandoned at the ledger, then the markers forgotten, on the same link
    assert kinds == [
        ((M.LEDGER, 0), "PurgeAbandoned"),
        ((M.LEDGER, 0), "PurgeAbandoned"),
        ((M.LEDGER, 0), "ForgetMarkers"),
    ]
    assert sorted(m.marker for _, m in ctx.sent[:2]) == [(0, 1), (0, 2)]  # type: ignore[attr-defined]
    assert ctx.sent[2][1] == ForgetMarkers(0, BELOW)
    # a ledger restarting later hears they ended
    recovery = Reply("recover-ledger")
    coord.receive(RecoverLedger(0, recovery))
    assert recovery.result().ended_upto[0] == BELOW - 1


def test_a_purge_committing_completes_before_the_answer() -> None:
    ctx = RecordingContext()
    coord = PurgeCoordinator(ctx)
    reply = Reply("p1")
    coord.receive(_purge(1, 1, reply))
    (prepare,) = [m for _, m in ctx.sent if type(m) is M.PreparePurge]
    coord.receive(M.PurgePrepared(prepare.purge_id, EMPTY))  # its write goes to persistence
    done = Reply("recover")
    coord.receive(RecoverMembership(0, BELOW, done))
    assert not done.done and not reply.done  # waits for the commit
    coord.receive(M.Committed(prepare.purge_id))
    assert done.done and reply.done and reply.error is None
    pid, manifest = reply.result()
    assert pid == prepare.purge_id and manifest.entries == ()
    kinds = [type(m).__name__ for a, m in ctx.sent if a[0] == M.LEDGER]
    assert kinds[-3:] == ["ApplyPurge", "EvictionUpdate", "ForgetMarkers"]


def test_a_ledger_drops_the_markers_of_the_failed_incarnation() -> None:
    ctx = RecordingContext()
    ledger = LedgerShard(ctx, 0)
    old = M.PurgeMarker((0, 3), 0, 1, "c", 10)
    other = M.PurgeMarker((0, BELOW + 1), 0, 1, "c", 12)  # the new incarnation's
    ledger.receive(old)
    ledger.receive(other)
    assert not ledger.durable(("purge", old.marker))  # held until its purge ends
    ledger.receive(ForgetMarkers(0, BELOW))
    assert ledger.durable(("purge", old.marker))
    assert not ledger.durable(("purge", other.marker))
    ledger.receive(old)  # a late copy is ignored: nothing held for it again
    assert ledger.durable(("purge", old.marker))
    assert ledger.handler_errors == 0


def test_the_facade_fails_the_calls_in_flight_and_the_next_flush_after_lost_signals() -> None:
    """`InFlight` (the facade's side of a membership shard's restart): the replies
    not answered come back to be failed; a flush fails at once only if signals went
    to the shard after the last flush's barrier before the restart."""
    shard = (M.MEMBERSHIP, 0)
    flight = InFlight()
    answered, waiting = Reply("assign"), Reply("leave")
    flight.sent(shard, M.Assign(1, "c", answered))
    flight.sent(shard, M.Leave(2, T0, waiting))
    answered.set_result(None)
    flush = M.Barrier((0,), 1, Reply("flush"), durable=True, reports_loss=True)
    assert flight.sent(shard, flush) is None
    # nothing sent since that flush: only the replies in flight fail
    assert flight.restarted(shard) == [waiting, flush.reply]
    assert (
        flight.sent(shard, M.Barrier((0,), 1, Reply("f2"), durable=True, reports_loss=True)) is None
    )
    # signals after the last flush, then the restart: the next flush fails, once
    flight.sent(shard, M.SignalBatch([(1, 2, 0, 1.0, T0, None)]))
    assert flight.restarted(shard)[0].label == "f2"
    why = flight.sent(shard, M.Barrier((0,), 1, Reply("f3"), durable=True, reports_loss=True))
    assert why is not None and "partly applied" in why
    assert (
        flight.sent(shard, M.Barrier((0,), 1, Reply("f4"), durable=True, reports_loss=True)) is None
    )
    # a barrier that reports no loss (a read's) neither fails nor clears the signals
    flight.sent(shard, M.SignalBatch([(1, 2, 0, 1.0, T0, None)]))
    read = M.Barrier((0,), 1, Reply("read"))
    assert flight.sent(shard, read) is None
    assert read.reply in flight.restarted(shard)
    assert flight.sent(shard, M.Barrier((0,), 1, Reply("f5"), reports_loss=True)) is not None


def test_a_restarted_coordinator_applies_a_committed_purge_from_the_ledgers_copy_once() -> None:
    """`CoordinatorLost` (a restarted coordinator's question): the ledger answers the
    purges it prepared and did not apply, with its own preparation; the retraction
    sent from it applies once, and a copy of it is a no-op; an abandoned purge's
    preparation is dropped."""
    ctx = RecordingContext()
    ledger = LedgerShard(ctx, 0)
    recs = [LogRecord(0, i, 1 + i % 2, "c", 5, 1, 1.0, T0 + i) for i in range(6)]
    ledger.receive(M.Attribute.of_records(recs))
    for n, user in ((1, 1), (2, 2)):
        ledger.receive(M.PurgeMarker((0, n), 0, user, "c", 6))
        ledger.receive(M.PreparePurge(100 + n, user, "c", 0, 6, (0, n)))
    lost = Reply("lost")
    ledger.receive(CoordinatorLost(lost))
    open_ = lost.result()
    assert [(p.purge_id, len(prepared.records)) for p, prepared in open_] == [(101, 3), (102, 3)]
    (prep, prepared), (other, _) = open_
    apply = M.ApplyPurge(prep.purge_id, prep.user, prep.cohort, prepared)
    ledger.receive(apply)
    assert (ledger.retracted, ledger.purges_applied) == (3, 1)
    ledger.receive(apply)  # sent again: a no-op
    assert (ledger.retracted, ledger.purges_applied) == (3, 1)
    ledger.receive(M.PurgeAbandoned(other.marker, 0, other.user, "c", other.bound))
    again = Reply("again")
    ledger.receive(CoordinatorLost(again))
    assert again.result() == []
    assert ledger.handler_errors == 0
