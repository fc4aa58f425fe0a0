"""Ingestion in small batches: ``signal_batch`` calls of a few signals each.

A producer that sends a few signals a call (a request handler, an async task) pays
each message's fixed cost at the membership shard and at each ledger shard. The
mailboxes hand an actor the signal batches (or one membership shard's attributions)
queued back to back as one message (`tidal_actors.runtime.mailbox.coalesce`), so under
load the fixed cost is paid per run of queued messages, not per call.

Workload: `bench_ingest`'s ``one_hour`` shape (20,000 users in 1-3 of 100 cohorts,
5,000 Zipf entities, 4 types), sent ``--per`` signals a call (default 10) from one
thread, ephemeral, 2 ledger shards, then ``flush()``; beside it, in the same process,
`ingest_baselines.tight_loop` over the same signals. Printed: signals/s and process
CPU microseconds a call for the runtime, signals/s for the loop, and the ratio.
Run: ``python bench/bench_small_batches.py`` (``--signals N``, default 100,000;
``--per K``; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402
from bench_ingest import HOUR, assign_all, spread_workload  # noqa: E402
from ingest_baselines import routes_of, tight_loop  # noqa: E402

from tidal_actors import Config, TidalDb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--signals", type=int, default=100_000)
    ap.add_argument("--per", type=int, default=10, help="signals a signal_batch call")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n, per = args.signals, args.per
    signals, cohorts = spread_workload(n, 20_000, 1)
    calls = [signals[i : i + per] for i in range(0, n, per)]
    best_rate = best_cpu = 0.0
    loop_rate = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        tight_loop(calls, routes_of(cohorts), {t: HOUR for t in range(4)}, HOUR, {}, {}, [])
        loop_rate = max(loop_rate, n / (time.perf_counter() - t0))
        with TidalDb.open(None, config=Config(ledger_shards=2)) as db:
            assign_all(db, cohorts)
            c0, t0 = time.process_time(), time.perf_counter()
            for call in calls:
                db.signal_batch(call)
            db.flush()
            rate = n / (time.perf_counter() - t0)
            cpu = (time.process_time() - c0) / len(calls) * 1e6
        if rate > best_rate:
            best_rate, best_cpu = rate, cpu
    report(
        {
            "signals": n,
            "signals_a_call": per,
            "runtime_signals_per_s": best_rate,
            "runtime_cpu_us_a_call": best_cpu,
            "tight_loop_signals_per_s": loop_rate,
            "runtime_over_tight_loop": best_rate / loop_rate,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
