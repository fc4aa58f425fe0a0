"""The flusher thread of a database's engine (`runtime.engine.Core` extends `Flusher`).

Owns the thread's tick, every ``signal_flush_interval_ms`` while there is work: send
what the callers buffered (`runtime.intake`), size the next batches, have the ledger
shards publish their views (or drop views nobody reads) and the coordinator tick
(re-materializations due); its sleep when there is none, and its wake-up; and what
its failure means: every later call, and close(), raise `_flusher_failure`
(`Core.check_open`).
"""

from __future__ import annotations

import logging
import threading
import time

from tidal_actors._errors import ActorFailure, TidalError
from tidal_actors.actors import messages as M
from tidal_actors.actors.coordinator import PurgeCoordinator
from tidal_actors.actors.ledger_views import WANTED_S
from tidal_actors.runtime.inline import NEVER, set_level
from tidal_actors.runtime.serving import Serving

__all__ = ["Flusher"]

log = logging.getLogger("tidal_actors")


class Flusher(Serving):
    """The flusher thread (see the module doc); `Core` sets the attributes below."""

    coordinator: PurgeCoordinator
    _flusher: threading.Thread | None
    _flusher_stop: threading.Event
    _flusher_wake: threading.Event
    _flusher_asleep: bool
    _flusher_error: Exception | None

    def start_flusher(self) -> None:
        """Start the thread (``tidal-flusher``, a daemon)."""
        self._flusher = threading.Thread(target=self._flush_loop, name="tidal-flusher", daemon=True)
        self._flusher.start()

    def _flusher_failure(self) -> ActorFailure:
        """The error every call raises once the flusher thread failed (its cause the
        flusher's exception)."""
        cause = self._flusher_error
        err = ActorFailure(
            f"the flusher thread failed ({type(cause).__name__}: {cause}): buffered "
            "signals are no longer sent on a tick, so every call is refused; close() "
            "sends and commits the signals acknowledged before, then raises this"
        )
        err.__cause__ = cause
        return err

    def _flush_loop(self) -> None:
        """Every ``signal_flush_interval_ms`` while there is work: send what is buffered,
        size the batches, have ledger shards publish (or drop unread views) and the
        coordinator tick. A tick that finds nothing to do puts the thread to sleep until
        `wake_flusher` (the first signal buffered, a shard that needs a `Publish`, a
        re-materialization scheduled) or a quarter of ``WANTED_S`` (unread views)."""
        was = set_level(NEVER)  # it only offers and ticks: it never runs a handler (`inline`)
        try:
            self._flush_ticks()
        finally:
            set_level(was)  # a test may run the loop in its own thread

    def _flush_ticks(self) -> None:
        """The loop of `_flush_loop`."""
        interval = self.config.signal_flush_interval_ms / 1000.0
        next_tick = next_unread = 0.0
        stop, wake = self._flusher_stop, self._flusher_wake
        while not stop.wait(interval):
            try:
                busy = any(buf.items for buf in self._buffers)
                self._send_all_buffers(offer=True)
                self._tune_batches()
                now = time.monotonic()
                unread = now >= next_unread
                if unread:  # a shard idle since its views were last read drops them
                    next_unread = now + WANTED_S / 4
                for i, ledger in enumerate(self.ledgers):
                    # changes wait for the next publication, or nobody reads the view
                    if ledger.unpublished or (unread and ledger.unread(now)):
                        busy = True
                        self.host.tell((M.LEDGER, i), M.Publish())
                if self.coordinator.remat_due:
                    busy = True
                    if now >= next_tick:
                        next_tick = now + 0.05
                        self.host.tell(M.COORD_ADDR, M.Tick())
            except Exception as exc:  # noqa: BLE001 - said by every later call and close()
                if self.closed and isinstance(exc, TidalError):
                    return  # closing (or a forked child's copy): nothing more to send
                # open: whatever it raised (an actor gone too), nothing sends on a tick
                log.error("tidal_actors: the flusher thread failed", exc_info=exc)
                self._flusher_error = exc
                self.refusing = True
                return
            if busy:
                continue
            # nothing to do: sleep until woken (`wake_flusher`: set ``asleep`` first,
            # then look again, so a wake-up between the look and the wait is not lost;
            # close() sets ``stop`` before ``wake``, so a stop the clear hid is seen)
            wake.clear()
            self._flusher_asleep = True
            if not stop.is_set() and not self._flusher_work():
                wake.wait(WANTED_S / 4)
            self._flusher_asleep = False

    def _flusher_work(self) -> bool:
        """Whether a flusher tick has work now (signals buffered, a ledger shard's
        changes waiting, a re-materialization due)."""
        return (
            any(buf.items for buf in self._buffers)
            or any(ledger.unpublished for ledger in self.ledgers)
            or self.coordinator.remat_due
        )

    def wake_flusher(self) -> None:
        """Wake the flusher thread if it sleeps (called after the work was made: a
        signal buffered, ``unpublished`` set, a re-materialization scheduled)."""
        if self._flusher_asleep:
            self._flusher_asleep = False
            self._flusher_wake.set()
