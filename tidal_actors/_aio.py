"""`AsyncTidalDb` and `open_tidal`: the trio facade.

Owns awaiting replies under trio. Each method validates and sends through the shared
`Core`, exactly as `TidalDb` does, then parks the calling task; the actor thread that
settles the reply wakes it with ``TrioToken.run_sync_soon``. It must not await a pykka
future (pykka's ``Future.__await__`` yields a bare ``None``, which trio rejects) nor
spend a thread per waiting call: the only threads are the actors' own and one trio
worker, for a moment, to open and to close the store.

Theory of operation
-------------------
* A call registers a done-callback on each of its replies, then parks the task with
  ``wait_task_rescheduled``. The callback runs in the settling actor thread and only
  posts a wake-up to the run (``run_sync_soon``); the task is rescheduled in the trio
  thread unless it was cancelled meanwhile. A run that has ended raises
  ``RunFinishedError`` at the actor; the callback swallows it, so a late reply never
  hurts the actor that sends it and logs nothing.
* Every reply sent and not yet settled is remembered (``_unsettled``), including
  those whose caller was cancelled, so that leaving ``open_tidal`` lets each of them
  finish before it flushes, stops the actors and closes the store.
* Domain time comes from the database's clock only, never from
  ``trio.current_time()``. Under a ``MockClock`` with autojump (pytest-trio's
  ``autojump_clock``) a task waiting for an actor looks idle to trio, which would
  jump the clock and fire timeouts spuriously; while any call is in flight a system
  task sits in ``trio.testing.wait_all_tasks_blocked``, which trio treats as
  activity, so the clock does not jump until the reply is in.

Cancellation (per method below)
-------------------------------
* Operations with a reply are sent when the call begins, before its first checkpoint.
  Once sent, an operation runs to completion in the actors; a cancelled caller only
  stops waiting. So a cancelled ``assign_cohort``, ``unassign_cohort``,
  ``leave_community_layer``, ``rejoin_community_layer``, ``request_community_purge``,
  ``flush``, ``rematerialize`` or ``compact`` is **applied completely**, never in
  part: a membership change (assign, unassign, leave, rejoin) is seen by every later
  call on the same user, which queues behind it at the user's membership shard; a
  later purge of the same user is ordered after a cancelled one; and every one of
  them has finished, and is durable, by the time the ``async with`` has exited.
  (A leave's flag, history and gate change in one step after one commit; a purge's
  manifest and tombstones are one commit, then the retraction.)
* Reads change nothing, so a cancelled read has nothing to undo.
* ``signal_with_context`` and ``signal_batch`` check for cancellation *before*
  queueing and cannot be cancelled after: if they raise ``trio.Cancelled`` the
  signal(s) were **not applied at all**; if they return, they are queued.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from ._clock import Clock
from ._config import Config
from ._core import Call, Core
from ._db import open_core
from ._errors import DatabaseClosed, WrongThread
from ._reply import Reply
from ._types import (
    CommunityMembership,
    LeaveEpoch,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
    RematerializationReport,
    Signal,
    WindowCount,
)

__all__ = ["AsyncTidalDb", "open_tidal"]

# Real-time budgets of the closing worker thread (seconds): replies still in flight
# get this long to settle before the store is closed under them, and the actor threads
# this long to end once stopped.
_SETTLE_BUDGET_S = 60.0
_JOIN_BUDGET_S = 5.0
# How often (real seconds) the autojump guard re-arms while a call is in flight.
_GUARD_CUSHION_S = 0.001

# Opens are serialized so that the threads an open starts can be told apart from the
# threads another open starts at the same time (see _open_blocking).
_OPEN_LOCK = threading.Lock()


class _AutojumpGuard:
    """Keeps a MockClock with autojump from jumping while tidal work is in flight."""

    __slots__ = ("_busy", "_running")

    def __init__(self) -> None:
        self._busy = 0
        self._running = False

    def enter(self) -> None:
        self._busy += 1
        if self._running:
            return
        clock = trio.lowlevel.current_clock()
        if isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold != math.inf:
            self._running = True
            trio.lowlevel.spawn_system_task(self._hold, name="tidal-autojump-guard")

    def exit(self) -> None:
        self._busy -= 1

    async def _hold(self) -> None:
        try:
            while self._busy:
                # trio never autojumps while a task waits here (MockClock docs).
                await trio.testing.wait_all_tasks_blocked(_GUARD_CUSHION_S)
        finally:
            self._running = False


class _Waiter:
    """One parked task waiting for one reply; touched only in the trio thread."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None

    def wake(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


def _open_blocking(
    path: str | os.PathLike[str] | None, config: Config | None, clock: Clock | None
) -> tuple[Core, list[threading.Thread]]:
    with _OPEN_LOCK:
        before = set(threading.enumerate())
        core = open_core(path, config, clock)
        started = [t for t in threading.enumerate() if t not in before]
    return core, started


class AsyncTidalDb:
    """The community personalization layer under trio: :class:`TidalDb`'s methods,
    awaitable, with the same names, arguments, results and errors.

    Get one from :func:`open_tidal`. Await its methods from tasks of the trio run
    (and thread) that opened it; awaiting never blocks the event loop on an actor.
    The one wait in the trio thread is backpressure: when a membership mailbox
    already holds ``Config.mailbox_capacity`` signal batches, handing it more signals
    (a signal call, or the buffered signals any call sends ahead of itself) waits for
    room (see :meth:`signal_with_context`). Cancellation is documented per method; in short,
    an operation with a reply is applied completely once the call has begun, and a
    signal is not applied at all if its call raises ``trio.Cancelled``.

    Every method raises :class:`DatabaseClosed` once the ``async with`` has begun to
    exit (or :meth:`close` was called), :class:`WrongThread` when awaited outside the
    trio run and thread that opened it, and :class:`InvalidArgument` (naming the
    argument and value) for bad input, in which case nothing was sent.

    ``AsyncTidalDb(core)`` wraps an open core for the current trio run without
    owning its lifetime; applications use :func:`open_tidal`.

    Added in 0.1.0.
    """

    def __init__(
        self,
        core: Core,
        *,
        _started_threads: list[threading.Thread] | None = None,
        _guard: _AutojumpGuard | None = None,
    ) -> None:
        try:
            self._token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            raise WrongThread("an AsyncTidalDb must be created inside a trio run") from None
        self._core = core
        self._thread_id = threading.get_ident()
        self._closed = False
        self._close_done: trio.Event | None = None
        self._unsettled: set[Reply] = set()
        self._started_threads = list(_started_threads or ())
        self._guard = _guard if _guard is not None else _AutojumpGuard()
        self._late_wakeups = 0

    # -- properties and lifetime --------------------------------------------------

    @property
    def config(self) -> Config:
        """The :class:`Config` in force."""
        return self._core.config

    @property
    def clock(self) -> Clock:
        """The clock "now" comes from (int ns since the epoch); never trio's clock."""
        return self._core.clock

    @property
    def closed(self) -> bool:
        """True once closing has begun."""
        return self._closed or self._core.closed

    async def close(self) -> None:
        """Let every operation already sent finish, flush, stop every actor and close
        the store; returns when all of it is done and every thread the database
        started has ended. Shielded from cancellation. A second call waits for the
        first and is otherwise a no-op. ``open_tidal`` calls it on exit; calling it
        earlier is allowed.

        Raises:
            WrongThread: awaited outside the trio run and thread that opened it.
            StorageError: the store failed to close.
        """
        if self._core.pid != os.getpid():
            return  # a forked child: the database is its parent's (`Core.disown`)
        self._check_thread()
        if self._close_done is not None:
            with trio.CancelScope(shield=True):
                await self._close_done.wait()
            return
        self._closed = True
        self._close_done = trio.Event()
        try:
            with trio.CancelScope(shield=True):
                self._guard.enter()
                try:
                    await trio.to_thread.run_sync(self._close_blocking, thread_name="tidal-close")
                finally:
                    self._guard.exit()
        finally:
            self._close_done.set()

    aclose = close

    def _close_blocking(self) -> None:
        deadline = time.monotonic() + _SETTLE_BUDGET_S
        pending = list(self._unsettled)
        for reply in pending:
            reply.wait(max(0.0, deadline - time.monotonic()))
        self._core.close()
        deadline = time.monotonic() + _JOIN_BUDGET_S
        for t in self._started_threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    # -- plumbing -------------------------------------------------------------------

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread_id:
            raise WrongThread(
                "this AsyncTidalDb belongs to the trio run of another thread; "
                "use trio.from_thread.run(db.method, ...) or a TidalDb"
            )
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None
        if token is not self._token:
            raise WrongThread("this AsyncTidalDb belongs to another trio run")

    def _check(self) -> None:
        if self._closed:
            raise DatabaseClosed("the database is closed (its `async with open_tidal()` has exited)")
        self._check_thread()

    def _settled(self, waiter: _Waiter, reply: Reply) -> None:
        # Runs in the actor thread that settled ``reply``: forget it, post the wake-up.
        # No lock: set.add/discard/copy of identity-hashed objects are atomic under the
        # GIL, and a lock shared with the trio thread would make it wait on actors.
        self._unsettled.discard(reply)
        try:
            self._token.run_sync_soon(waiter.wake)
        except trio.RunFinishedError:
            # The run has ended and nobody waits any more: nothing to do, nothing to log.
            self._late_wakeups += 1

    async def _run(self, call: Call) -> Any:
        core = self._core
        replies = call.replies
        waiters: list[tuple[Reply, _Waiter]] = []
        for r in replies:
            core.track(r)
            if not r.done:
                w = _Waiter()
                self._unsettled.add(r)
                r.add_done_callback(functools.partial(self._settled, w))
                waiters.append((r, w))
        delivered = False
        try:
            parked = False
            for r, w in waiters:
                if r.done:
                    continue
                parked = True
                w.task = trio.lowlevel.current_task()
                self._guard.enter()
                try:
                    await trio.lowlevel.wait_task_rescheduled(w.abort)
                finally:
                    self._guard.exit()
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            delivered = True
            return call.result()
        finally:
            if not delivered:
                call.abandon()  # cancelled: what only this caller would hear goes on
            for r in replies:
                core.untrack(r)

    # -- signals ------------------------------------------------------------------

    async def signal_with_context(
        self,
        user_id: int,
        entity_id: int,
        signal_type: int,
        weight: float = 1.0,
        timestamp_ns: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Submit one engagement signal (see :meth:`TidalDb.signal_with_context`).

        Returns once queued; applied within ``Config.signal_flush_interval_ms``,
        durable after :meth:`flush`. Queueing is a plain call in the trio thread (a few
        µs): it waits only under backpressure, when the user's membership mailbox
        already holds ``Config.mailbox_capacity`` unprocessed signal batches (the
        actors are far behind), and then the event loop waits too -- the slowdown
        backpressure exists to apply; a thread hop per signal would cost more than
        the signal.

        Cancellation: checked before queueing only; ``trio.Cancelled`` means the
        signal was not applied at all.

        Raises:
            InvalidArgument: a bad argument (nothing queued).
        """
        self._check()
        await trio.lowlevel.checkpoint_if_cancelled()
        self._core.signal_with_context(user_id, entity_id, signal_type, weight, timestamp_ns, context)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def signal_batch(self, signals: Iterable[Signal]) -> None:
        """Submit many :class:`Signal` s; all are validated first, none is queued if
        any is bad.

        Validation and queueing run in the trio thread, about 1-3 µs per signal: split
        inputs of many thousands of signals into several calls to keep the event loop
        responsive. Backpressure as for :meth:`signal_with_context`.

        Cancellation: checked before queueing only; ``trio.Cancelled`` means none of
        the signals was applied.

        Raises:
            InvalidArgument: naming ``signals[i].field`` and the value.
        """
        self._check()
        await trio.lowlevel.checkpoint_if_cancelled()
        self._core.signal_batch(signals)
        await trio.lowlevel.cancel_shielded_checkpoint()

    # -- membership ---------------------------------------------------------------

    async def assign_cohort(self, user_id: int, cohort: str) -> None:
        """Put the user in ``cohort`` from now on; returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad id; cohort empty, over 200 UTF-8 bytes, or ``@...``.
            StorageError: the commit failed (nothing changed).
        """
        self._check()
        await self._run(self._core.assign_cohort(user_id, cohort))

    async def unassign_cohort(self, user_id: int, cohort: str) -> None:
        """Take the user out of ``cohort`` (no-op if not in it); returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad id or cohort. StorageError: commit failed (nothing changed).
        """
        self._check()
        await self._run(self._core.unassign_cohort(user_id, cohort))

    async def cohorts_of(self, user_id: int) -> frozenset[str]:
        """The user's cohorts (``@community`` is implicit and not listed).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        self._check()
        return await self._run(self._core.cohorts_of(user_id))  # type: ignore[no-any-return]

    async def leave_community_layer(self, user_id: int) -> None:
        """Stop forwarding the user's signals (spec: leave-stop-forward).

        Status becomes Left with ``left_at_ns`` = the clock's now and a leave epoch
        opens; returns once committed and the gate is closed, so a signal submitted
        after this returns is gated. Leaving again changes nothing.

        Cancellation: applied completely (sent when the call begins): status, epoch
        and gate change together, seen by every later call on the user, durable by
        the time the ``async with`` has exited.

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        self._check()
        await self._run(self._core.leave_community_layer(user_id))

    async def rejoin_community_layer(self, user_id: int) -> None:
        """Resume forwarding: status Active, the open epoch closed at the clock's now.

        Rejoining an Active user changes nothing. Returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        self._check()
        await self._run(self._core.rejoin_community_layer(user_id))

    async def community_layer_status(self, user_id: int) -> CommunityMembership:
        """The user's :class:`CommunityMembership`; a user with no entry is Active.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        self._check()
        return await self._run(self._core.community_layer_status(user_id))  # type: ignore[no-any-return]

    async def community_leave_history(self, user_id: int) -> list[LeaveEpoch]:
        """Every :class:`LeaveEpoch` ``(left_at_ns, rejoined_at_ns or None)``, oldest first.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        self._check()
        return await self._run(self._core.community_leave_history(user_id))  # type: ignore[no-any-return]

    # -- purge --------------------------------------------------------------------

    async def request_community_purge(self, user_id: int, cohort_name: str) -> tuple[PurgeId, PurgeManifest]:
        """Retract every contribution of the user to ``cohort_name`` still in the log
        (see :meth:`TidalDb.request_community_purge`); returns ``(purge id, manifest)``
        once the manifest is committed and the retraction applied.

        Cancellation: applied completely (sent when the call begins): the manifest
        and tombstones are committed in one transaction, then the retraction is
        applied; :meth:`list_purge_manifests` shows it afterwards.

        Raises:
            InvalidArgument: bad id or cohort name.
            StorageError: the manifest could not be committed (nothing was retracted).
        """
        self._check()
        return await self._run(self._core.request_community_purge(user_id, cohort_name))  # type: ignore[no-any-return]

    async def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's :class:`PurgeManifest` s, oldest first.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        self._check()
        return await self._run(self._core.list_purge_manifests(user_id))  # type: ignore[no-any-return]

    # -- reads --------------------------------------------------------------------

    async def read_decay_score(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> float:
        """``sum(w_i * 2 ** (-(at - t_i) / half_life))`` over the key's unretracted
        contributions with ``t_i <= at``; 0.0 if none. ``at_ns``: int ns, default the
        database clock's now (never trio's clock). Sees every signal submitted before
        the call.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad cohort, id or ``at_ns``.
        """
        self._check()
        return await self._run(self._core.read_decay_score(cohort, entity_id, signal_type, at_ns))  # type: ignore[no-any-return]

    async def read_window(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> WindowCount:
        """Count and weight sum of the key's contributions in buckets
        ``b(at)-n+1 .. b(at)``, where ``b(t) = t // window_width_ns`` (``at_ns`` int
        ns, default the clock's now).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad cohort, id or ``at_ns``.
        """
        self._check()
        return await self._run(self._core.read_window(cohort, entity_id, signal_type, at_ns))  # type: ignore[no-any-return]

    async def top_entities(
        self, cohort: str, signal_type: int, k: int, at_ns: int | None = None
    ) -> list[tuple[int, float]]:
        """Up to ``k`` ``(entity_id, decay score)`` with score > 0 at ``at``, highest
        first (ties: lower entity_id first).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad cohort, type, ``k`` or ``at_ns``.
        """
        self._check()
        return await self._run(self._core.top_entities(cohort, signal_type, k, at_ns))  # type: ignore[no-any-return]

    async def aggregate_rows(self, at_ns: int | None = None) -> list[tuple[str, int, int, float, int, float]]:
        """Every key with an unretracted contribution, as ``(cohort, entity_id,
        signal_type, decay_score, window_count, window_weight)`` at ``at``, sorted.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        self._check()
        return await self._run(self._core.aggregate_rows(at_ns))  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, int]:
        """Counters, as :meth:`TidalDb.stats` (``signals``, ``forwarded``, ``gated``,
        ``purges``, ``retracted``, ``commits``...).

        Cancellation: a read; nothing to undo.
        """
        self._check()
        return await self._run(self._core.stats())  # type: ignore[no-any-return]

    async def flush(self) -> None:
        """Apply every signal submitted before the call and commit all pending writes.

        Cancellation: applied completely (sent when the call begins); the caller
        just does not learn when.

        Raises:
            StorageError: a history write failed since the last flush.
        """
        self._check()
        await self._run(self._core.flush())

    # -- re-materialization and erasure ----------------------------------------------

    async def rematerialize(self, cohort: str) -> RematerializationReport:
        """Rebuild ``cohort``'s aggregates from the contribution history without the
        records any purge covered, then erase those records from the durable history
        (see :meth:`TidalDb.rematerialize`); returns a :class:`RematerializationReport`.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad cohort name. UnknownCohort: the cohort has no state
                and was never purged. StorageError: the erasure could not be committed.
        """
        self._check()
        return await self._run(self._core.rematerialize(cohort))  # type: ignore[no-any-return]

    async def purge_status(self, purge_id: int) -> PurgeStatus:
        """Where a purge stands: retracted live (count), re-materialized (and when, ns).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: not an int in ``[0, 2**128)``. UnknownPurge: no such purge.
        """
        self._check()
        return await self._run(self._core.purge_status(purge_id))  # type: ignore[no-any-return]

    async def compact(self) -> dict[str, int]:
        """Commit everything, drop history past ``Config.history_retention_ns`` (if
        set) and rewrite the LMDB file without free pages (see :meth:`TidalDb.compact`);
        returns ``{"bytes_before": int, "bytes_after": int}`` (zeros when ephemeral).

        Cancellation: applied completely (sent when the call begins).

        Raises:
            StorageError: another process has the environment open (its pid named), or
                the rewrite failed; the old file stays in use, unchanged.
        """
        self._check()
        return await self._run(self._core.compact())  # type: ignore[no-any-return]

    async def lmdb_flags(self) -> dict[str, Any]:
        """The LMDB environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``...).

        Cancellation: a read; checked before reading (``trio.Cancelled`` or the flags).

        Raises:
            InvalidArgument: the database is ephemeral.
        """
        self._check()
        await trio.lowlevel.checkpoint_if_cancelled()
        flags = self._core.lmdb_flags()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return flags


@asynccontextmanager
async def open_tidal(
    path: str | os.PathLike[str] | None = None,
    *,
    config: Config | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[AsyncTidalDb]:
    """Open (and restore) a database for the current trio run: ``async with
    open_tidal(path) as db:``. The trio twin of :meth:`TidalDb.open`.

    Opening and closing run in one trio worker thread, briefly. Leaving the block --
    normally, by an exception, or by cancellation -- lets every operation already
    sent finish, flushes pending writes, stops every actor, closes the store and
    waits for the threads the database started to end; this cleanup is shielded
    from cancellation. An exception from the body propagates unchanged.

    Args:
        path: LMDB directory (created if missing), or None for an ephemeral database.
        config: settings (default: :class:`Config` defaults).
        clock: source of "now", int ns since the epoch (default :class:`SystemClock`);
            trio's clock is never used for domain time.

    Raises:
        DatabaseLocked: ``path`` is already open, in this or another process.
        StorageError: the store cannot be opened or read.
        InvalidArgument: bad ``path``/``config``/``clock``, or a config that does not
            fit the store.

    Added in 0.1.0.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    guard = _AutojumpGuard()
    # Shielded: once the store is open it must reach the ``finally`` that closes it.
    with trio.CancelScope(shield=True):
        guard.enter()
        try:
            core, started = await trio.to_thread.run_sync(
                _open_blocking, path, config, clock, thread_name="tidal-open"
            )
        finally:
            guard.exit()
    try:
        db = AsyncTidalDb(core, _started_threads=started, _guard=guard)
    except BaseException:
        core.close()
        raise
    try:
        yield db
    finally:
        await db.close()
