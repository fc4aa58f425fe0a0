"""`AsyncTidalDb`: the async facade's class, whatever the event loop.

Owns the properties, ``close``'s contract and the choice of the loop's class
(``AsyncTidalDb(core)`` makes a `TrioTidalDb` in a trio run, an `AsyncioTidalDb` in
an asyncio loop: the classes registered by `facades.aio`, which knows both loops);
the operations are generated from the operation table (``_generated_aio``), the
waiting logic is `aio_base.LoopFacade`'s. See `facades.aio` for cancellation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import sniffio

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import WrongThread
from tidal_actors.facades._generated_aio import AsyncOperations
from tidal_actors.runtime.engine import Core

__all__ = ["LOOP_CLASSES", "AsyncTidalDb", "loop_name"]

LOOP_CLASSES: dict[str, Callable[[], type[AsyncTidalDb]]] = {}
"""Loop name (``"trio"``, ``"asyncio"``) -> the class an `AsyncTidalDb` is in that loop."""


def loop_name() -> str:
    """The running event loop's name; WrongThread outside a trio run or an asyncio loop."""
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        name = ""
    if name not in ("trio", "asyncio"):
        raise WrongThread(
            "an AsyncTidalDb must be created inside a trio run or an asyncio event loop"
        )
    return name


class AsyncTidalDb(AsyncOperations):
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

    def __new__(cls, core: Core, **kwargs: object) -> AsyncTidalDb:
        if cls is AsyncTidalDb:
            return object.__new__(LOOP_CLASSES[loop_name()]())
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
    def store_layout(self) -> str | None:
        """The layout of the store open: ``"single"`` or ``"shards"`` (whatever
        ``config.store_layout`` asked for); None for an ephemeral database."""
        return self._core.store.layout

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
            StorageError: the store failed to close, or signals acknowledged since
                the last flush are not durable.
            ActorFailure: an actor had failed or was lost (as `TidalDb.close`).
        """
        raise NotImplementedError

    aclose = close
    """The same as `close` (the name ``contextlib.aclosing`` and trio's async resources use)."""
