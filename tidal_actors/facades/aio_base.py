"""What the async facades share, whatever the event loop: waiting for replies and for
room, without ever blocking the loop.

Owns the loop-independent half of `AsyncTidalDb`. A subclass per loop (`aio_trio`,
`aio_asyncio`) supplies four things: a one-shot event a task parks on (``_new_event``),
a thread-safe way to run a function in the loop (``_post``: trio's
``TrioToken.run_sync_soon``, asyncio's ``loop.call_soon_threadsafe``), the checkpoints
around queueing, and how to close (shielded, in one worker thread). It must not know
the operations (generated from the operation table, once, for both loops).

Theory of operation
-------------------
* A call registers a done-callback on each of its replies, then parks the task on
  an event. The callback runs in the settling actor thread and only posts ``set`` to
  the loop; a loop that has ended makes ``_post`` a no-op (counted in
  ``_late_wakeups``), so a late reply never hurts the actor that sends it.
* A serving read answered from a ledger shard's published view (the engine's
  ``<read>_now`` returns the value, not a `Call`: `runtime.serving`) returns at
  once, in the task, without parking and without a checkpoint.
* Every reply sent and not yet settled is remembered (``_unsettled``), including
  those whose caller was cancelled, so closing lets each of them finish first.
* Backpressure is an await. The core of an async facade is ``nonblocking``: it never
  waits for room in a mailbox (`Core`). Before a signal call queues, it asks the core
  whether its membership shard's buffer would fill a batch while the mailbox is full
  (`Core.room_needed`); if so the task parks, with every other task waiting for that
  shard, until the mailbox's actor takes a message and calls back (`Core.when_room`),
  which posts one wake-up for all of them. Nothing in the loop's thread waits on a
  lock another thread holds for long: buffer locks are held for a list append or a
  non-waiting put, also by the flusher thread.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors.reply import Reply
from tidal_actors.facades.blocking import open_core
from tidal_actors.runtime.engine import Call, Core

__all__ = ["LoopFacade", "open_blocking"]

T = TypeVar("T")

# Real-time budgets of the closing worker thread (seconds): replies still in flight
# get this long to settle before the store is closed under them, and the actor threads
# this long to end once stopped.
SETTLE_BUDGET_S = 60.0
JOIN_BUDGET_S = 5.0

# Opens are serialized so that the threads an open starts can be told apart from the
# threads another open starts at the same time (see open_blocking).
_OPEN_LOCK = threading.Lock()


def open_blocking(
    path: str | os.PathLike[str] | None, config: Config | None, clock: Clock | None
) -> tuple[Core, list[threading.Thread]]:
    """Open a core (in a worker thread); also return the threads the open started."""
    with _OPEN_LOCK:
        before = set(threading.enumerate())
        core = open_core(path, config, clock)
        started = [t for t in threading.enumerate() if t not in before]
    return core, started


class Event(Protocol):
    """A one-shot event in the loop's thread: ``set`` wakes the task in ``wait``."""

    def set(self) -> None: ...

    async def wait(self) -> None: ...


class LoopFacade:
    """The plumbing of an async facade over one open `Core` (see the module doc)."""

    _closed: bool

    def __init__(self, core: Core, started_threads: list[threading.Thread] | None) -> None:
        self._core = core
        core.set_nonblocking()
        self._thread_id = threading.get_ident()
        self._closed = False
        self._unsettled: set[Reply] = set()
        self._started_threads = list(started_threads or ())
        self._late_wakeups = 0
        self._room_events: dict[int, list[Event]] = {}

    # -- what each loop supplies ------------------------------------------------------

    def _new_event(self) -> Event:
        raise NotImplementedError

    def _post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` soon in the loop's thread; callable from any thread, never waits."""
        raise NotImplementedError

    def _check_loop(self) -> None:
        """Raise WrongThread outside the loop (and thread) that opened the database."""
        raise NotImplementedError

    async def _checkpoint_before(self) -> None:
        """Where a signal call may be cancelled, before it queues anything."""
        raise NotImplementedError

    async def _checkpoint_after(self) -> None:
        """A yield that cannot raise Cancelled (the operation already took effect)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------

    def _check(self) -> Core:
        """The core, if the database is open and called from its loop (each loop's
        class checks the common case in one expression first).

        Raises:
            DatabaseClosed: the database is closed.
            WrongThread: another thread, run or loop (`_check_loop`).
        """
        if self._closed:
            raise DatabaseClosed(
                "the database is closed (its `async with open_tidal()` has exited)"
            )
        self._check_loop()
        return self._core

    def _settled(self, call: Call[Any], event: Event, reply: Reply) -> None:
        # In the actor thread that settled ``reply``: forget it, post the wake-up once
        # the call is done. No lock: set.discard of identity-hashed objects is atomic
        # under the GIL, and a lock shared with the loop's thread would make the loop
        # wait on actors.
        self._unsettled.discard(reply)
        if call.done:
            self._post(event.set)

    async def _run(self, call: Call[T]) -> T:
        core = self._core
        replies = call.replies
        # woken once every reply has come, or one failed (`Call.done`)
        event: Event | None = None
        for r in replies:
            core.track(r)
            if not r.done:
                if event is None:
                    event = self._new_event()
                self._unsettled.add(r)
                r.add_done_callback(functools.partial(self._settled, call, event))
        delivered = False
        try:
            parked = False
            if event is not None and not call.done:
                parked = True
                await event.wait()
            if not parked:
                await self._checkpoint_after()
            delivered = True
            return call.result()
        finally:
            if not delivered:
                call.abandon()  # cancelled: what only this caller would hear goes on
            for r in replies:
                core.untrack(r)
                if delivered:  # failed early: a later step may never be sent
                    self._unsettled.discard(r)

    async def _wait_room(self, shards: list[int]) -> None:
        """Park until each membership shard in ``shards`` has had room (cancellable)."""
        for m in shards:
            ev = self._new_event()
            waiting = self._room_events.setdefault(m, [])
            waiting.append(ev)
            if len(waiting) == 1 and self._core.when_room(
                m, functools.partial(self._post, functools.partial(self._room_made, m))
            ):
                self._room_made(m)
            await ev.wait()
            self._check()

    def _room_made(self, m: int) -> None:
        """In the loop's thread: wake every task waiting for room at shard ``m``."""
        for ev in self._room_events.pop(m, ()):
            ev.set()

    def _wake_room_waiters(self) -> None:
        for m in list(self._room_events):
            self._room_made(m)

    async def _queue(self, shards: list[int], send: Callable[[], None]) -> None:
        """Queue signals: wait for room if needed, then the cancellation point, then
        ``send`` (nothing can cancel it from there)."""
        if shards:
            await self._wait_room(shards)
        await self._checkpoint_before()
        send()
        await self._checkpoint_after()

    def _close_blocking(self) -> None:
        """In one worker thread: let replies in flight settle, close, join threads."""
        deadline = time.monotonic() + SETTLE_BUDGET_S
        for reply in list(self._unsettled):
            reply.wait(max(0.0, deadline - time.monotonic()))
        self._core.close()
        deadline = time.monotonic() + JOIN_BUDGET_S
        for t in self._started_threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def _forked(self) -> bool:
        return self._core.pid != os.getpid()  # a forked child: the database is its parent's
