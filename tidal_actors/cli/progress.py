"""Progress bars of the command line (tqdm, on standard error, only on a terminal).

Owns `phase_bars`: a `phases.PhaseFn` drawing one bar per phase of ``simulate``
(set-up, the run, the reference model, the check, closing and reopening the store),
so that no phase longer than a second passes in silence. A phase that cannot be
counted shows the seconds it has taken, redrawn four times a second by a thread of
its own, which stops with the phase. And `read_bar` with `with_progress`: the bar of
a log being read by ``replay`` (its bytes, the rows so far beside them).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tidal_actors.loadsim.phases import PhaseFn, Tick

if TYPE_CHECKING:  # tqdm is imported by the first bar: `tidal-actors --help` draws none
    from tqdm import tqdm

    from tidal_actors.eventlog.log import EventRow

__all__ = ["bar", "phase_bars", "read_bar", "with_progress"]

_PROGRESS_EVERY = 1024  # rows between progress-bar updates


def bar(total: int | None, unit: str, quiet: bool, desc: str) -> tqdm[Any]:
    """A bar on standard error, left off when ``quiet`` or not on a terminal."""
    # a phase that cannot be counted shows the time it has taken; counts below 100k
    # read best as they are (tqdm's unit scale writes 3 as 3.00)
    fmt = "{desc}: {elapsed}" if total is None else None
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=total is not None and total >= 100_000,
        desc=desc,
        file=sys.stderr,
        bar_format=fmt,
        disable=quiet or not sys.stderr.isatty(),
        leave=False,
        dynamic_ncols=True,
    )


def phase_bars(quiet: bool, prefix: str = "") -> PhaseFn:
    """One bar per phase, labelled ``prefix + label``."""

    @contextlib.contextmanager
    def phase(label: str, total: int | None, unit: str = "") -> Iterator[Tick]:
        with bar(total, unit or "it", quiet, prefix + label) as b:
            stop = threading.Event()
            lock = threading.Lock()

            def redraw() -> None:  # a bar with nothing to count still shows time passing
                while not stop.wait(0.25):
                    with lock:
                        b.refresh()

            ticker = None
            if not b.disable:
                ticker = threading.Thread(target=redraw, name="tidal-progress", daemon=True)
                ticker.start()

            def tick(n: int) -> None:
                with lock:
                    b.update(n)

            try:
                yield tick
            finally:
                stop.set()
                if ticker is not None:
                    ticker.join()

    return phase


def read_bar(total: int, unit: str, quiet: bool, desc: str) -> tqdm[Any]:
    """A bar of ``total`` units (a file's bytes) on standard error, scaled (kB, MB),
    left off when ``quiet`` or not on a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        disable=quiet or not sys.stderr.isatty(),
        leave=False,
        dynamic_ncols=True,
    )


def with_progress(
    rows: Iterable[EventRow], bar: tqdm[Any], position: Callable[[], int] | None = None
) -> Iterator[EventRow]:
    """Yield ``rows``, moving ``bar`` every few rows (to ``position()``, the bytes of
    the file read, or by count) and showing the rows so far beside it."""
    n = 0
    for row in rows:
        yield row
        n += 1
        if n % _PROGRESS_EVERY == 0:
            bar.set_postfix_str(f"{n:,} rows", refresh=False)
            bar.update((position() if position else n) - bar.n)
    bar.set_postfix_str(f"{n:,} rows", refresh=False)
    bar.update((position() if position else n) - bar.n)
