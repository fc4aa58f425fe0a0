"""Fault injection of the deterministic host: crashed shards and persistence.

:class:`FaultInjection` is the base class of
:class:`~tidal_actors.testing.sim_host.DeterministicHost` that drops a crashed
actor's mailbox, answers the callers whose messages were lost (a
:class:`~tidal_actors.actors.recovery.FaultReport` says what), and restarts the
actor: a membership or ledger shard through the product's restore step
(``runtime.supervision.restore_ledger`` and ``restore_membership``, after the exchange
of ``actors.recovery``), as the pykka host does after a handler failure. A crashed
shard is read only through its public hand-over methods (``in_doubt``,
``held_messages``, ``counters``); a crashed persistence actor as
:mod:`~tidal_actors.testing.persistence_crash` says. What a crash
means for the messages in flight is spelled out in
:meth:`Harness.crash_shard <tidal_actors.testing.harness.Harness.crash_shard>` and
:meth:`Harness.crash_persistence <tidal_actors.testing.harness.Harness.crash_persistence>`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, DatabaseClosed, InvalidArgument
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.recovery import FaultReport, LoadStore, RecoverLedger
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import LogRecord
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.runtime.supervision import (
    RESTART_RETRY_S,
    Fenced,
    carried_over,
    restore_ledger,
    restore_membership,
    take_fault,
)
from tidal_actors.testing.persistence_crash import PersistenceCrash
from tidal_actors.testing.schedule import HarnessStuck, Schedule, addr

__all__ = ["FaultInjection", "FaultReport"]

log = logging.getLogger("tidal_actors")


class _Down:
    """A crashed shard waiting for its restart."""

    __slots__ = ("carry", "old", "orphans", "report")

    def __init__(self, old: Behaviour, report: FaultReport) -> None:
        self.old = old
        # in-doubt control writes: token -> (reply, label)
        self.orphans: dict[Any, tuple[Reply, str]] = {}
        # what the next incarnation takes over (`runtime.supervision.carried_over`)
        self.carry: list[object] = []
        self.report = report  # updated if the restart fails and the shard is fenced


class FaultInjection(PersistenceCrash):
    """Crash and restart of actors; the base class of ``DeterministicHost``, whose
    mailboxes and delivery it uses."""

    config: Config
    store: Any
    ctx: HostContext
    schedule: Schedule
    behaviours: dict[M.Address, Behaviour]
    incarnation: dict[M.Address, int]
    on_replace: Callable[[M.Address, Behaviour], None] | None
    _down: dict[M.Address, _Down]
    _closed: bool
    _sender: M.Address
    _barriers_seen: dict[int, M.Barrier]
    _failed_barriers: set[int]
    # the handler failures supervised (`supervise`), for `Core.fault_reports`
    reports: collections.deque[FaultReport]

    def tell(self, address: M.Address, message: object) -> None:
        raise NotImplementedError

    def pending(self) -> dict[M.Address, list[object]]:
        raise NotImplementedError

    def _progress(self, only: Callable[[M.Address], bool] | None = None) -> bool:
        raise NotImplementedError

    def _fail(self, reply: Reply, exc: BaseException, report: FaultReport) -> None:
        if reply.set_exception(exc):
            report.failed.append(self.schedule.label(reply))

    def _restart_links(self, address: M.Address, new: Any) -> None:
        raise NotImplementedError

    def _take_queue(
        self, address: M.Address, keep: Callable[[object], bool] = lambda m: False
    ) -> list[object]:
        """Remove and return the messages sent to ``address`` and not applied, except
        those ``keep`` holds (`testing.sim_links.LinkLayer._take_queue`)."""
        raise NotImplementedError

    def _drop(self, address: M.Address, msg: object, report: FaultReport) -> None:
        """Account for one message lost with a crashed shard."""
        sched = self.schedule
        report.dropped.append(sched.describe(msg))
        why = f"{addr(address)} crashed before handling {type(msg).__name__}"
        if isinstance(msg, M.SignalBatch):
            report.lost_signals.extend(msg.signals)
        elif isinstance(msg, M.Attribute):
            report.lost_records.extend(LogRecord(*r) for r in msg.records)
        elif isinstance(
            msg,
            (
                M.PreparePurge,
                M.RematStart,
                M.RematStep,
                M.RematAbort,
                M.PurgeMarker,
                M.PurgeAbandoned,
            ),
        ):
            pass  # the coordinator ends or lists that purge or rebuild at the restart
        elif isinstance(msg, (M.ApplyPurge, M.EvictionUpdate)):
            pass  # committed before it was sent: the state restored from storage has it
        elif isinstance(msg, M.BarrierPart):
            self._fail(msg.barrier.reply, ActorFailure(why), report)
        else:
            reply = getattr(msg, "reply", None)
            if isinstance(reply, Reply):
                self._fail(reply, ActorFailure(why), report)

    def crash(self, address: M.Address) -> FaultReport:
        """Crash a membership or ledger shard; it restarts from storage once nothing
        else can run. See :meth:`Harness.crash_shard`."""
        if address not in self.behaviours or address[0] not in (M.MEMBERSHIP, M.LEDGER):
            raise InvalidArgument(
                "address", address, "must be a membership or ledger shard's address"
            )
        if address in self._down:
            raise InvalidArgument("address", address, "has crashed already and not restarted yet")
        if self._closed:
            raise DatabaseClosed("the harness is closed")
        if self.store is None or not getattr(self.store, "durable", False):
            raise InvalidArgument(
                "store", self.store, "a shard restarts from storage: use a durable store"
            )
        old = self.behaviours[address]
        report = FaultReport(address)
        down = _Down(old, report)
        lost: list[object]
        if isinstance(old, MembershipShard):
            # a Committed waiting here answers a write of this incarnation: kept for
            # the next one, which answers the write's caller (`MembershipShard.restarted`)
            lost = old.held_messages()
            lost += self._take_queue(address, keep=lambda m: isinstance(m, M.Committed))
            # a control operation whose write is on its way: its outcome is decided by
            # persistence; the caller is answered with it at the restart
            for token, reply in old.in_doubt().items():
                label = self.schedule.label(reply)
                down.orphans[token] = (reply, label)
                report.in_doubt.append(label)
        else:
            assert isinstance(old, LedgerShard)
            # restored with its links (`testing.sim_links`): what was sent to it and
            # not durable there is re-sent after the restart, nothing is carried over
            # from its memory; a purge preparation waiting for its marker dies with it
            # (the coordinator abandons the purge at the restart)
            _, lost = carried_over(old.held_messages())
        for msg in lost:
            self._drop(address, msg, report)
        self._down[address] = down
        self.schedule.event(
            f"crash {addr(address)}: {len(report.dropped)} message(s) dropped, "
            f"{len(report.lost_signals)} signal(s) and {len(report.lost_records)} record(s) lost, "
            f"{len(report.failed)} handle(s) failed, {len(report.in_doubt)} in doubt"
        )
        return report

    def supervise(self, address: M.Address, old: Behaviour) -> None:
        """A handler of ``old`` raised unexpectedly (`Behaviour.fault`): what the pykka
        host's supervisor does (`runtime.supervision.Supervisor.failed`). A membership
        or ledger shard of a durable store goes down, keeping its mailbox, and
        restarts from the store once nothing else can run (what it held unhandled
        goes to the next incarnation, as after a crash); anything else resumes.
        The report is kept in ``reports`` and logged."""
        message, _exc, report = take_fault(old)
        durable = getattr(self.store, "durable", False)
        if address[0] in (M.MEMBERSHIP, M.LEDGER) and durable and not self._closed:
            down = _Down(old, report)
            if isinstance(old, MembershipShard):
                for token, reply in old.in_doubt().items():
                    label = self.schedule.label(reply)
                    down.orphans[token] = (reply, label)
                    report.in_doubt.append(label)
                down.carry = old.held_messages()
            else:
                assert isinstance(old, LedgerShard)
                down.carry, dropped = carried_over(old.held_messages())
                report.dropped.extend(type(m).__name__ for m in dropped)
            self._down[address] = down
            report.action = "restarted"
        else:
            old.resume()
        self.reports.append(report)
        self.schedule.event(
            f"{addr(address)} failed on {type(message).__name__}: {report.cause} ({report.action})"
        )
        log.error(
            "%s[%d] failed on %s (%s): %s",
            *address,
            type(message).__name__,
            report.cause,
            report.action,
        )

    def _ask(self, sender: M.Address, address: M.Address, make: Callable[[Reply], object]) -> Any:
        """Send ``make(reply)`` from ``sender`` and deliver until the reply comes."""
        reply = Reply("restart")
        prev, self._sender = self._sender, sender
        try:
            self.tell(address, make(reply))
        finally:
            self._sender = prev
        while not reply.done and self._progress():
            pass
        if not reply.done:
            raise HarnessStuck(f"{addr(sender)} cannot restart: {address} did not answer")
        return reply.result()

    def restart(self, address: M.Address) -> None:
        """Restart the down shard at ``address`` as the pykka host's supervisor does: a
        restart that fails is tried again (as many times as ``RESTART_RETRY_S`` has
        delays, none waited for here); if every try fails the shard is fenced
        (`runtime.supervision.Fenced`)."""
        causes: list[str] = []
        for _ in range(len(RESTART_RETRY_S) + 1):
            try:
                self._restart(address)
                return
            except HarnessStuck:
                raise
            except Exception as err:  # noqa: BLE001 - tried again, then fenced
                causes.append(repr(err))
                self.schedule.event(f"restart {addr(address)} failed: {err!r}")
        down = self._down.pop(address)
        report = down.report
        report.cause += "".join(f"; the restart failed: {c}" for c in causes)
        report.action = "fenced"
        fence = ActorFailure(
            f"{address[0]}[{address[1]}] is fenced: it could not restart from the store "
            f"({causes[-1]}); reopen the database"
        )
        for reply, label in down.orphans.values():
            if reply.set_exception(fence) and label not in report.in_doubt:
                report.in_doubt.append(label)
        new = Fenced(self.ctx, address, fence)
        self.behaviours[address] = new
        if self.on_replace is not None:
            self.on_replace(address, new)
        self.schedule.event(f"fence {addr(address)}")
        prev, self._sender = self._sender, address
        try:
            for msg in down.carry:
                new.receive(msg)
        finally:
            self._sender = prev

    def _restart(self, address: M.Address) -> None:
        """Restart a crashed shard through the product's restore step
        (`runtime.supervision`): nothing else can run, so every write its crashed
        incarnation caused is committed, and no barrier through the ledgers is needed
        before the store is read."""
        down = self._down[address]  # nothing is delivered to it until it is replaced
        old = down.old
        i = address[1]
        store, n = self.store, self.incarnation[address]
        new: Behaviour
        handshake = False
        if isinstance(old, LedgerShard):
            recovery = self._ask(address, M.COORD_ADDR, lambda r: RecoverLedger(i, r))
            restored = self._ask(address, M.PERSIST_ADDR, LoadStore)
            # a crash is restored by handshake; a handler failure (supervised, its
            # links kept) as the pykka host restores it
            handshake = down.report.action == "down"
            new = restore_ledger(
                self.config,
                self.ctx,
                restored,
                store,
                i,
                recovery,
                old.counters(),
                () if handshake else old.marker_notes(),
                handshake,
            )
        else:
            assert isinstance(old, MembershipShard)
            restored = self._ask(address, M.PERSIST_ADDR, LoadStore)
            committed = {
                token: m.error
                for m in self.pending().get(address, [])
                if isinstance(m, M.Committed)
                for token in (m.token, *m.more)
            }
            in_doubt: dict[Any, Reply] = {}
            for token, (reply, label) in down.orphans.items():
                if token in committed:
                    in_doubt[token] = reply
                    outcome = "committed" if committed[token] is None else "failed"
                else:
                    reply.set_exception(
                        ActorFailure(f"{addr(address)} crashed; the outcome is unknown")
                    )
                    outcome = "outcome unknown"
                self.schedule.event(f"{label} in doubt at the crash: {outcome}")
            new = restore_membership(
                self.config,
                self.ctx,
                restored,
                store,
                i,
                n,
                in_doubt,
                old.counters(),
                old.state.next_rseq,
            )
        new.take_over_loss(old)  # signals it lost and no flush has reported yet
        del self._down[address]
        self.behaviours[address] = new
        self.incarnation[address] = n + 1
        if self.on_replace is not None:
            self.on_replace(address, new)
        self.schedule.event(f"restart {addr(address)} from storage (incarnation {n + 1})")
        if isinstance(new, LedgerShard) and handshake:
            self._restart_links(address, new)
        prev, self._sender = self._sender, address
        try:
            for i, msg in enumerate(down.carry):
                new.receive(msg)
                if new.fault is not None:  # failed on what it took over
                    self.supervise(address, new)
                    if address in self._down:  # down again: the rest goes to the next
                        self._down[address].carry.extend(down.carry[i + 1 :])
                        break
        finally:
            self._sender = prev
