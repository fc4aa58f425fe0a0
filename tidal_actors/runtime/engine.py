"""The engine behind `TidalDb`, `AsyncTidalDb` and the test `Harness`: `Core`.

Owns a database's lifetime on a host: restore on open (`runtime.restore`), starting
the behaviours, the flusher thread (and what its failure means: `check_open`), and
closing (flush, stop the actors, snapshot, close the store); what a process exit or
a fork means for open databases is `runtime.open_cores`. Holds no domain state and
never waits for a reply (the facades decide how to wait: block, await, or step a
harness).

The operations are `runtime.engine_ops.Operations` (validation and message building),
the serving reads `runtime.serving.Serving`, signal intake (buffering, batching,
backpressure) `runtime.intake.Intake` and the flusher thread `runtime.flusher.Flusher`,
which `Core` extends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, cast

from tidal_actors._clock import Clock, SystemClock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, StorageError, TidalError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.coordinator import PurgeCoordinator
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime import open_cores
from tidal_actors.runtime.call import Call, combined, error_of
from tidal_actors.runtime.callers import Callers
from tidal_actors.runtime.flusher import Flusher
from tidal_actors.runtime.host import Host
from tidal_actors.runtime.intake import Buffer
from tidal_actors.runtime.restore import (
    build_states,
    check_meta,
    snapshot_delete_ops,
    snapshot_write_ops,
)
from tidal_actors.storage.protocol import Store
from tidal_actors.storage.stores import Restored

__all__ = ["CLOSE_WAIT_S", "STOP_ORDER", "Call", "Core", "build_states", "check_meta"]

log = logging.getLogger("tidal_actors")

STOP_ORDER = [M.MEMBERSHIP, M.LEDGER, M.COORDINATOR, M.PERSISTENCE]
CLOSE_WAIT_S = 60.0  # how long close() waits for each of its steps (seconds)


class Core(Flusher):
    """Validation, buffering and message building on top of a host.

    Args:
        config, clock: as for :meth:`TidalDb.open`.
        store: an ``LmdbStore`` or ``NullStore``.
        restored: what ``store.load()`` returned.
        host: a started-on-demand host (``PykkaHost`` or the test harness's host).
        buffered: buffer signals per shard (production); False sends each signal
            as its own message (the message-driven harness).
    """

    def __init__(
        self,
        config: Config,
        clock: Clock,
        store: Store,
        restored: Restored,
        host: Host,
        *,
        buffered: bool = True,
    ) -> None:
        self.config = config
        self.clock = clock
        # the read time of a serving read (`Serving`): the system clock's is read
        # directly, without its method's Python frame (what `SystemClock.now_ns` returns)
        self._clock_now = time.time_ns if type(clock) is SystemClock else clock.now_ns
        self.store = store
        self.host = host
        self.closed = False
        self.refusing = False  # closed, or the flusher failed: the fast paths' one check
        self._flusher_error: Exception | None = None  # why the flusher ended (`_flush_loop`)
        self._flusher_stop = threading.Event()
        self._flusher_wake = threading.Event()
        self._flusher_asleep = False  # waiting on ``_flusher_wake`` (`_flush_loop`)
        self.fenced = False  # a shard was fenced (`_replaced`)
        self._fence_causes: list[str] = []  # why, one line per fenced shard
        self.pid = os.getpid()  # the process that opened it: the only one that may use it
        self._carried: list[StorageError] = []  # errors of flushes nobody read (`FlushCall`)
        self._carry_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._close_done = threading.Event()
        self._closer: int | None = None
        # the replies callers wait for (`track`), failed by close(): a plain set used
        # without a lock (add, discard and list() are each one step under the GIL)
        self._inflight: set[Reply] = set()
        self._inflight_failed = False
        self._nm = config.membership_shards
        self._nl = config.ledger_shards
        self._batch = config.batch_size if buffered else 1
        # the batch each shard gets: at most ``inflight_budget_ms`` of its work, so that
        # the batch in hand (which nothing overtakes) is short too (`_tune_batches`)
        self._steps = [self._batch] * self._nm
        self._buffered = buffered
        self._buffers = [Buffer() for _ in range(self._nm)]
        self._callers = Callers(self._nl)  # what each caller wrote (`_serve`)
        self._read_cohorts: dict[str, int] = {}  # cohort -> ledger shard (`_read_cohort`)
        self.nonblocking = False  # set by an async facade: no call ever waits for room
        # blocking signal_batch calls sending chunk by chunk: close() waits for them
        self._batch_calls = 0
        self._batch_calls_done = threading.Condition(self._close_lock)
        try:
            mstates, lstates, coord = build_states(config, restored, store)
        except TidalError:
            raise
        except Exception as exc:  # noqa: BLE001 - decoded values that still do not fit together
            path = getattr(store, "path", "the store")
            raise StorageError(f"cannot restore from {path}: {type(exc).__name__}: {exc}") from exc
        self._read_only = bool(getattr(store, "read_only", False))
        if (restored.snapshot_mark is not None or restored.snapshot_chunks) and not self._read_only:
            # a snapshot is valid until the first write after the open that reads it;
            # chunks without a mark (a crash between the parts of this deletion in a
            # ``shards`` store) go too: a later close's mark must never find them
            store.commit(snapshot_delete_ops(restored))
        ctx = host.ctx
        self.persistence = Persistence(ctx, store)
        self.coordinator = PurgeCoordinator(ctx, coord)
        self.ledgers = [LedgerShard(ctx, i, s) for i, s in enumerate(lstates)]
        behaviours = [self.persistence, self.coordinator]
        behaviours += self.ledgers
        behaviours += [MembershipShard(ctx, i, s) for i, s in enumerate(mstates)]
        host.start(behaviours)
        host.on_replace = self._replaced
        if (
            restored.statuses_pending
            and config.rematerialize_after_ms is not None
            and not self._read_only
        ):
            # a crash interrupted a purge's re-materialization: finish it now
            host.tell(M.COORD_ADDR, M.ResumeRematerialization())
        self._flusher: threading.Thread | None = None
        open_cores.add(self)
        if buffered:
            cast(Any, host.ctx).wake_ticker = self.wake_flusher  # a `HostContext`
            self.start_flusher()

    def _replaced(self, address: M.Address, behaviour: Behaviour) -> None:
        """The host restarted the actor at ``address`` (`runtime.supervision`): keep
        the new one for stats() and for the snapshot written at close."""
        if getattr(behaviour, "fenced", False):
            # fenced (`runtime.supervision.Fenced`): the state it held may be
            # half-updated, so no snapshot is written; the next open reads the store
            self.fenced = True
            self._fence_causes.append(str(getattr(behaviour, "error", "")))
            if address[0] == M.LEDGER:  # its reads go to it, and fail
                self.ledgers[address[1]].stop_publishing()
        elif isinstance(behaviour, Persistence):
            self.persistence = behaviour
        elif isinstance(behaviour, LedgerShard):
            self.ledgers[address[1]] = behaviour

    def fault_reports(self) -> list[FaultReport]:
        """The handler failures the host's supervisor dealt with, oldest first (the
        last ``REPORTS_KEPT``; `runtime.supervision`, or the deterministic host's
        `testing.faults`); empty under a host without one.

        Raises:
            DatabaseClosed: the database is closed.
        """
        self.check_open()
        supervisor = getattr(self.host, "supervisor", None)
        reports = getattr(self.host if supervisor is None else supervisor, "reports", None)
        return [] if reports is None else list(reports)

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the actors (membership, ledgers, coordinator, persistence last),
        close the store, and fail calls still waiting with DatabaseClosed. Idempotent.

        Raises (once closed): StorageError: signals acknowledged since the last flush
            are not durable. ActorFailure: the flusher had failed (`check_open`)."""
        with self._close_lock:
            first = not self.closed
            self.closed = self.refusing = True
            if first:
                self._closer = threading.get_ident()
        if not first:
            # closed, or being closed by another thread: return once that is done
            if self._closer != threading.get_ident():
                self._close_done.wait()
            return
        try:
            self._close()
        finally:
            self._close_done.set()

    def _close(self) -> None:
        lost: StorageError | None = None
        final_flush: Reply | None = None
        # a fence: a call that found the database open and is about to send waits
        # here; one that comes after sees it closed (`_send` checks under the lock)
        for buf in self._buffers:
            with buf.lock:
                pass
        with self._batch_calls_done:  # blocking signal_batch calls under way finish
            self._batch_calls_done.wait_for(lambda: self._batch_calls == 0, CLOSE_WAIT_S)
        self._flusher_stop.set()
        self._flusher_wake.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self._send_all_buffers()
            # 1: every message sent before close has passed the membership shards
            # (purge requests are at the coordinator); 2: purges in flight finish;
            # 3: everything is committed.
            r = Reply("close-sync")
            self._barrier(tuple(range(self._nl)), r, closing=True)
            self.host.settle(r, CLOSE_WAIT_S)
            r = Reply("close-drain")
            self.host.tell(M.COORD_ADDR, M.Drain(r))
            self.host.settle(r, CLOSE_WAIT_S)
            r = Reply("close-flush")
            self._barrier(tuple(range(self._nl)), r, durable=True, closing=True, reports_loss=True)
            if not self.host.settle(r, CLOSE_WAIT_S):
                final_flush = r  # not confirmed yet: looked at again once the actors stopped
            lost = error_of(r)
        except TidalError:
            pass
        self.host.stop(STOP_ORDER)
        self.fail_inflight()
        try:
            if self.store.durable and not self._read_only:
                # every actor has stopped: the closing thread owns the store now. A
                # snapshot that cannot be written (full map) is only a speed-up lost:
                # the next open replays the history instead. None is written after a
                # purge committed but not applied (ruled out by the fence above) or a
                # failed history write (the state holds signals reported not durable).
                failed = self.persistence.failed_writes or any(
                    b.history_failed for b in self.ledgers
                )
                applied = sum(b.purges_applied for b in self.ledgers)
                if applied == self.coordinator.purges and not (self.fenced or failed):
                    with contextlib.suppress(StorageError):
                        self.store.commit(
                            snapshot_write_ops(self.config, [b.state for b in self.ledgers])
                        )
        finally:
            self.store.close()
        if final_flush is not None:  # stopping the actors drained their mailboxes
            lost = error_of(final_flush)
            if lost is None and not final_flush.done:
                lost = StorageError(
                    f"closed, but the final flush did not finish within {CLOSE_WAIT_S:g} s: the signals "
                    "sent since the last flush may not be durable"
                )
        errors = self.take_carried() + ([lost] if lost is not None else [])
        if self.fenced and lost is None:
            errors.append(
                StorageError(
                    "closed with a fenced shard ("
                    + "; ".join(self._fence_causes)
                    + "): what it was sent since the failure is lost; the next open "
                    "restores it from the store"
                )
            )
        if errors:
            # closed, but signals acknowledged since the last flush are not durable:
            # never silently (close() returning means they are)
            if self._flusher_error is not None:
                errors.append(StorageError(str(self._flusher_failure())))
            raise combined(errors)
        if self._flusher_error is not None:  # durable, but said once more
            raise self._flusher_failure()

    def fail_inflight(self) -> None:
        self._inflight_failed = True
        pending = list(self._inflight)  # after the flag: a reply tracked later sees it
        for reply in pending:
            reply.set_exception(
                DatabaseClosed("the database was closed before this call completed")
            )

    def set_nonblocking(self) -> None:
        """Make this an async facade's core: no call waits for room (`nonblocking`),
        and no caller thread runs an actor's handler itself (`runtime.inline`), so the
        loop's thread never blocks on an actor's work."""
        self.nonblocking = True
        if hasattr(self.host, "callers_run_inline"):
            self.host.callers_run_inline = False

    def check_open(self) -> None:
        if self.closed:
            if self.pid != os.getpid():
                raise DatabaseClosed(
                    f"this database was opened by process {self.pid} and this process "
                    f"({os.getpid()}) is a fork of it: a forked child can neither use it nor "
                    "open its store (py-lmdb keeps one environment per file in a process); "
                    "use the store in a process started with multiprocessing's 'spawn' or "
                    "'forkserver' method (once the parent has closed it), or fork before "
                    "opening the store"
                )
            raise DatabaseClosed("the database is closed")
        if self._flusher_error is not None:
            raise self._flusher_failure()

    def disown(self) -> None:
        """In a forked child: mark this database closed without touching the store, the
        actors or the lock (they are the parent's). See `open_cores.forget_in_child`."""
        self.closed = self.refusing = True
        done = threading.Event()  # not the parent's: a thread may have held its lock
        done.set()
        self._close_done = done
        disown = getattr(self.store, "disown", None)
        if disown is not None:
            disown()

    def track(self, reply: Reply) -> None:
        """Fail ``reply`` with `DatabaseClosed` if the database closes before it is
        settled (until `untrack`)."""
        self._inflight.add(reply)
        if self._inflight_failed:  # close() already failed what was in flight: this one too
            reply.set_exception(
                DatabaseClosed("the database was closed before this call completed")
            )

    def untrack(self, reply: Reply) -> None:
        self._inflight.discard(reply)
