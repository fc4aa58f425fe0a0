"""Crash and restart of the deterministic host's persistence actor.

:class:`PersistenceCrash` is a base class of
:class:`~tidal_actors.testing.faults.FaultInjection`. A crashed persistence actor is
read through its writes not committed yet (``Persistence.uncommitted``) and its
unreported loss (``Persistence._unreported``); its writers are answered through
``Persistence._ack``, as a supervisor that shares the process may. What the crash
means for the messages in flight: :meth:`Harness.crash_persistence
<tidal_actors.testing.harness.Harness.crash_persistence>`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal_actors._errors import DatabaseClosed, StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.testing.schedule import Schedule, addr

__all__ = ["PersistenceCrash"]


class PersistenceCrash:
    """The persistence half of ``FaultInjection`` (its base class)."""

    ctx: HostContext
    schedule: Schedule
    behaviours: dict[M.Address, Behaviour]
    incarnation: dict[M.Address, int]
    on_replace: Callable[[M.Address, Behaviour], None] | None
    _closed: bool
    _sender: M.Address
    _barriers_seen: dict[int, M.Barrier]
    _failed_barriers: set[int]

    def _take_queue(
        self, address: M.Address, keep: Callable[[object], bool] = lambda m: False
    ) -> list[object]:
        raise NotImplementedError

    def _fail(self, reply: Reply, exc: BaseException, report: FaultReport) -> None:
        raise NotImplementedError

    def crash_persistence(self) -> FaultReport:
        """Crash and restart the persistence actor. See :meth:`Harness.crash_persistence`."""
        if self._closed:
            raise DatabaseClosed("the harness is closed")
        address = M.PERSIST_ADDR
        old = self.behaviours[address]
        assert isinstance(old, Persistence)
        report = FaultReport(address)
        queued = self._take_queue(address)
        lost = old.uncommitted() + queued
        # writes (and history erasures) are answered by the restarted incarnation below
        writes: list[Any] = [
            m for m in lost if isinstance(getattr(m, "ops", None), list) and hasattr(m, "reply")
        ]
        report.lost_writes = len(writes)
        report.dropped = [self.schedule.describe(m) for m in lost]
        err = StorageError("persistence crashed before committing this write")
        for msg in queued:
            if isinstance(msg, M.BarrierPart):
                self._barriers_seen[msg.barrier.barrier_id] = msg.barrier
            elif msg not in writes and isinstance(reply := getattr(msg, "reply", None), Reply):
                self._fail(
                    reply,
                    StorageError(f"persistence crashed before handling {type(msg).__name__}"),
                    report,
                )
        for key, b in list(self._barriers_seen.items()):
            # parts already counted by the crashed incarnation are gone: fail the
            # flush (parts of it that still arrive are dropped by its id)
            self._fail(
                b.reply, StorageError("persistence crashed before this flush committed"), report
            )
            self._failed_barriers.add(key)
        self._barriers_seen.clear()
        new = Persistence(self.ctx, old.store)
        new.commits, new.failed_writes, new.handler_errors = (
            old.commits,
            old.failed_writes,
            old.handler_errors,
        )
        new._unreported = old._unreported
        self.behaviours[address] = new
        self.incarnation[address] += 1
        if self.on_replace is not None:
            self.on_replace(address, new)
        prev, self._sender = self._sender, address
        try:
            # the restarted actor answers every write it lost: a writer waiting for the
            # commit gets the error (nothing applied); a lost history write is counted
            # and reported by the next flush
            for w in writes:
                if isinstance(w.reply, Reply):
                    report.failed.append(self.schedule.label(w.reply))
                elif w.reply is not None:
                    report.failed.append(
                        f"{addr(w.reply[0])}/token={self.schedule.value(w.reply[1])}"
                    )
                new._ack(w, err)
        finally:
            self._sender = prev
        self.schedule.event(
            f"crash persistence[0]: {report.lost_writes} uncommitted write(s) lost, "
            f"{len(report.failed)} writer(s) told; restarted (incarnation {self.incarnation[address]})"
        )
        return report
