"""Memory per retained contribution record at 5M, on issue 16's ingestion shapes.

Run: ``python bench/bench_record_memory.py`` (``--quick``: 500,000 records;
``--records N``; ``--json FILE`` writes every figure). For each shape of
`bench_ingest` (``one_hour``: 20,000 users in 1-3 of 100 cohorts, 5,000 Zipf
entities, 4 types, 3.0 records a signal, one hourly bucket; ``day``: the same over
24 hours, so keys keep opening buckets), signals enough for ``--records`` records
(the contribution log's cap is set to hold all of them) go, in batches of 1,000,
through three contenders, each in a fresh child process (fork) so that one's heap
never counts for another:

- ``runtime``: an ephemeral `TidalDb` (``signal_batch``, then ``flush``); figures:
  settled RSS (after a full collection and ``malloc_trim``) above the RSS before the
  database opened, per record in the log (``stats()["log_records"]``), and the
  ledgers' structures by part (`Aggregates.memory`, `ContributionLog.memory`: the
  bytes in use, not the spare capacity the allocator and ``array.array`` keep);
- ``vector_fold``: `ingest_baselines.VectorFold` (columnar key state, older buckets
  and log: a bound for the same fold's bytes, holding no detail rows, pair index or
  per-bucket decayed sums), its settled RSS above its start per record;
- ``tight_loop``: `ingest_baselines.tight_loop`'s dicts and a tuple a record, the
  same.

The signals are built in the parent before any child starts, so no contender's
figure includes them. Issue 16's target: at most 64 B of settled RSS per retained
record at 5M on ``one_hour``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import report, settled_rss, structure_bytes  # noqa: E402
from bench_ingest import BATCH, HOUR, fold_all, spread_workload  # noqa: E402
from ingest_baselines import VectorFold, routes_of, tight_loop  # noqa: E402

from tidal_actors import Config, Signal, TidalDb  # noqa: E402

Cohorts = dict[int, tuple[str, ...]]
RECORDS_A_SIGNAL = 3.0  # one_hour and day: users in 1-3 cohorts, plus @community

_SHARED: dict[str, Any] = {}  # the parent's signals, inherited by each forked child


def half_lives() -> dict[int, int]:
    """Signal type -> half-life (ns) as the default `Config` sets them."""
    return {t: Config().half_life_for(t) for t in range(4)}


def runtime_child(records: int) -> dict[str, float]:
    batches: Sequence[list[Signal]] = _SHARED["batches"]
    cohorts: Cohorts = _SHARED["cohorts"]
    rss0 = settled_rss()
    cfg = Config(max_contribution_log_entries=records + records // 10)
    with TidalDb.open(None, config=cfg) as db:
        for user, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(user, c)
        for b in batches:
            db.signal_batch(b)
        db.flush()
        held = db.stats()["log_records"]
        rss = settled_rss() - rss0
        parts = structure_bytes(db)
    out = {"records": float(held), "rss_bytes_a_record": rss / held}
    out["structures_bytes_a_record"] = sum(parts.values()) / held
    for part, n in sorted(parts.items()):
        out[f"structure_{part}_bytes_a_record"] = n / held
    return out


def vector_fold_child(records: int) -> dict[str, float]:
    batches: Sequence[list[Signal]] = _SHARED["batches"]
    cohorts: Cohorts = _SHARED["cohorts"]
    rss0 = settled_rss()
    fold = VectorFold(cohorts, half_lives(), HOUR)
    fold_all(fold, batches)
    held = sum(len(chunk[0]) for chunk in fold.log_chunks)
    return {"records": float(held), "rss_bytes_a_record": (settled_rss() - rss0) / held}


def tight_loop_child(records: int) -> dict[str, float]:
    batches: Sequence[list[Signal]] = _SHARED["batches"]
    cohorts: Cohorts = _SHARED["cohorts"]
    rss0 = settled_rss()
    state: dict[Any, list[Any]] = {}
    older: dict[Any, tuple[int, float]] = {}
    log: list[tuple[int, str, int, int, float, int]] = []
    tight_loop(batches, routes_of(cohorts), half_lives(), HOUR, state, older, log)
    return {"records": float(len(log)), "rss_bytes_a_record": (settled_rss() - rss0) / len(log)}


def in_child(fn: Callable[[int], dict[str, float]], records: int) -> dict[str, float]:
    """``fn(records)`` in a forked child process; its figures."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, (records,))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=5_000_000, help="records to retain (default 5M)")
    ap.add_argument("--quick", action="store_true", help="500,000 records")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    records = 500_000 if args.quick else args.records
    if records < 10_000:
        ap.error(f"--records must be >= 10000, got {records}")
    n_signals = int(records / RECORDS_A_SIGNAL)
    out: dict[str, float] = {}
    for shape, hours in (("one_hour", 1), ("day", 24)):
        print(f"{shape}: building {n_signals:,} signals", file=sys.stderr, flush=True)
        signals, cohorts = spread_workload(n_signals, 20_000, hours)
        _SHARED["batches"] = [signals[i : i + BATCH] for i in range(0, len(signals), BATCH)]
        _SHARED["cohorts"] = cohorts
        for name, fn in (
            ("runtime", runtime_child),
            ("vector_fold", vector_fold_child),
            ("tight_loop", tight_loop_child),
        ):
            print(f"  {name}", file=sys.stderr, flush=True)
            for k, v in in_child(fn, records).items():
                out[f"{shape}_{name}_{k}"] = v
        held = {out[f"{shape}_{name}_records"] for name in ("runtime", "vector_fold", "tight_loop")}
        expect = sum(len(cohorts.get(s.user_id, ())) + 1 for s in signals)
        if held != {expect}:
            raise SystemExit(f"{shape}: records held {sorted(held)}, expected {expect} each")
        for base in ("vector_fold", "tight_loop"):
            out[f"{shape}_runtime_rss_per_{base}"] = (
                out[f"{shape}_runtime_rss_bytes_a_record"]
                / out[f"{shape}_{base}_rss_bytes_a_record"]
            )
    report(out, args.json)


if __name__ == "__main__":
    main()
