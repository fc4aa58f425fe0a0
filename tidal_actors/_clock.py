"""Clocks: where the library's notion of "now" comes from.

Time is integer nanoseconds since the Unix epoch everywhere (DESIGN.md, "Time and
decay"). The clock is injectable so that tests, replays and simulations control it;
nothing in the library reads wall time except through a clock.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now_ns() -> int`` (nanoseconds since the Unix epoch)."""

    def now_ns(self) -> int:  # pragma: no cover - protocol
        ...


class SystemClock:
    """Wall-clock time from :func:`time.time_ns` (nanoseconds since the epoch)."""

    def now_ns(self) -> int:
        return time.time_ns()

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; thread-safe.

    Args:
        start_ns: initial time, int nanoseconds since the epoch (default 0).

    It may be set or moved backwards on purpose, to test clock steps: the library
    never lets a contribution weigh more than its weight whatever the clock does.
    """

    def __init__(self, start_ns: int = 0) -> None:
        self._now = int(start_ns)
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        return self._now

    def set(self, now_ns: int) -> None:
        """Set the time to ``now_ns`` (int nanoseconds; may go backwards)."""
        with self._lock:
            self._now = int(now_ns)

    def advance(self, delta_ns: int) -> int:
        """Move the time by ``delta_ns`` nanoseconds (may be negative); returns the new time."""
        with self._lock:
            self._now += int(delta_ns)
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"
