"""Stopping a long command at a safe point when the user presses Ctrl-C (SIGINT).

Owns the SIGINT handling of ``tidal-actors replay`` and ``simulate``: while a
:class:`StopOnSigint` is entered, the first SIGINT only *asks* for a stop (the row
being applied completes; the caller stops before the next one, then flushes, closes
and reports), a second one raises ``KeyboardInterrupt`` as usual. It knows nothing
about databases: callers check :meth:`StopOnSigint.requested` at their safe points,
or wrap their rows in :func:`until_stopped`.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType
from typing import Any, TypeVar

__all__ = ["EXIT_INTERRUPTED", "STOP_NOTICE", "Interrupted", "StopOnSigint", "until_stopped"]

EXIT_INTERRUPTED = 130
"""Exit status of a command stopped by SIGINT (128 + SIGINT, as shells report it)."""
STOP_NOTICE = (
    "tidal-actors: interrupted: stopping at the next row boundary (Ctrl-C again to abort at once)"
)
"""What the command line prints to standard error at the first SIGINT."""

Row = TypeVar("Row")


class StopOnSigint:
    """Context manager: SIGINT sets a flag instead of raising ``KeyboardInterrupt``.

    Args:
        notice: printed to standard error at the first SIGINT (None: nothing).

    Entered outside the main thread (where Python cannot install signal handlers)
    it does nothing and :meth:`requested` stays False until :meth:`request` is
    called. On exit the previous handler is restored. A second SIGINT restores the
    previous handler and raises ``KeyboardInterrupt`` (the user insists).
    """

    def __init__(self, notice: str | None = None) -> None:
        self.notice = notice
        self._event = threading.Event()
        self._previous: Any = None
        self._installed = False

    def requested(self) -> bool:
        """Whether a stop was asked for (by SIGINT or :meth:`request`)."""
        return self._event.is_set()

    def request(self) -> None:
        """Ask for a stop, as SIGINT does (for tests and other triggers)."""
        self._event.set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():
            self._restore()
            raise KeyboardInterrupt
        self._event.set()
        if self.notice:
            print(self.notice, file=sys.stderr, flush=True)

    def _restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def __enter__(self) -> StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            if self._previous is signal.SIG_IGN:
                return self  # started with SIGINT ignored (nohup, a background job): keep it
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()


def until_stopped(rows: Iterable[Row], stop: Callable[[], bool]) -> Iterator[Row]:
    """Yield ``rows`` until ``stop()`` is true, checked before each row: a row boundary.

    A row already yielded is the consumer's to finish; the next one is not taken
    from ``rows`` (so a reader is not advanced past what was applied).
    """
    it = iter(rows)
    while not stop():
        try:
            row = next(it)
        except StopIteration:
            return
        yield row


class Interrupted(Exception):
    """A run stopped early at a safe point because a stop was asked for (SIGINT).

    Attributes:
        rows: the rows applied to the database under test (int), every one of them
            sent, flushed and the database closed by the time this is raised.
        counts: what was applied, by op (an ``ApplyCounts``), or None.
        phase: ``"runtime"`` (stopped while applying rows) or ``"check"`` (every row
            applied, stopped before the comparison with the reference model).
    """

    def __init__(self, rows: int, phase: str, counts: Any = None) -> None:
        super().__init__(f"interrupted after {rows} rows ({phase})")
        self.rows = rows
        self.phase = phase
        self.counts = counts
