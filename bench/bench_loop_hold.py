"""Where the trio loop's time goes while 2,000 tasks send signals: inside the facade's
calls, in garbage collection, or off the loop's thread.

2,000 tasks each loop ``await db.signal_with_context(...)`` (ephemeral store) for
``--seconds`` while a ticker sleeps 1 ms at a time; ``--bare``: the same tasks doing
bare checkpoints (``trio.sleep(0)``). Reported: the worst tick lateness; the loop
thread's wall and CPU time (CPU well under wall: the thread waited for the
interpreter lock or for a core); for each synchronous part of the signal call
(``Core.shards_to_wait_for``, ``Core.signal_with_context``) the calls, their wall
and CPU time in total, the longest and how many took over 1 ms; and the garbage
collections while the ticker runs (``gc.callbacks``): how many, their total and the
longest. The loop thread's times and the calls' cover the whole run (opening and
closing too).

Run: ``python bench/bench_loop_hold.py [--seconds 1] [--bare]``; run it with and
without ``--bare`` one after the other, the host's load beside the figures.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import trio

from tidal_actors import ManualClock, open_tidal
from tidal_actors.runtime.engine import Core

T0 = 10**18
SEC = 10**9


class _Timed:
    """Wall and CPU time (s) spent in one method of `Core`, wrapped in place."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = self.over_1ms = 0
        self.wall = self.cpu = self.longest = 0.0
        real: Callable[..., Any] = getattr(Core, name)

        def timed(core: Core, *args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return real(core, *args, **kwargs)
            finally:
                dw = time.perf_counter() - w
                self.calls += 1
                self.wall += dw
                self.cpu += time.thread_time() - c
                self.longest = max(self.longest, dw)
                self.over_1ms += dw > 0.001

        setattr(Core, name, timed)


class _Collections:
    """Garbage collections seen through ``gc.callbacks``: count, total and longest (s)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = self.longest = 0.0
        self._start = 0.0
        self.on = False  # counting (only while the ticker runs)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        if not self.on:
            return
        d = time.perf_counter() - self._start
        self.count += 1
        self.total += d
        self.longest = max(self.longest, d)


async def _run(tasks: int, seconds: float, bare: bool, collections: _Collections) -> float:
    """Worst tick lateness (s) of a 1 ms ticker while ``tasks`` tasks send or yield."""
    async with open_tidal(None, clock=ManualClock(T0)) as db:
        stop = trio.Event()
        late = 0.0

        async def ticker() -> None:
            nonlocal late
            while not stop.is_set():
                start = time.perf_counter()
                await trio.sleep(0.001)
                late = max(late, time.perf_counter() - start - 0.001)

        async def sender(user: int) -> None:
            k = 0
            while not stop.is_set():
                if bare:
                    await trio.sleep(0)
                else:
                    await db.signal_with_context(user, k % 50, 1, 1.0, T0 - SEC)
                k += 1

        async with trio.open_nursery() as nursery:
            for user in range(tasks):
                nursery.start_soon(sender, user)
            await trio.sleep(0.05)  # every task started before the ticker runs
            nursery.start_soon(ticker)
            collections.on = True
            await trio.sleep(seconds)
            collections.on = False
            stop.set()
        return late


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--bare", action="store_true", help="bare checkpoints instead of signals")
    args = ap.parse_args()
    parts = [_Timed("shards_to_wait_for"), _Timed("signal_with_context")]
    collections = _Collections()
    wall, cpu = time.perf_counter(), time.thread_time()
    late = trio.run(_run, args.tasks, args.seconds, args.bare, collections)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    kind = "bare checkpoints" if args.bare else "signals"
    print(f"{args.tasks} tasks, {kind}, {args.seconds:g} s")
    print(f"  worst tick late {late * 1e3:.1f} ms")
    print(f"  loop thread: wall {wall:.2f} s, CPU {cpu:.2f} s")
    for p in parts:
        if p.calls:
            print(
                f"  {p.name:20} {p.calls} calls: wall {p.wall * 1e3:.0f} ms, CPU "
                f"{p.cpu * 1e3:.0f} ms, longest {p.longest * 1e3:.1f} ms, "
                f"{p.over_1ms} over 1 ms"
            )
    print(
        f"  gc: {collections.count} collections, {collections.total * 1e3:.0f} ms, "
        f"longest {collections.longest * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
