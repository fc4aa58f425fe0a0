"""Trio facade benchmarks: the cost of one awaited call beside the same
blocking call, and awaited throughput with 100 concurrent tasks.

Run: ``python bench/bench_aio.py`` (``--quick`` for a smaller run). Each figure is the
median of ``--repeats`` rounds; the blocking and awaited rounds alternate, on the same
kind of database (ephemeral, default config, a manual clock), so their ratio holds on
a noisy machine. Operations: ``cohorts_of`` (a round trip to a membership shard) and
``read_decay_score`` (a barrier through the membership shard to a ledger shard).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from tidal_actors import COMMUNITY, ManualClock, TidalDb, open_tidal

T0 = 10**18


def blocking_round(db: TidalDb, op: str, calls: int) -> float:
    """Seconds per call, one caller thread."""
    fn: Callable[[int], Any] = (
        db.cohorts_of
        if op == "cohorts_of"
        else (lambda i: db.read_decay_score(COMMUNITY, i % 50, 1))
    )
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


async def awaited_round(db: Any, op: str, calls: int, tasks: int) -> float:
    """Seconds per call (wall time / calls) with ``tasks`` tasks sharing ``calls``."""
    fn: Callable[[int], Awaitable[Any]] = (
        db.cohorts_of
        if op == "cohorts_of"
        else (lambda i: db.read_decay_score(COMMUNITY, i % 50, 1))
    )
    per_task = calls // tasks

    async def worker(k: int) -> None:
        for i in range(per_task):
            await fn(k * per_task + i)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(worker, k)
    return (time.perf_counter() - start) / (per_task * tasks)


async def main(calls: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for op in ("cohorts_of", "read_decay_score"):
        blocking: list[float] = []
        one_task: list[float] = []
        hundred: list[float] = []
        for _ in range(repeats):
            with TidalDb.open(clock=ManualClock(T0)) as sdb:
                sdb.signal_with_context(1, 1, 1, 1.0)
                blocking_round(sdb, op, calls // 10)  # warm-up
                blocking.append(blocking_round(sdb, op, calls))
            async with open_tidal(clock=ManualClock(T0)) as adb:
                await adb.signal_with_context(1, 1, 1, 1.0)
                await awaited_round(adb, op, calls // 10, 1)  # warm-up
                one_task.append(await awaited_round(adb, op, calls, 1))
                hundred.append(await awaited_round(adb, op, calls, 100))
        b, a1, a100 = (statistics.median(x) for x in (blocking, one_task, hundred))
        results[op] = {
            "blocking_us_per_call": round(b * 1e6, 1),
            "awaited_us_per_call": round(a1 * 1e6, 1),
            "awaited_over_blocking": round(a1 / b, 2),
            "blocking_calls_per_s": round(1 / b),
            "awaited_calls_per_s_1_task": round(1 / a1),
            "awaited_calls_per_s_100_tasks": round(1 / a100),
            "throughput_100_tasks_over_1_task": round(a1 / a100, 2),
            "throughput_100_tasks_over_blocking": round(b / a100, 2),
        }
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"{'operation':<18} {'blocking':>12} {'awaited':>12} {'ratio':>6} "
        f"{'1 task':>10} {'100 tasks':>10} {'x1 task':>8} {'xblocking':>9}"
    )
    print(f"{'':<18} {'us/call':>12} {'us/call':>12} {'':>6} {'calls/s':>10} {'calls/s':>10}")
    for op, r in results.items():
        print(
            f"{op:<18} {r['blocking_us_per_call']:>12} {r['awaited_us_per_call']:>12} "
            f"{r['awaited_over_blocking']:>6} {r['awaited_calls_per_s_1_task']:>10} "
            f"{r['awaited_calls_per_s_100_tasks']:>10} {r['throughput_100_tasks_over_1_task']:>8} "
            f"{r['throughput_100_tasks_over_blocking']:>9}"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="trio facade benchmarks")
    ap.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    calls, repeats = (1000, 3) if args.quick else (args.calls, args.repeats)
    res = trio.run(main, calls, repeats)
    report(res)
    if args.json:
        print(json.dumps(res, indent=2))
