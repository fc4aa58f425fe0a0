"""Event-loop lateness with many tasks sending signals, under trio and asyncio.

2,000 tasks each loop ``await db.signal_with_context(...)`` for ``--seconds`` while a
ticker task sleeps 1 ms at a time and records how late each wake-up is; the baseline
is the same tasks doing bare checkpoints (``sleep(0)``) instead, in the same run. Also
reported: the longest single task step while sending (the longest the loop was held
by one facade call and the loop body around it; trio: an ``Instrument``, asyncio: each
task's coroutine stepped through a timing wrapper), and the signals sent.

Run: ``python bench/bench_loop_lateness.py [--tasks 2000] [--seconds 2] [--json]``.
Figures on a shared 2-core machine are noisy; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import trio

from tidal_actors import ManualClock, open_tidal

T0 = 10**18
TICK_S = 0.001


class _StepTimer(trio.abc.Instrument):
    def __init__(self) -> None:
        self.started = 0.0
        self.longest = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.longest = max(self.longest, time.perf_counter() - self.started)


class _Timed:
    """Steps a coroutine, timing each step (one asyncio task step each)."""

    longest = 0.0

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        exc: BaseException | None = None
        while True:
            start = time.perf_counter()
            try:
                out = self.coro.throw(exc) if exc is not None else self.coro.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                _Timed.longest = max(_Timed.longest, time.perf_counter() - start)
            exc = None
            try:
                value = yield out
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine
                exc = e


async def _ticker(now: Callable[[], float], sleep: Callable[[float], Any], stop_at: float) -> float:
    worst = 0.0
    while now() < stop_at:
        due = now() + TICK_S
        await sleep(TICK_S)
        worst = max(worst, now() - due)
    return worst


def _worker_body(
    mode: str, db: Any, k: int, sleep0: Callable[[], Any], stop: list[bool]
) -> Coroutine[Any, Any, int]:
    async def send() -> int:
        n = 0
        while not stop[0]:
            await db.signal_with_context(k, n % 100, 1, 1.0)
            n += 1
        return n

    async def bare() -> int:
        n = 0
        while not stop[0]:
            await sleep0()
            n += 1
        return n

    return send() if mode == "signals" else bare()


def run_trio(mode: str, tasks: int, seconds: float) -> dict[str, float]:
    timer = _StepTimer()
    counts: list[int] = []

    async def main() -> float:
        async with open_tidal(None, clock=ManualClock(T0)) as db:
            stop = [False]

            async def worker(k: int) -> None:
                counts.append(await _worker_body(mode, db, k, lambda: trio.sleep(0), stop))

            async with trio.open_nursery() as nursery:
                for k in range(tasks):
                    nursery.start_soon(worker, k)
                await trio.sleep(0.05)
                timer.longest = 0.0
                worst = await _ticker(time.perf_counter, trio.sleep, time.perf_counter() + seconds)
                stop[0] = True
            return worst

    worst = trio.run(main, instruments=[timer])
    return {
        "worst_tick_late_ms": worst * 1e3,
        "longest_step_ms": timer.longest * 1e3,
        "calls": sum(counts),
    }


def run_asyncio(mode: str, tasks: int, seconds: float) -> dict[str, float]:
    counts: list[int] = []

    async def main() -> float:
        async with open_tidal(None, clock=ManualClock(T0)) as db:
            stop = [False]

            async def worker(k: int) -> None:
                counts.append(
                    await _Timed(_worker_body(mode, db, k, lambda: asyncio.sleep(0), stop))
                )

            async with asyncio.TaskGroup() as group:
                for k in range(tasks):
                    group.create_task(worker(k))
                await asyncio.sleep(0.05)
                _Timed.longest = 0.0
                worst = await _ticker(
                    time.perf_counter, asyncio.sleep, time.perf_counter() + seconds
                )
                stop[0] = True
            return worst

    worst = asyncio.run(main())
    return {
        "worst_tick_late_ms": worst * 1e3,
        "longest_step_ms": _Timed.longest * 1e3,
        "calls": sum(counts),
    }


def measure(tasks: int, seconds: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for loop, fn in (("trio", run_trio), ("asyncio", run_asyncio)):
        for mode in ("checkpoints", "signals"):
            out[f"{loop} {mode}"] = fn(mode, tasks, seconds)
        base = out[f"{loop} checkpoints"]["worst_tick_late_ms"]
        out[f"{loop} signals"]["lateness_vs_checkpoints"] = out[f"{loop} signals"][
            "worst_tick_late_ms"
        ] / max(base, 1e-9)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--quick", action="store_true", help="1 s per row")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 1.0
    res = measure(args.tasks, args.seconds)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.tasks} tasks, {args.seconds:g} s each (noisy shared machine)")
    print(
        f"{'':24} {'worst tick late ms':>19} {'longest step ms':>16} {'calls':>10} {'vs bare':>8}"
    )
    for name, r in res.items():
        ratio = r.get("lateness_vs_checkpoints")
        print(
            f"{name:24} {r['worst_tick_late_ms']:19.1f} {r['longest_step_ms']:16.2f} {int(r['calls']):10d} "
            f"{'' if ratio is None else f'{ratio:.2f}x':>8}"
        )


if __name__ == "__main__":
    main()
