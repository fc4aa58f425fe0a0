"""Clocks: where the library's notion of "now" comes from.

Time is integer nanoseconds since the Unix epoch everywhere (DESIGN.md, "Time and
decay"). The clock is injectable so that tests, replays and simulations control it;
nothing in the library reads wall time except through a clock.
"""

from __future__ import annotations

import operator
import threading
import time
from typing import Any, Protocol, runtime_checkable

from tidal_actors._errors import InvalidArgument

__all__ = ["Clock", "ManualClock", "SystemClock"]


def _checked(field: str, value: Any) -> int:
    """``value`` as int ns in ``[0, 2**63)``, or InvalidArgument naming ``field``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise InvalidArgument(
            field, value, "must be an int (nanoseconds since the epoch)"
        ) from None
    if not 0 <= v < 2**63:
        raise InvalidArgument(field, value, "must be in [0, 2**63)")
    return v


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

    Raises:
        InvalidArgument: ``start_ns``, ``now_ns`` (set) or the time ``advance`` would
            reach is not an int in ``[0, 2**63)``; the time is left unchanged.
    """

    def __init__(self, start_ns: int = 0) -> None:
        self._now = _checked("start_ns", start_ns)
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        return self._now

    def set(self, now_ns: int) -> None:
        """Set the time to ``now_ns`` (int nanoseconds; may go backwards)."""
        value = _checked("now_ns", now_ns)
        with self._lock:
            self._now = value

    def advance(self, delta_ns: int) -> int:
        """Move the time by ``delta_ns`` nanoseconds (may be negative); returns the new time."""
        if isinstance(delta_ns, bool) or not isinstance(delta_ns, int):
            raise InvalidArgument("delta_ns", delta_ns, "must be an int (nanoseconds)")
        with self._lock:
            self._now = _checked("now_ns + delta_ns", self._now + delta_ns)
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"
