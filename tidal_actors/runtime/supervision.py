"""Supervision: a shard whose handler failed restarts from the store.

A handler that raises something other than a :class:`TidalError` (the errors a
handler answers on purpose: unknown cohort, storage full ...) may have left its
behaviour's state half-updated. Its caller has the error already (``ActorFailure``,
`Behaviour.receive`); then the supervisor of the host it runs on acts:

* A membership or ledger shard of a durable database is restarted: the exchange of
  `actors.recovery` (the coordinator's answer for a ledger, a durable barrier through
  the ledgers for a membership shard), the store read by persistence, then the
  shard's own restore step (`restore_ledger`, `restore_membership`). What the
  failed incarnation held unhandled goes to the new one: a membership shard's
  stashed messages, a ledger's barrier parts; a ledger's purge preparation waiting
  for its marker is dropped (the coordinator abandoned that purge). The deterministic
  test host restarts a crashed shard through the same two functions.
  A restart that fails (say a transient store error) is tried again
  (``RESTART_RETRY_S``); if every try fails the shard is fenced (:class:`Fenced`):
  its half-updated state is never served, written or snapshotted again, every
  message to it fails with ``ActorFailure``, and a reopen restores it from the store.
* Anything else is resumed as it is: the coordinator and persistence change their
  state only after a commit, and a failure ends the purge, rebuild or write it hit
  with the error (`PurgeCoordinator.on_error`, `Persistence.commit`); an ephemeral
  database has nothing to restart a shard from.

Each failure gives a :class:`FaultReport` (``action`` says which), logged on the
``tidal_actors`` logger at ERROR, kept in `Supervisor.reports` (the last
``REPORTS_KEPT``) and passed to `Supervisor.on_fault` if set.

The restart runs on the failed actor's thread and waits for the coordinator and
persistence (up to ``RESTART_WAIT_S`` seconds each step). No cycle of waits can form:
persistence waits on no actor, the coordinator's messages to a shard never wait for
room, and a ledger waits only on persistence.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour, Context, replies_of
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.recovery import FaultReport, LedgerRecovery, LoadStore, RecoverLedger
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import EMPTY, LogRecord
from tidal_actors.runtime.engine import build_states
from tidal_actors.storage.stores import Restored

__all__ = [
    "REPORTS_KEPT",
    "RESTART_RETRY_S",
    "RESTART_WAIT_S",
    "Fenced",
    "Supervisor",
    "restore_ledger",
    "restore_membership",
]

log = logging.getLogger("tidal_actors")

RESTART_WAIT_S = 60.0
REPORTS_KEPT = 100
# a restart that fails (a transient store error) is tried again after each delay
RESTART_RETRY_S = (0.05, 0.25, 1.0)


class Fenced(Behaviour):
    """Stands in for a shard whose restart failed every time: its state may be
    half-updated, so nothing is served from it. Every message fails with
    :class:`ActorFailure` (its reply, a barrier's reply, or the coordinator's wait
    for a preparation or a rebuild), so writes and flushes are refused with a clear
    error; the engine writes no snapshot at close (`Engine._replaced`), and the
    next open restores the shard from the durable store.
    """

    fenced = True

    def __init__(self, ctx: Context, address: M.Address, error: ActorFailure) -> None:
        super().__init__(ctx)
        self.address = address
        self.error = error

    def receive(self, message: object) -> None:
        err = self.error
        self.handler_errors += 1
        for reply in replies_of(message):
            reply.set_exception(err)
        if isinstance(message, M.PreparePurge):
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(message.purge_id, EMPTY, err))
        elif isinstance(message, M.RematStart):
            self.ctx.tell(M.COORD_ADDR, M.RematDone(message.token, message.cohort, error=err))


def restore_ledger(
    config: Config,
    ctx: Context,
    restored: Restored,
    store: Any,
    index: int,
    recovery: LedgerRecovery,
    counters: Mapping[str, int] | None = None,
    inherited: Iterable[M.PurgeMarker] = (),
    handshake: bool = False,
) -> LedgerShard:
    """Ledger shard ``index`` rebuilt from ``restored`` (what ``store.load()`` read
    after the exchange), the coordinator's ``recovery`` and the markers the failed
    incarnation took (``inherited``), or, with ``handshake``, restored with its links
    (`LedgerShard.restarted`). The log is trimmed no further than the bounds of
    the purges in flight (the coordinator's and the inherited markers), before its
    rows are settled."""
    inherited = tuple(inherited)
    held: dict[int, dict[M.Marker, int]] = {}
    for note in (*recovery.in_flight, *inherited):
        held.setdefault(note.mshard, {})[note.marker] = note.bound
    _, lstates, _ = build_states(config, restored, store, held, ledgers=(index,))
    return LedgerShard.restarted(
        ctx, index, lstates[index], recovery, counters, inherited, handshake
    )


def restore_membership(
    config: Config,
    ctx: Context,
    restored: Restored,
    store: Any,
    index: int,
    incarnation: int,
    in_doubt: Mapping[int, Reply] | None = None,
    counters: Mapping[str, int] | None = None,
    numbered: int = 0,
) -> MembershipShard:
    """Membership shard ``index`` rebuilt from ``restored`` (`MembershipShard.restarted`;
    ``numbered``: the failed incarnation's ``next_rseq``)."""
    mstates, _, _ = build_states(config, restored, store, ledgers=())
    return MembershipShard.restarted(
        ctx, index, mstates[index], incarnation, in_doubt, counters, numbered
    )


def carried_over(held: list[object]) -> tuple[list[object], list[object]]:
    """``held`` (a failed ledger's `held_messages`) split into what its next
    incarnation takes (barrier parts: the messages before them were applied and are
    in the store) and what is dropped (purge preparations: the coordinator abandoned
    their purge when the shard restarted)."""
    keep: list[object] = [m for m in held if isinstance(m, M.BarrierPart)]
    return keep, [m for m in held if not isinstance(m, M.BarrierPart)]


def account(report: FaultReport, message: object) -> None:
    """Add ``message``, lost to a failure, to ``report``."""
    report.dropped.append(type(message).__name__)
    if isinstance(message, M.SignalBatch):
        report.lost_signals.extend(message.signals)
    elif isinstance(message, M.Attribute):
        report.lost_records.extend(LogRecord(*r) for r in message.records)
    for reply in replies_of(message):
        report.failed.append(reply.label or type(message).__name__)


def take_fault(old: Behaviour) -> tuple[object, BaseException, FaultReport]:
    """``old``'s handler failure (`Behaviour.fault`, then cleared): the message, the
    exception and the report of what it lost (``action`` "resumed" until a
    supervisor restarts or fences the shard)."""
    assert old.fault is not None
    message, exc = old.fault
    old.fault = None
    report = FaultReport(old.address, "resumed", repr(exc))
    doubt = getattr(old, "fault_in_doubt", None)
    if doubt is not None:  # partly applied or persisted: not lost for sure
        old.fault_in_doubt = None  # type: ignore[attr-defined]
        report.in_doubt.append(doubt)
        for reply in replies_of(message):
            report.failed.append(reply.label or type(message).__name__)
    else:
        account(report, message)
    return message, exc, report


class Supervisor:
    """Restarts a failed shard of a `PykkaHost` from the store (see the module).

    Args:
        config: the database's settings.
        ctx: the host's context (``tell`` included).
        store: the store persistence owns (``durable`` says whether a shard can
            restart from it).
    """

    def __init__(self, config: Config, ctx: Context, store: Any) -> None:
        self.config = config
        self.ctx = ctx
        self.store = store
        self.reports: collections.deque[FaultReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.on_fault: Callable[[FaultReport], None] | None = None
        self._incarnation: dict[M.Address, int] = {}

    def failed(self, old: Behaviour) -> Behaviour:
        """``old`` failed (`Behaviour.fault`): the behaviour to host from now on."""
        message, exc, report = take_fault(old)
        new: Behaviour = old
        kind = old.address[0]
        if kind in (M.MEMBERSHIP, M.LEDGER) and getattr(self.store, "durable", False):
            # its state may be half-updated: restarted, or else fenced, never resumed
            for delay in (*RESTART_RETRY_S, None):
                try:
                    new = self._restart(old, report)
                    report.action = "restarted"
                    break
                except Exception as err:  # noqa: BLE001 - tried again, then fenced
                    report.cause += f"; the restart failed: {err!r}"
                    if delay is not None:
                        time.sleep(delay)
            else:
                fence = ActorFailure(
                    f"{kind}[{old.address[1]}] is fenced: it failed and could not restart "
                    f"from the store ({report.cause}); reopen the database"
                )
                new = Fenced(self.ctx, old.address, fence)
                report.action = "fenced"
                # control writes sent and not answered: their Committed reaches the
                # fence, which cannot apply them; their callers learn it now
                pending = getattr(old, "in_doubt", dict)
                for reply in pending().values():
                    label = reply.label or "control write"
                    if label not in report.in_doubt:
                        report.in_doubt.append(label)
                    doubt = ActorFailure(
                        f"{fence}; this control write was sent to the store before the "
                        "failure: whether it committed, the reopened database says"
                    )
                    doubt.__cause__ = exc
                    reply.set_exception(doubt)
                held = getattr(old, "held_messages", list)
                for msg in held():
                    new.receive(msg)
        if new is old:
            old.resume()
        self.reports.append(report)
        log.error(
            "%s[%d] failed on %s (%s): %s",
            *old.address,
            type(message).__name__,
            report.cause,
            report.action,
        )
        if self.on_fault is not None:
            try:
                self.on_fault(report)
            except Exception:  # noqa: BLE001 - an application callback must not stop the actor
                log.exception("FaultReport callback failed")
        return new

    def _ask(self, address: M.Address, make: Callable[[Reply], object], label: str) -> Any:
        reply = Reply(label)
        self.ctx.tell(address, make(reply))
        return reply.get(RESTART_WAIT_S)

    def _restart(self, old: Behaviour, report: FaultReport) -> Behaviour:
        index = old.address[1]
        n = self._incarnation.get(old.address, 1)  # incarnations so far
        self._incarnation[old.address] = n + 1
        if isinstance(old, LedgerShard):
            recovery = self._ask(M.COORD_ADDR, lambda r: RecoverLedger(index, r), "recover")
            report.failed.extend(f for f in recovery.failed if f not in report.failed)
            restored = self._ask(M.PERSIST_ADDR, LoadStore, "load-store")
            ledger = restore_ledger(
                self.config,
                self.ctx,
                restored,
                self.store,
                index,
                recovery,
                old.counters(),
                old.marker_notes(),
            )
            ledger.take_over_loss(old)
            keep, dropped = carried_over(old.held_messages())
            for msg in dropped:
                report.dropped.append(type(msg).__name__)
            for msg in keep:
                ledger.receive(msg)
            return ledger
        assert isinstance(old, MembershipShard)
        # every record this shard numbered is applied and committed before the read
        ledgers = tuple(range(self.config.ledger_shards))
        sync = Reply("restart-sync")
        barrier = M.Barrier(ledgers, 1, sync, durable=True)
        for li in ledgers:
            self.ctx.tell((M.LEDGER, li), M.BarrierPart(barrier))
        sync.get(RESTART_WAIT_S)
        restored = self._ask(M.PERSIST_ADDR, LoadStore, "load-store")
        in_doubt = old.in_doubt()
        report.in_doubt.extend(r.label for r in in_doubt.values() if r.label not in report.in_doubt)
        shard = restore_membership(
            self.config,
            self.ctx,
            restored,
            self.store,
            index,
            n,
            in_doubt,
            old.counters(),
            old.state.next_rseq,
        )
        shard.take_over_loss(old)
        held = old.held_messages()
        for i, msg in enumerate(held):
            shard.receive(msg)
            if shard.fault is not None:  # the rest waits for the next incarnation
                shard.set_aside(held[i + 1 :])
                break
        return shard
