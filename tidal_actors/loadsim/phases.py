"""Phases of a long run (``simulate``), as seen by whoever shows progress.

Owns the small contract between `simulate` and a progress display: `PhaseFn`
``(label, total) -> context manager yielding tick(n)``, a display that shows
nothing (`no_phase`), and `ticking`, which moves a tick along an iterable. Must not
import a display library (tqdm lives in the command line's `cli.progress`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["PhaseFn", "Tick", "no_phase", "ticking"]

Tick = Callable[[int], None]
PhaseFn = Callable[[str, "int | None", str], contextlib.AbstractContextManager[Tick]]
"""``phase(label, total, unit)``: entered while the phase runs; ``total`` is its
count of ``unit`` (``"row"``, ``"user"``) or None when it cannot be counted (then the
display shows the time it has taken); the yielded ``tick(n)`` reports ``n`` more
units done."""

T = TypeVar("T")


@contextlib.contextmanager
def no_phase(label: str, total: int | None, unit: str = "") -> Iterator[Tick]:
    """A phase nobody watches."""
    yield lambda n: None


def ticking(items: Iterable[T], tick: Tick, every: int = 1024) -> Iterator[T]:
    """Yield ``items``, calling ``tick`` every ``every`` items and at the end."""
    n = 0
    for item in items:
        yield item
        n += 1
        if n == every:
            tick(n)
            n = 0
    if n:
        tick(n)
