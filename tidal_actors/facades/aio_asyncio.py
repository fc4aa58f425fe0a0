"""`AsyncTidalDb` under asyncio: parking, wake-ups, checkpoints, open and close.

Owns what is asyncio's in the async facade; the operations are `aio_db.AsyncTidalDb`'s
and the waiting logic `aio_base.LoopFacade`'s. A task parks on a future of the
running loop; actor threads resolve it with ``loop.call_soon_threadsafe``. The only
threads are the actors' own and one thread, for a moment, to open and to close the
store (not the loop's default executor, which the application may keep busy).

Cancellation follows trio's rules: an operation with a reply is sent before the
task's first await, so ``CancelledError`` leaves it applied completely; a signal call
awaits once (``asyncio.sleep(0)``, where a cancellation lands) before queueing and
never after, so ``CancelledError`` from it means nothing was queued.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import WrongThread
from tidal_actors.facades.aio_base import open_blocking
from tidal_actors.facades.aio_db import AsyncTidalDb
from tidal_actors.runtime.engine import Core

__all__ = ["AsyncioTidalDb", "open_asyncio"]

T = TypeVar("T")


class _AsyncioEvent:
    """One parked task: a future of the loop, touched only in the loop's thread."""

    __slots__ = ("fut",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fut: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        if not self.fut.done():  # a cancelled waiter's future is done already
            self.fut.set_result(None)

    async def wait(self) -> None:
        await self.fut


def _in_thread(
    loop: asyncio.AbstractEventLoop, name: str, fn: Callable[..., T], *args: Any
) -> asyncio.Future[T]:
    """Run ``fn(*args)`` in a new thread; its result or error resolves the future."""
    fut: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def run() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            value, exc = None, e
        loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


async def _shielded(fut: asyncio.Future[T]) -> tuple[T, bool]:
    """Await ``fut`` to its end whatever cancellations arrive; its result, and whether
    the task was cancelled meanwhile (the caller re-raises once safe)."""
    cancelled = False
    while True:
        try:
            return await asyncio.shield(fut), cancelled
        except asyncio.CancelledError:
            if fut.cancelled():
                raise
            cancelled = True


class AsyncioTidalDb(AsyncTidalDb):
    """`AsyncTidalDb` in an asyncio loop (what ``AsyncTidalDb(core)`` makes there)."""

    def __init__(
        self, core: Core, *, _started_threads: list[threading.Thread] | None = None
    ) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise WrongThread(
                "an AsyncTidalDb must be created inside a trio run or an asyncio loop"
            ) from None
        super().__init__(core, _started_threads=_started_threads)
        self._close_fut: asyncio.Future[None] | None = None

    def _new_event(self) -> _AsyncioEvent:
        return _AsyncioEvent(self._loop)

    def _post(self, fn: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: nobody waits any more
            self._late_wakeups += 1

    def _check(self) -> Core:
        try:  # the common case: open, this thread, this loop
            if (
                not self._closed
                and threading.get_ident() == self._thread_id
                and asyncio.get_running_loop() is self._loop
            ):
                return self._core
        except RuntimeError:  # no running loop
            pass
        return super()._check()  # raises what applies

    def _check_loop(self) -> None:
        if threading.get_ident() != self._thread_id:
            raise WrongThread(
                "this AsyncTidalDb belongs to the asyncio loop of another thread; use "
                "asyncio.run_coroutine_threadsafe(db.method(...), loop) or a TidalDb"
            )
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise WrongThread("this AsyncTidalDb belongs to another asyncio loop")

    async def _checkpoint_before(self) -> None:
        await asyncio.sleep(0)

    async def _checkpoint_after(self) -> None:
        """Nothing: a yield here could raise CancelledError after the fact."""

    async def close(self) -> None:
        if self._forked():
            return
        self._check_loop()
        if self._close_fut is None:
            self._closed = True
            self._wake_room_waiters()
            self._close_fut = _in_thread(self._loop, "tidal-close", self._close_blocking)
        fut = self._close_fut
        _, cancelled = await _shielded(fut)
        if cancelled:
            raise asyncio.CancelledError

    close.__doc__ = AsyncTidalDb.close.__doc__
    aclose = close


@asynccontextmanager
async def open_asyncio(
    path: str | os.PathLike[str] | None, config: Config | None, clock: Clock | None
) -> AsyncIterator[AsyncTidalDb]:
    """`open_tidal` in an asyncio loop."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)  # a cancellation before the open lands here
    # Shielded: once the store is open it must reach the ``finally`` that closes it.
    (core, started), cancelled = await _shielded(
        _in_thread(loop, "tidal-open", open_blocking, path, config, clock)
    )
    try:
        db = AsyncioTidalDb(core, _started_threads=started)
    except BaseException:
        core.close()
        raise
    try:
        if cancelled:
            raise asyncio.CancelledError
        yield db
    finally:
        await db.close()
