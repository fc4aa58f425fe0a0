"""Control operations under full ingestion: leave and purge latency, idle and while one
thread ingests as fast as it can, ephemeral and persistent; ingestion throughput with
and without the control traffic; persistent assigns per second from 16 callers
against one (group commit).

Set-up: ``--users`` users (20,000) in 1-3 of 100 cohorts, assigned from 16 threads.
Ingestion: one thread calls ``signal_batch`` with batches of 1,000 signals of random
users. Control: another thread, for ``--ops`` users in turn, leaves (timed), rejoins,
and purges the user's first cohort (timed), pausing 2 ms between users. Each figure
of one run sits beside its baseline from the same run (idle beside loaded, ingestion
without beside with control traffic); the machine is shared, so figures are noisy.

Run: ``python bench/bench_control.py [--users 20000] [--ops 200] [--seconds 4] [--json FILE]``
(``--quick``: 5,000 users, 60 operations; ``--assigns-only --rounds 5``: the assigns
alone, 16 and 1 callers alternating, medians of the rates and of the process CPU per
assign).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from typing import Any

from tidal_actors import Config, Signal, TidalDb


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def cohorts_of(u: int) -> list[str]:
    r = random.Random(u)
    return [f"c{k}" for k in r.sample(range(100), 1 + u % 3)]


def assign_all(db: TidalDb, users: int, callers: int, cpu: list[float] | None = None) -> float:
    """Assign every user its cohorts from ``callers`` threads; assigns per second.
    ``cpu``: gets the process's CPU seconds (every thread's) over the assigns."""
    # each caller's (user, cohort) pairs, built before the clock starts
    plans = [
        [(u, c) for u in range(k, users, callers) for c in cohorts_of(u)] for k in range(callers)
    ]
    n = sum(map(len, plans))

    def work(k: int) -> None:
        assign = db.assign_cohort
        for u, c in plans[k]:
            assign(u, c)

    start = time.perf_counter()
    cpu_start = time.process_time()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if cpu is not None:
        cpu.append(time.process_time() - cpu_start)
    return n / (time.perf_counter() - start)


def control_round(db: TidalDb, users: int, ops: int, seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    leaves: list[float] = []
    purges: list[float] = []
    for _ in range(ops):
        u = rng.randrange(users)
        t = time.perf_counter()
        db.leave_community_layer(u)
        leaves.append(time.perf_counter() - t)
        db.rejoin_community_layer(u)
        t = time.perf_counter()
        db.request_community_purge(u, cohorts_of(u)[0])
        purges.append(time.perf_counter() - t)
        time.sleep(0.002)
    return leaves, purges


def ingest(db: TidalDb, users: int, stop: threading.Event, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    batches = [
        [Signal(rng.randrange(users), rng.randrange(5000), 1, 1.0) for _ in range(1000)]
        for _ in range(20)
    ]
    n = 0
    start = time.perf_counter()
    while not stop.is_set():
        db.signal_batch(batches[n % 20])
        n += 1
    return n * 1000, time.perf_counter() - start


def loaded(db: TidalDb, users: int, ops: int, seconds: float, with_control: bool) -> dict[str, Any]:
    stop = threading.Event()
    out: dict[str, Any] = {}

    def run_ingest() -> None:
        out["signals"], out["seconds"] = ingest(db, users, stop, 7)

    t = threading.Thread(target=run_ingest)
    t.start()
    time.sleep(0.5)  # the mailboxes fill
    if with_control:
        out["leaves"], out["purges"] = control_round(db, users, ops, 3)
    else:
        time.sleep(seconds)
    stop.set()
    t.join()
    db.flush()
    out["rate"] = out["signals"] / out["seconds"]
    return out


def measure(
    path: str | None, users: int, ops: int, seconds: float, layout: str | None = None
) -> dict[str, float]:
    """The figures of one database (``layout``: `Config.store_layout`)."""
    res: dict[str, float] = {}
    config = Config(rematerialize_after_ms=None, store_layout=layout)
    with TidalDb.open(path, config=config) as db:
        res["assigns_per_s_16_callers"] = assign_all(db, users, 16)
        leaves, purges = control_round(db, users, ops, 1)
        res["leave_idle_p50_ms"], res["leave_idle_p99_ms"] = pct(leaves, 0.5), pct(leaves, 0.99)
        res["purge_idle_p50_ms"], res["purge_idle_p99_ms"] = pct(purges, 0.5), pct(purges, 0.99)
        plain = loaded(db, users, ops, seconds, False)
        busy = loaded(db, users, ops, seconds, True)
        res["leave_loaded_p50_ms"], res["leave_loaded_p99_ms"] = (
            pct(busy["leaves"], 0.5),
            pct(busy["leaves"], 0.99),
        )
        res["purge_loaded_p50_ms"], res["purge_loaded_p99_ms"] = (
            pct(busy["purges"], 0.5),
            pct(busy["purges"], 0.99),
        )
        res["ingest_signals_per_s"] = plain["rate"]
        res["ingest_with_control_signals_per_s"] = busy["rate"]
    res["leave_p99_loaded_vs_idle"] = res["leave_loaded_p99_ms"] / res["leave_idle_p99_ms"]
    res["purge_p99_loaded_vs_idle"] = res["purge_loaded_p99_ms"] / res["purge_idle_p99_ms"]
    res["ingest_with_vs_without_control"] = (
        res["ingest_with_control_signals_per_s"] / res["ingest_signals_per_s"]
    )
    return res


def assigns_one_vs_16(path: str, users: int, rounds: int = 1) -> dict[str, float]:
    """Assigns per second and process CPU per assign (µs), 1 and 16 callers, each on a
    fresh store; with ``rounds`` > 1 the two alternate and the medians are given.
    Under load the rates follow the host; the CPU per assign is what to compare."""
    n = sum(len(cohorts_of(u)) for u in range(users))
    rates: dict[int, list[float]] = {1: [], 16: []}
    cpus: dict[int, list[float]] = {1: [], 16: []}
    for r in range(rounds):
        for callers in (16, 1):
            with TidalDb.open(os.path.join(path, f"assign-{callers}-{r}")) as db:
                rates[callers].append(assign_all(db, users, callers, cpus[callers]))
    out: dict[str, float] = {}
    for callers in (1, 16):
        out[f"assigns_per_s_{callers}_callers"] = statistics.median(rates[callers])
        out[f"cpu_us_per_assign_{callers}_callers"] = statistics.median(cpus[callers]) / n * 1e6
    out["assigns_16_vs_1"] = out["assigns_per_s_16_callers"] / out["assigns_per_s_1_callers"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument(
        "--assign-users", type=int, default=1_000, help="users for the 1-vs-16 callers assign rate"
    )
    ap.add_argument("--rounds", type=int, default=1, help="rounds of 16 then 1 assign callers")
    ap.add_argument("--assigns-only", action="store_true", help="only the 1-vs-16 callers assigns")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--quick", action="store_true", help="5,000 users, 60 operations, 2 s")
    args = ap.parse_args()
    if args.quick:
        args.users, args.ops, args.seconds, args.assign_users = 5_000, 60, 2.0, 300
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-control-") as tmp:
        if not args.assigns_only:
            out["ephemeral"] = measure(None, args.users, args.ops, args.seconds)
            out["persistent"] = measure(os.path.join(tmp, "p"), args.users, args.ops, args.seconds)
        out["group_commit"] = assigns_one_vs_16(tmp, args.assign_users, args.rounds)
    for kind, figures in out.items():
        print(kind)
        for k, v in figures.items():
            print(f"  {k:36} {v:12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
