"""`AsyncTidalDb` under trio: parking, wake-ups, checkpoints, open and close.

Owns what is trio's in the async facade; the operations are `aio_db.AsyncTidalDb`'s and
the waiting logic `aio_base.LoopFacade`'s. A task parks with
``wait_task_rescheduled``; actor threads wake it with ``TrioToken.run_sync_soon``. The
only threads are the actors' own and one trio worker, for a moment, to open and to
close the store.

Under a ``MockClock`` with autojump (pytest-trio's ``autojump_clock``) a task waiting
for an actor looks idle to trio, which would jump the clock and fire timeouts
spuriously; while any call is in flight a system task sits in
``trio.testing.wait_all_tasks_blocked``, which trio treats as activity, so the clock
does not jump until the reply is in. Domain time never comes from trio's clock.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import WrongThread
from tidal_actors.facades.aio_base import open_blocking
from tidal_actors.facades.aio_db import AsyncTidalDb
from tidal_actors.runtime.engine import Core

__all__ = ["TrioTidalDb", "open_trio"]

# How often (real seconds) the autojump guard re-arms while a call is in flight.
_GUARD_CUSHION_S = 0.001


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


class _TrioEvent:
    """One parked task; touched only in the trio thread."""

    __slots__ = ("flag", "guard", "task")

    def __init__(self, guard: _AutojumpGuard) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.flag = False
        self.guard = guard

    def set(self) -> None:
        self.flag = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        if self.flag:
            return
        self.task = trio.lowlevel.current_task()
        self.guard.enter()
        try:
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        finally:
            self.guard.exit()


class TrioTidalDb(AsyncTidalDb):
    """`AsyncTidalDb` in a trio run (what ``AsyncTidalDb(core)`` makes there)."""

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
            raise WrongThread(
                "an AsyncTidalDb must be created inside a trio run or an asyncio loop"
            ) from None
        super().__init__(core, _started_threads=_started_threads)
        self._guard = _guard if _guard is not None else _AutojumpGuard()
        self._close_done: trio.Event | None = None

    def _new_event(self) -> _TrioEvent:
        return _TrioEvent(self._guard)

    def _post(self, fn: Callable[[], None]) -> None:
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            # The run has ended and nobody waits any more: nothing to do, nothing to log.
            self._late_wakeups += 1

    def _check(self) -> Core:
        try:  # the common case: open, this thread, this run
            if (
                not self._closed
                and threading.get_ident() == self._thread_id
                and trio.lowlevel.current_trio_token() is self._token
            ):
                return self._core
        except RuntimeError:  # not in a trio run
            pass
        return super()._check()  # raises what applies

    def _check_loop(self) -> None:
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

    async def _checkpoint_before(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()

    async def _checkpoint_after(self) -> None:
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def close(self) -> None:
        if self._forked():
            return
        self._check_loop()
        if self._close_done is not None:
            with trio.CancelScope(shield=True):
                await self._close_done.wait()
            return
        self._closed = True
        self._close_done = trio.Event()
        self._wake_room_waiters()
        try:
            with trio.CancelScope(shield=True):
                self._guard.enter()
                try:
                    await trio.to_thread.run_sync(self._close_blocking, thread_name="tidal-close")
                finally:
                    self._guard.exit()
        finally:
            self._close_done.set()

    close.__doc__ = AsyncTidalDb.close.__doc__
    aclose = close


@asynccontextmanager
async def open_trio(
    path: str | os.PathLike[str] | None, config: Config | None, clock: Clock | None
) -> AsyncIterator[AsyncTidalDb]:
    """`open_tidal` in a trio run."""
    await trio.lowlevel.checkpoint_if_cancelled()
    guard = _AutojumpGuard()
    # Shielded: once the store is open it must reach the ``finally`` that closes it.
    with trio.CancelScope(shield=True):
        guard.enter()
        try:
            core, started = await trio.to_thread.run_sync(
                open_blocking, path, config, clock, thread_name="tidal-open"
            )
        finally:
            guard.exit()
    try:
        db = TrioTidalDb(core, _started_threads=started, _guard=guard)
    except BaseException:
        core.close()
        raise
    try:
        yield db
    finally:
        await db.close()
