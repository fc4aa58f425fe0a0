"""Memory bounded by the contribution log's cap.

A ledger keeps the detail of a contribution (33 bytes) only while a purge may name
it (in the log, not yet committed to the history); older records live on as sums
per (key, bucket) (`Aggregates.settle`). This benchmark signals ten times the cap
and prints, at 1x, 2x, 5x and 10x the cap in signals:

* settled RSS (after a full collection and ``malloc_trim``) above the RSS before
  the database was opened, the bytes of the ledgers' structures by part
  (``Aggregates.memory``, ``ContributionLog.memory``: RSS adds the allocator's
  arenas, which vary by a few MiB from run to run), the detail rows held and the
  settled buckets;
* the baseline beside it: what the detail rows alone would take had every record
  kept its row (33 bytes x records attributed), and the
  growth of RSS per record attributed between 1x and 10x and between 5x and 10x
  (the keys' settled sums still fill up until about 5x; 0 would be flat);
* persistent, with ``history_retention_ns`` set (5 minutes): the data file after a
  close and ``compact()`` at 1x and at 10x (the snapshot holds the held rows and
  the settled sums, the history only what the retention keeps).

Workload: 20,000 users, each in one or two of 20 cohorts plus ``@community`` (so
2.5 records a signal), 200 Zipf-popular entities, 4 signal types (at most 16,800
keys), batches of 1,000, the 10x signals evenly over 2,000 seconds (inside one
bucket of the default hour) and a history retention of 5 minutes: by 1x the keys
and their buckets are there, so what grows after it is what a record costs.
Memory grows with the keys and their buckets (kept for window reads at any
time), not with the records; the history (and so the file) with the records
inside the retention.

Run: ``python bench/bench_memory.py`` (``--quick``: cap 20,000 instead of 100,000;
``--json FILE`` writes the figures). It signals 10x the cap twice (ephemeral, then
persistent) and 11x more for the data files, and has 20,000 users join their
cohorts three times on a store (a commit each: most of a quick run): ``--quick``
took 2 minutes on an idle 2-core host and up to 5 on a loaded one; the full run
signals 5 times as much. Progress lines (which step, the
records so far, the seconds since the start) go to standard error as it runs; the
figures, grouped under a heading per section saying what they are, to standard
output at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import HOUR, T0, settled_rss, structure_bytes, zipf_entities  # noqa: E402

from tidal_actors import Config, ManualClock, Signal, TidalDb  # noqa: E402

DETAIL_ROW_BYTES = 33
SEC = 10**9
USERS = 20_000


_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """A progress line on standard error (``run_all.py`` shows it as it comes)."""
    print(f"  [{time.perf_counter() - _STARTED:5.0f} s] {message}", file=sys.stderr, flush=True)


def signals(n: int, seed: int = 1) -> list[Signal]:
    rng = random.Random(seed)
    ents = zipf_entities(n, n_entities=200, seed=seed)
    span = 2_000 * SEC
    start = T0 - T0 % HOUR  # the start of an hour: every signal in one bucket
    return [
        Signal(rng.randrange(USERS), ents[i], rng.randrange(4), 1.0, start + i * span // n)
        for i in range(n)
    ]


def join_cohorts(db: TidalDb, tag: str) -> None:
    """Each user joins one or two of 20 cohorts (a progress line every 5,000 users)."""
    for u in range(USERS):
        for j in range(1 + u % 2):
            db.assign_cohort(u, f"c{(u * 7 + j) % 20}")
        if (u + 1) % 5_000 == 0 and u + 1 < USERS:
            progress(f"{tag}: {u + 1:,} of {USERS:,} users joined")


def run(cap: int, path: str | None) -> dict[str, float]:
    n = 10 * cap
    sigs = signals(n)
    cfg = Config(max_contribution_log_entries=cap, rematerialize_after_ms=None)
    clock = ManualClock(sigs[0].timestamp_ns)
    out: dict[str, float] = {}
    rss0 = settled_rss()
    tag = "persistent" if path else "ephemeral"
    db = TidalDb.open(path, config=cfg, clock=clock)
    try:
        progress(
            f"{tag}: {USERS:,} users join their cohorts (one call each, a commit each on a store)"
        )
        join_cohorts(db, tag)
        done = 0
        records = 0
        for mult in (1, 2, 5, 10):
            upto = mult * cap
            progress(
                f"{tag}: signalling up to {mult}x the cap ({upto:,} signals; {records:,} "
                "records so far)"
            )
            for lo in range(done, upto, 1_000):
                db.signal_batch(sigs[lo : min(lo + 1_000, upto)])
            done = upto
            clock.set(sigs[upto - 1].timestamp_ns)
            db.flush()
            st = db.stats()
            records = st["records_in"]
            out[f"{tag}_{mult}x_records"] = records
            out[f"{tag}_{mult}x_rss_mib"] = (settled_rss() - rss0) / 2**20
            out[f"{tag}_{mult}x_detail_rows_held"] = st["detail_rows"]
            out[f"{tag}_{mult}x_settled_buckets"] = st["settled_buckets"]
            parts = structure_bytes(db)
            for part, nb in parts.items():
                out[f"{tag}_{mult}x_{part}_mib"] = nb / 2**20
            out[f"{tag}_{mult}x_structures_mib"] = sum(parts.values()) / 2**20
            out[f"{tag}_{mult}x_baseline_all_rows_mib"] = DETAIL_ROW_BYTES * records / 2**20

        for a, b in ((1, 10), (5, 10)):
            added = out[f"{tag}_{b}x_records"] - out[f"{tag}_{a}x_records"]
            for what in ("rss", "structures"):
                grown = out[f"{tag}_{b}x_{what}_mib"] - out[f"{tag}_{a}x_{what}_mib"]
                out[f"{tag}_{what}_bytes_per_record_{a}x_to_{b}x"] = grown * 2**20 / added
        out[f"{tag}_baseline_bytes_per_record"] = DETAIL_ROW_BYTES
    finally:
        db.close()
    return out


def data_file(cap: int, mult: int, path: str) -> float:
    """MiB of data.mdb after ``mult`` x the cap in signals, a close, and ``compact()``
    (retention 5 minutes: the history keeps only the last 5 minutes of signals)."""
    sigs = signals(10 * cap)[: mult * cap]
    cfg = Config(
        max_contribution_log_entries=cap,
        rematerialize_after_ms=None,
        history_retention_ns=300 * SEC,
    )
    clock = ManualClock(sigs[-1].timestamp_ns)
    progress(f"data file at {mult}x the cap: {len(sigs):,} signals, a close, compact()")
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        join_cohorts(db, f"data file at {mult}x")
        for lo in range(0, len(sigs), 1_000):
            db.signal_batch(sigs[lo : lo + 1_000])
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.compact()
    return os.path.getsize(os.path.join(path, "data.mdb")) / 2**20


def sections(out: dict[str, float]) -> list[tuple[str, list[str]]]:
    """The figures' keys grouped, each group under a line saying what its numbers are."""
    groups: list[tuple[str, list[str]]] = [("the contribution log's cap (records)", ["log_cap"])]
    for tag in ("ephemeral", "persistent"):
        groups.append(
            (
                f"{tag}: after 1x, 2x, 5x and 10x the cap in signals: records attributed; "
                "*_rss_mib MiB of RSS above the start (settled); *_mib the ledgers' structures "
                "by part, MiB; detail rows held; settled buckets; baseline: 33 B a record, MiB",
                [
                    k
                    for k in out
                    if k.startswith(f"{tag}_")
                    and k[len(tag) + 1].isdigit()
                    and "data_file" not in k
                ],
            )
        )
        groups.append(
            (
                f"{tag}: growth in bytes per record attributed, from 1x and from 5x to 10x "
                "(RSS, the structures; 0 would be flat), beside the baseline's 33",
                [k for k in out if k.startswith(f"{tag}_") and "per_record" in k],
            )
        )
    groups.append(
        (
            "data file (MiB of data.mdb) after a close and compact(), history retention 5 minutes",
            [k for k in out if "data_file" in k],
        )
    )
    return groups


def print_sections(out: dict[str, float]) -> None:
    width = max(len(k) for k in out)
    for heading, keys in sections(out):
        print(f"-- {heading}")
        for k in keys:
            v = out[k]
            print(
                f"   {k:<{width}}  {v:,.2f}" if isinstance(v, float) else f"   {k:<{width}}  {v:,}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="cap 20,000 (2-5 minutes on 2 cores)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    cap = 20_000 if args.quick else 100_000
    out: dict[str, float] = {"log_cap": cap}
    tmp = tempfile.mkdtemp(prefix="tidal-bench-mem-")
    try:
        out.update(run(cap, None))
        out.update(run(cap, os.path.join(tmp, "store")))
        for mult in (1, 10):
            out[f"persistent_{mult}x_data_file_after_compact_mib"] = data_file(
                cap, mult, os.path.join(tmp, f"f{mult}")
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_sections(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
