"""`AsyncTidalDb` and `open_tidal`: the async facade, under trio and under asyncio.

Owns the async operation surface, declared once for both loops: each method validates
and sends through the shared `Core`, exactly as `TidalDb` does, then parks the calling
task until the reply is in (`_aio_base.LoopFacade`). What differs between the loops
(parking, the thread-safe wake-up, checkpoints, closing) is in `_aio_trio` and
`_aio_asyncio`; ``AsyncTidalDb(core)`` and `open_tidal` pick the running loop's with
sniffio.

Why two thin facades and not anyio: the facade's one loop-specific need is a
fire-and-forget wake-up from a foreign (actor) thread. anyio's ``from_thread.run_sync``
waits in the calling thread for the loop to run the function, so an actor would wait
on the event loop (an ask cycle through the loop), and a ``BlockingPortal`` adds a
task and a queue per database; trio's ``TrioToken.run_sync_soon`` and asyncio's
``loop.call_soon_threadsafe`` are exactly the primitive, so each loop gets a small
module of its own over one shared operation table and waiting logic, and no new
dependency.

Cancellation (per method below)
-------------------------------
* Operations with a reply are sent when the call begins, before its first
  checkpoint. Once sent, an operation runs to completion in the actors; a cancelled
  caller only stops waiting. So a cancelled ``assign_cohort``, ``unassign_cohort``,
  ``leave_community_layer``, ``rejoin_community_layer``, ``request_community_purge``,
  ``flush``, ``rematerialize`` or ``compact`` is **applied completely**, never in
  part: a membership change (assign, unassign, leave, rejoin) is seen by every later
  call on the same user, which queues behind it at the user's membership shard; a
  later purge of the same user is ordered after a cancelled one; and every one of
  them has finished, and is durable, by the time the ``async with`` has exited.
  (A leave's flag, history and gate change in one step after one commit; a purge's
  manifest and tombstones are one commit, then the retraction.)
* Reads change nothing, so a cancelled read has nothing to undo.
* ``signal_with_context`` and ``signal_batch`` can be cancelled only *before*
  queueing (while waiting for room, and at one checkpoint): if they raise
  ``trio.Cancelled`` / ``asyncio.CancelledError`` the signal(s) were **not applied at
  all**; if they return, they are queued.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import sniffio

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import WrongThread
from tidal_actors._types import (
    CommunityMembership,
    LeaveEpoch,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
    RematerializationReport,
    Signal,
    WindowCount,
)
from tidal_actors.facades.aio_base import LoopFacade
from tidal_actors.runtime.engine import Core

__all__ = ["AsyncTidalDb", "open_tidal"]


def _loop_name() -> str:
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        name = ""
    if name not in ("trio", "asyncio"):
        raise WrongThread(
            "an AsyncTidalDb must be created inside a trio run or an asyncio event loop"
        )
    return name


class AsyncTidalDb(LoopFacade):
    """The community personalization layer under trio or asyncio: :class:`TidalDb`'s
    methods, awaitable, with the same names, arguments, results and errors.

    Get one from :func:`open_tidal`. Await its methods from tasks of the run or loop
    (and thread) that opened it; awaiting never blocks the event loop: a task waiting
    for a reply, or for room in a full mailbox (backpressure), is parked and woken
    through the loop's thread-safe wake-up. Cancellation is documented per method; in
    short, an operation with a reply is applied completely once the call has begun,
    and a signal is not applied at all if its call raises the loop's cancellation.

    Every method raises :class:`DatabaseClosed` once the ``async with`` has begun to
    exit (or :meth:`close` was called), :class:`WrongThread` when awaited outside the
    run or loop (and thread) that opened it, and :class:`InvalidArgument` (naming the
    argument and value) for bad input, in which case nothing was sent.

    ``AsyncTidalDb(core)`` wraps an open core for the current trio run or asyncio
    loop without owning its lifetime; applications use :func:`open_tidal`.

    Added in 0.1.0 (trio); asyncio after 0.1.0.
    """

    def __new__(cls, core: Core, **kwargs: Any) -> AsyncTidalDb:
        if cls is AsyncTidalDb:
            if _loop_name() == "trio":
                from tidal_actors.facades.aio_trio import TrioTidalDb as impl
            else:
                from tidal_actors.facades.aio_asyncio import AsyncioTidalDb as impl  # type: ignore[assignment]
            return object.__new__(impl)
        return object.__new__(cls)

    def __init__(
        self, core: Core, *, _started_threads: list[threading.Thread] | None = None
    ) -> None:
        super().__init__(core, _started_threads)

    # -- properties and lifetime --------------------------------------------------

    @property
    def config(self) -> Config:
        """The :class:`Config` in force."""
        return self._core.config

    @property
    def clock(self) -> Clock:
        """The clock "now" comes from (int ns since the epoch); never the loop's clock."""
        return self._core.clock

    @property
    def closed(self) -> bool:
        """True once closing has begun."""
        return self._closed or self._core.closed

    async def close(self) -> None:
        """Let every operation already sent finish, flush, stop every actor and close
        the store; returns when all of it is done and every thread the database
        started has ended. Shielded from cancellation (under asyncio a cancellation
        meanwhile is raised once it is done). A second call waits for the first and is
        otherwise a no-op. ``open_tidal`` calls it on exit; calling it earlier is
        allowed.

        Raises:
            WrongThread: awaited outside the run or loop (and thread) that opened it.
            StorageError: the store failed to close.
        """
        raise NotImplementedError

    aclose = close

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
        durable after :meth:`flush`. Queueing is a plain call in the loop's thread (a
        few µs) that never waits on an actor or a lock held for long. Backpressure is
        an await: when the user's membership mailbox already holds
        ``Config.mailbox_capacity`` unprocessed signal batches and this signal would
        fill a batch, the task parks until the shard takes one, and other tasks run.

        Cancellation: checked before queueing only (while waiting for room, then at
        one checkpoint); ``trio.Cancelled`` / ``asyncio.CancelledError`` means the
        signal was not applied at all.

        Raises:
            InvalidArgument: a bad argument (nothing queued).
        """
        core = self._check()
        m = core.room_needed(user_id)
        await self._queue(
            [] if m is None else [m],
            lambda: core.signal_with_context(
                user_id, entity_id, signal_type, weight, timestamp_ns, context
            ),
        )

    async def signal_batch(self, signals: Iterable[Signal]) -> None:
        """Submit many :class:`Signal` s; all are validated first, none is queued if
        any is bad.

        Validation and queueing run in the loop's thread, about 1-3 µs per signal:
        split inputs of many thousands of signals into several calls to keep the
        event loop responsive. Backpressure as for :meth:`signal_with_context`: the
        task first waits until every full membership mailbox has room; a batch larger
        than ``Config.signal_batch_size`` then goes in one step.

        Cancellation: checked before queueing only; ``trio.Cancelled`` /
        ``asyncio.CancelledError`` means none of the signals was applied.

        Raises:
            InvalidArgument: naming ``signals[i].field`` and the value.
        """
        core = self._check()
        await self._queue(core.full_shards(), lambda: core.signal_batch(signals))

    # -- membership ---------------------------------------------------------------

    async def assign_cohort(self, user_id: int, cohort: str) -> None:
        """Put the user in ``cohort`` from now on; returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad id; cohort empty, over 200 UTF-8 bytes, or ``@...``.
            StorageError: the commit failed (nothing changed).
        """
        await self._run(self._check().assign_cohort(user_id, cohort))

    async def unassign_cohort(self, user_id: int, cohort: str) -> None:
        """Take the user out of ``cohort`` (no-op if not in it); returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad id or cohort. StorageError: commit failed (nothing changed).
        """
        await self._run(self._check().unassign_cohort(user_id, cohort))

    async def cohorts_of(self, user_id: int) -> frozenset[str]:
        """The user's cohorts (``@community`` is implicit and not listed).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        return await self._run(self._check().cohorts_of(user_id))  # type: ignore[no-any-return]

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
        await self._run(self._check().leave_community_layer(user_id))

    async def rejoin_community_layer(self, user_id: int) -> None:
        """Resume forwarding: status Active, the open epoch closed at the clock's now.

        Rejoining an Active user changes nothing. Returns once committed.

        Cancellation: applied completely (sent when the call begins).

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        await self._run(self._check().rejoin_community_layer(user_id))

    async def community_layer_status(self, user_id: int) -> CommunityMembership:
        """The user's :class:`CommunityMembership`; a user with no entry is Active.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        return await self._run(self._check().community_layer_status(user_id))  # type: ignore[no-any-return]

    async def community_leave_history(self, user_id: int) -> list[LeaveEpoch]:
        """Every :class:`LeaveEpoch` ``(left_at_ns, rejoined_at_ns or None)``, oldest first.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        return await self._run(self._check().community_leave_history(user_id))  # type: ignore[no-any-return]

    # -- purge --------------------------------------------------------------------

    async def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> tuple[PurgeId, PurgeManifest]:
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
        return await self._run(self._check().request_community_purge(user_id, cohort_name))  # type: ignore[no-any-return]

    async def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's :class:`PurgeManifest` s, oldest first.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``user_id``.
        """
        return await self._run(self._check().list_purge_manifests(user_id))  # type: ignore[no-any-return]

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
        return await self._run(  # type: ignore[no-any-return]
            self._check().read_decay_score(cohort, entity_id, signal_type, at_ns)
        )

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
        return await self._run(self._check().read_window(cohort, entity_id, signal_type, at_ns))  # type: ignore[no-any-return]

    async def top_entities(
        self, cohort: str, signal_type: int, k: int, at_ns: int | None = None
    ) -> list[tuple[int, float]]:
        """Up to ``k`` ``(entity_id, decay score)`` with score > 0 at ``at``, highest
        first (ties: lower entity_id first).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad cohort, type, ``k`` or ``at_ns``.
        """
        return await self._run(self._check().top_entities(cohort, signal_type, k, at_ns))  # type: ignore[no-any-return]

    async def aggregate_rows(
        self, at_ns: int | None = None
    ) -> list[tuple[str, int, int, float, int, float]]:
        """Every key with an unretracted contribution, as ``(cohort, entity_id,
        signal_type, decay_score, window_count, window_weight)`` at ``at``, sorted.

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        return await self._run(self._check().aggregate_rows(at_ns))  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, int]:
        """Counters, as :meth:`TidalDb.stats` (``signals``, ``forwarded``, ``gated``,
        ``purges``, ``retracted``, ``commits``...).

        Cancellation: a read; nothing to undo.
        """
        return await self._run(self._check().stats())  # type: ignore[no-any-return]

    async def flush(self) -> None:
        """Apply every signal submitted before the call and commit all pending writes.

        Cancellation: applied completely (sent when the call begins); the caller
        just does not learn when.

        Raises:
            StorageError: a history write failed since the last flush.
        """
        await self._run(self._check().flush())

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
        return await self._run(self._check().rematerialize(cohort))  # type: ignore[no-any-return]

    async def purge_status(self, purge_id: int) -> PurgeStatus:
        """Where a purge stands: retracted live (count), re-materialized (and when, ns).

        Cancellation: a read; nothing to undo.

        Raises:
            InvalidArgument: not an int in ``[0, 2**128)``. UnknownPurge: no such purge.
        """
        return await self._run(self._check().purge_status(purge_id))  # type: ignore[no-any-return]

    async def compact(self) -> dict[str, int]:
        """Commit everything, drop history past ``Config.history_retention_ns`` (if
        set) and rewrite the LMDB file without free pages (see :meth:`TidalDb.compact`);
        returns ``{"bytes_before": int, "bytes_after": int}`` (zeros when ephemeral).

        Cancellation: applied completely (sent when the call begins).

        Raises:
            StorageError: another process has the environment open (its pid named), or
                the rewrite failed; the old file stays in use, unchanged.
        """
        return await self._run(self._check().compact())  # type: ignore[no-any-return]

    async def lmdb_flags(self) -> dict[str, Any]:
        """The LMDB environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``...).

        Cancellation: a read; checked before reading (cancelled, or the flags).

        Raises:
            InvalidArgument: the database is ephemeral.
        """
        core = self._check()
        await self._checkpoint_before()
        flags = core.lmdb_flags()
        await self._checkpoint_after()
        return flags


@asynccontextmanager
async def open_tidal(
    path: str | os.PathLike[str] | None = None,
    *,
    config: Config | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[AsyncTidalDb]:
    """Open (and restore) a database for the current trio run or asyncio loop:
    ``async with open_tidal(path) as db:``. The async twin of :meth:`TidalDb.open`.

    Opening and closing run in one worker thread, briefly. Leaving the block --
    normally, by an exception, or by cancellation -- lets every operation already
    sent finish, flushes pending writes, stops every actor, closes the store and
    waits for the threads the database started to end; this cleanup is shielded
    from cancellation. An exception from the body propagates unchanged.

    Args:
        path: LMDB directory (created if missing), or None for an ephemeral database.
        config: settings (default: :class:`Config` defaults).
        clock: source of "now", int ns since the epoch (default :class:`SystemClock`);
            the loop's clock is never used for domain time.

    Raises:
        WrongThread: not in a trio run or an asyncio event loop.
        DatabaseLocked: ``path`` is already open, in this or another process.
        StorageError: the store cannot be opened or read.
        InvalidArgument: bad ``path``/``config``/``clock``, or a config that does not
            fit the store.

    Added in 0.1.0 (trio); asyncio after 0.1.0.
    """
    if _loop_name() == "trio":
        from tidal_actors.facades.aio_trio import open_trio as opener
    else:
        from tidal_actors.facades.aio_asyncio import open_asyncio as opener
    async with opener(path, config, clock) as db:
        yield db
