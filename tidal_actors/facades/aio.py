"""`AsyncTidalDb` and `open_tidal`: the async facade, under trio and under asyncio.

Owns the async operation surface, declared once for both loops: each method validates
and sends through the shared `Core`, exactly as `TidalDb` does, then parks the calling
task until the reply is in (`aio_base.LoopFacade`). What differs between the loops
(parking, the thread-safe wake-up, checkpoints, closing) is in `aio_trio` and
`aio_asyncio`; ``AsyncTidalDb(core)`` and `open_tidal` pick the running loop's with
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors.facades.aio_db import LOOP_CLASSES, AsyncTidalDb, loop_name

__all__ = ["AsyncTidalDb", "open_tidal"]


def _trio_class() -> type[AsyncTidalDb]:
    from tidal_actors.facades.aio_trio import TrioTidalDb

    return TrioTidalDb


def _asyncio_class() -> type[AsyncTidalDb]:
    from tidal_actors.facades.aio_asyncio import AsyncioTidalDb

    return AsyncioTidalDb


LOOP_CLASSES["trio"] = _trio_class  # imported when first used: trio is not
LOOP_CLASSES["asyncio"] = _asyncio_class  # imported by `import tidal_actors`


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
    from cancellation. An exception from the body propagates unchanged, unless
    closing raises too (`AsyncTidalDb.close`: signals acknowledged since the last
    flush not durable, `StorageError`; a failed flusher thread, `ActorFailure`):
    then that error propagates, the body's its ``__context__``.

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
    if loop_name() == "trio":
        from tidal_actors.facades.aio_trio import open_trio as opener
    else:
        from tidal_actors.facades.aio_asyncio import open_asyncio as opener
    async with opener(path, config, clock) as db:
        yield db
