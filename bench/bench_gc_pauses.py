"""Pauses of a full garbage collection while the runtime ingests, beside plain code.

A full collection of CPython's cyclic GC walks every container object the collector
tracks; the runtime keeps its per-key and per-bucket state in numpy columns and dicts
of ints (which the collector does not track), so its full collections should cost
what the interpreter's own objects cost, whatever the keys and buckets held. This
benchmark ingests `bench_ingest`'s ``day`` shape (keys keep arriving and keep moving
to new buckets: the case that made a tuple-keyed index tracked again) and times
``gc.collect()`` after every 50,000 signals:

* ``runtime``: batched ephemeral ingestion (``signal_batch`` of 1,000, 2 ledger
  shards), the heap frozen (``gc.freeze``) after the set-up, as ``simulate`` does;
* ``runtime_reading``: the same while a thread reads at ``latest`` (point reads and
  top-10s), so the ledger shards publish views throughout;
* ``plain``: `ingest_baselines.tight_loop`, the tight single-threaded dict loop over
  the same signals (its state: dicts keyed by tuples, lists per key, a list of log
  tuples), heap frozen the same way;
* the input (the signals, built before either) is frozen for both.

Printed: the median and the largest pause of each (ms), and the ratio of the
runtime's largest to the plain code's. Run: ``python bench/bench_gc_pauses.py`` (``--signals N``,
default 400,000; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402
from bench_ingest import HOUR, assign_all, spread_workload  # noqa: E402
from ingest_baselines import routes_of, tight_loop  # noqa: E402

from tidal_actors import COMMUNITY, Config, TidalDb  # noqa: E402

EVERY = 50_000  # signals between two timed collections
BATCH = 1_000


def full_collection_ms() -> float:
    """Milliseconds the collector itself ran in a full ``gc.collect()`` (from its
    start callback to its stop callback: a wait for the interpreter lock before it,
    which another thread or the OS scheduler may cause, is not a collection's)."""
    marks: list[float] = []

    def mark(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            marks.append(time.perf_counter())

    gc.callbacks.append(mark)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(mark)
    return (marks[-1] - marks[0]) * 1e3


def runtime_pauses(signals: list, cohorts: dict, reading: bool = False) -> list[float]:  # type: ignore[type-arg]
    """The pauses of full collections while the runtime ingests; with ``reading``, a
    thread reads at ``latest`` meanwhile (point reads and top-10s of the keys
    ingested, a pause of 0.2 ms after each), so the ledgers publish views throughout
    (the reader waits while a collection is timed)."""
    pauses = []
    with TidalDb.open(None, config=Config(ledger_shards=2)) as db:
        assign_all(db, cohorts)
        stop, idle = threading.Event(), threading.Event()
        names = sorted({c for cs in cohorts.values() for c in cs} | {COMMUNITY})
        reads = [0]

        def reader() -> None:
            i = 0
            while not stop.is_set():
                if idle.is_set():
                    time.sleep(0.001)
                    continue
                s = signals[(i * 7919) % len(signals)]
                c = names[i % len(names)]
                db.read_decay_score(c, s.entity_id, s.signal_type, consistency="latest")
                db.top_entities(c, s.signal_type, 10, consistency="latest")
                i += 1
                time.sleep(0.0002)
            reads[0] = 2 * i

        thread = threading.Thread(target=reader, daemon=True)
        gc.collect()
        gc.freeze()
        if reading:
            thread.start()
        for i in range(0, len(signals), BATCH):
            db.signal_batch(signals[i : i + BATCH])
            if (i + BATCH) % EVERY == 0:
                db.flush()
                idle.set()
                time.sleep(0.005)
                pauses.append(full_collection_ms())
                idle.clear()
        if reading:
            stop.set()
            thread.join()
            publications = sum(lg.publications for lg in db._core.ledgers)
            print(f"reader: {reads[0]:,} latest reads, {publications:,} views published")
    return pauses


def plain_pauses(signals: list, cohorts: dict) -> list[float]:  # type: ignore[type-arg]
    routes = routes_of(cohorts)
    half_life = {t: HOUR for t in range(4)}
    state: dict = {}  # type: ignore[type-arg]
    older: dict = {}  # type: ignore[type-arg]
    log: list = []  # type: ignore[type-arg]
    gc.collect()
    gc.freeze()
    pauses = []
    for i in range(0, len(signals), EVERY):
        batches = [signals[j : j + BATCH] for j in range(i, min(i + EVERY, len(signals)), BATCH)]
        tight_loop(batches, routes, half_life, HOUR, state, older, log)
        pauses.append(full_collection_ms())
    return pauses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--signals", type=int, default=400_000)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    signals, cohorts = spread_workload(args.signals, 20_000, 24)
    gc.collect()
    gc.freeze()  # the input, for both
    runtime = runtime_pauses(signals, cohorts)
    reading = runtime_pauses(signals, cohorts, reading=True)
    plain = plain_pauses(signals, cohorts)
    out: dict[str, float] = {
        "signals": args.signals,
        "runtime_median_ms": statistics.median(runtime),
        "runtime_max_ms": max(runtime),
        "runtime_reading_median_ms": statistics.median(reading),
        "runtime_reading_max_ms": max(reading),
        "plain_median_ms": statistics.median(plain),
        "plain_max_ms": max(plain),
    }
    out["runtime_max_over_plain_max"] = out["runtime_max_ms"] / out["plain_max_ms"]
    report(out, args.json)


if __name__ == "__main__":
    main()
