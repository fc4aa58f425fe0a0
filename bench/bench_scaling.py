"""Scaling benchmarks: how the cost grows, each figure beside a plain
single-threaded baseline doing the same work in the same process and run.

* Ingestion (``signal_batch``, ephemeral) at 10k, 100k and 1M users, beside
  `bench_core.simple_loop` (the same fan-out: forward-decayed score, bucketed window,
  one contribution record per cohort; a plainly written loop, not the tight loop of
  ``bench_ingest.py``). Ratio = runtime rate / simple loop rate.
* Purge latency of a user's 1,000 contributions with the log at 50k, 500k and 5M
  records, beside a plain purge (a dict of each user's records, subtracted from plain
  score and bucket dicts). Ratio = plain latency / runtime latency.
* Restore time of a store holding 100k, 1M and 5M contributions: after a clean close
  (from the snapshot) and after a crash (no snapshot: the durable history is replayed),
  beside a plain rebuild of the same aggregates from the same records held in memory.
  Ratio = plain seconds / restore seconds.

Run: ``python bench/bench_scaling.py`` (``--quick``: the two smaller sizes of each, and
fewer signals; ``--json FILE`` writes the figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import HOUR, T0, cohorts_for, simple_loop, workload, zipf_entities  # noqa: E402

from tidal_actors import Config, Signal, TidalDb  # noqa: E402

HALF_LIFE = 7 * 24 * HOUR


def assign_all(db: TidalDb, cohorts: dict[int, tuple[str, ...]]) -> float:
    """Every user joins its cohorts; 16 callers at once (group commit). Seconds."""
    t = time.perf_counter()

    def join(item: tuple[int, tuple[str, ...]]) -> None:
        for c in item[1]:
            db.assign_cohort(item[0], c)

    with ThreadPoolExecutor(16) as pool:
        for _ in pool.map(join, cohorts.items(), chunksize=256):
            pass
    return time.perf_counter() - t


# ---------------------------------------------------------------- ingestion


def ingestion(users: int, n_signals: int, repeats: int) -> dict[str, Any]:
    """Batched ephemeral ingestion with ``users`` users beside the simple loop (medians
    of ``repeats`` alternating rounds, each on a fresh database)."""
    signals = workload(n_signals, users, seed=users)
    cohorts = cohorts_for(users)
    rates, bases, setup = [], [], 0.0
    for _ in range(repeats):
        bases.append(simple_loop(signals, cohorts))
        with TidalDb.open(config=Config(ledger_shards=2)) as db:
            setup = assign_all(db, cohorts)
            t = time.perf_counter()
            for k in range(0, n_signals, 10_000):
                db.signal_batch(
                    [Signal(u, e, ty, w, ts) for u, e, ty, w, ts in signals[k : k + 10_000]]
                )
            db.flush()
            rates.append(n_signals / (time.perf_counter() - t))
        gc.collect()
    ratios = [r / b for r, b in zip(rates, bases)]
    return {
        "users": users,
        "signals": n_signals,
        "assign_setup_s": setup,
        "runtime_signals_per_s": statistics.median(rates),
        "simple_loop_signals_per_s": statistics.median(bases),
        "ratio": statistics.median(ratios),
    }


# ---------------------------------------------------------------- purge


def plain_purge_latency(
    records: list[tuple[int, str, int, int, float, int]], victims: list[int]
) -> list[float]:
    """The plain baseline: per-key score and bucket dicts, a dict of each (user, cohort)'s
    record indices; a purge subtracts the pair's records and marks them drained."""
    scores: dict[tuple[str, int, int], list[float]] = {}
    buckets: dict[tuple[str, int, int, int], list[float]] = {}
    pairs: dict[tuple[int, str], list[int]] = {}
    drained = bytearray(len(records))
    for i, (u, c, e, ty, w, ts) in enumerate(records):
        st = scores.get((c, e, ty))
        if st is None:
            st = scores[(c, e, ty)] = [0.0, ts]
        st[0] += w * 2.0 ** ((ts - st[1]) / HALF_LIFE)
        b = buckets.get((c, e, ty, ts // HOUR))
        if b is None:
            buckets[(c, e, ty, ts // HOUR)] = [1, w]
        else:
            b[0] += 1
            b[1] += w
        pairs.setdefault((u, c), []).append(i)
    lat = []
    for u in victims:
        t = time.perf_counter()
        for i in pairs.pop((u, "target"), []):
            _, c, e, ty, w, ts = records[i]
            st = scores[(c, e, ty)]
            st[0] -= w * 2.0 ** ((ts - st[1]) / HALF_LIFE)
            b = buckets[(c, e, ty, ts // HOUR)]
            b[0] -= 1
            b[1] -= w
            drained[i] = 1
        lat.append(time.perf_counter() - t)
    return lat


def _purge_batches(log_records: int, victims: int, per_user: int) -> Iterator[list[Signal]]:
    """The purge benchmark's signals, batch by batch (seeded: the same each time):
    background users on @community only, then each victim's ``per_user`` signals
    (to "target" and @community)."""
    rng = random.Random(3)
    background = max(0, log_records - victims * per_user * 2)
    step, filled = 20_000, 0
    while filled < background:
        n = min(step, background - filled)
        ents = zipf_entities(n, seed=filled)
        yield [
            Signal(
                victims + rng.randrange(100_000), ents[i], rng.randrange(4), 1.0, T0 + filled + i
            )
            for i in range(n)
        ]
        filled += n
    for u in range(victims):
        yield [
            Signal(u, rng.randrange(50_000), 1, 1.0, T0 + background + i) for i in range(per_user)
        ]


def purge(log_records: int, per_user: int = 1000, victims: int = 100) -> dict[str, Any]:
    """Purge latency of ``victims`` users with ``per_user`` contributions each to cohort
    "target" (and as many to @community) while the log holds ``log_records`` records.

    The plain baseline's record list is built after the runtime's purges (from the
    same seeded batches), so that the runtime is not measured beside a 5M-item list
    of the benchmark's own, which every full GC pass would walk."""
    victims = max(1, min(victims, log_records // (2 * per_user) // 2))
    lat = []
    cfg = Config(max_contribution_log_entries=log_records, ledger_shards=2)
    with TidalDb.open(config=cfg) as db:
        for u in range(victims):
            db.assign_cohort(u, "target")
        for batch in _purge_batches(log_records, victims, per_user):
            db.signal_batch(batch)
        db.flush()
        held = db.stats()["log_records"]
        full_gc: list[float] = []  # full collections while the purges ran (any thread)
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if info["generation"] == 2:
                if phase == "start":
                    started.append(time.perf_counter())
                else:
                    full_gc.append(time.perf_counter() - started.pop())

        gc.callbacks.append(on_gc)
        try:
            for u in range(victims):
                t = time.perf_counter()
                _, m = db.request_community_purge(u, "target")
                lat.append(time.perf_counter() - t)
                assert len(m.entries) == per_user, (len(m.entries), m.evicted)
        finally:
            gc.callbacks.remove(on_gc)
    records: list[tuple[int, str, int, int, float, int]] = []  # (user, cohort, e, t, w, ts)
    for batch in _purge_batches(log_records, victims, per_user):
        for s in batch:
            if s.user_id < victims:
                records.append(
                    (s.user_id, "target", s.entity_id, s.signal_type, 1.0, s.timestamp_ns)
                )
            records.append(
                (s.user_id, "@community", s.entity_id, s.signal_type, 1.0, s.timestamp_ns)
            )
    plain = plain_purge_latency(records, list(range(victims)))
    del records
    gc.collect()
    lat.sort()
    plain.sort()
    p50, p99 = statistics.median(lat), lat[-1] if len(lat) < 100 else lat[int(len(lat) * 0.99) - 1]
    return {
        "log_records": held,
        "user_records": per_user,
        "purges": victims,
        "p50_ms": p50 * 1e3,
        "p99_ms": p99 * 1e3,
        "max_ms": lat[-1] * 1e3,
        "full_gc_passes": len(full_gc),
        "full_gc_max_ms": max(full_gc, default=0.0) * 1e3,
        "plain_p50_ms": statistics.median(plain) * 1e3,
        "ratio_p50": statistics.median(plain) / p50,
    }


# ---------------------------------------------------------------- restore


def _drop_snapshot(path: str) -> None:
    """Remove the clean-close snapshot, as a crash would leave the store."""
    import lmdb

    from tidal_actors.storage.format import Keyspace, Tag, encode_key

    env = lmdb.open(path, max_dbs=8, subdir=True)
    try:
        meta = env.open_db(Keyspace.META.value.encode())
        with env.begin(write=True, db=meta) as txn:
            txn.delete(encode_key(0, Tag.SNAPSHOT_MARK))
    finally:
        env.close()


def restore(n_records: int) -> dict[str, Any]:
    """Reopen times of a store holding ``n_records`` contributions (100,000 users, each
    in one of 200 cohorts, and @community: two records a signal)."""
    tmp = tempfile.mkdtemp(prefix="tidal-bench-restore-")
    path = os.path.join(tmp, "db")
    users = 100_000
    cohorts = {u: (f"c{u % 200}",) for u in range(users)}
    n_signals = n_records // 2
    rng = random.Random(5)
    cfg = Config(ledger_shards=2)
    records: list[tuple[int, int, int, float, int]] = []
    try:
        with TidalDb.open(path, config=cfg) as db:
            setup = assign_all(db, cohorts)
            t = time.perf_counter()
            for k in range(0, n_signals, 20_000):
                n = min(20_000, n_signals - k)
                ents = zipf_entities(n, seed=k)
                batch = [
                    (rng.randrange(users), ents[i], rng.randrange(4), 1.0, T0 + (k + i) * 1_000_000)
                    for i in range(n)
                ]
                db.signal_batch([Signal(*s) for s in batch])
                records.extend(batch)
            db.flush()
            ingest_s = time.perf_counter() - t
            before = db.read_decay_score("@community", 0, 1)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))

        def timed_open() -> float:
            t = time.perf_counter()
            db = TidalDb.open(path, config=cfg)
            s = time.perf_counter() - t
            assert (
                db.read_decay_score("@community", 0, 1) == before
                or abs(db.read_decay_score("@community", 0, 1) - before) <= 1e-9 * before
            )
            db.close()  # a clean close: writes the snapshot again
            return s

        snap_s = timed_open()
        _drop_snapshot(path)
        replay_s = timed_open()
        t = time.perf_counter()
        simple_loop(records, cohorts)
        plain_s = time.perf_counter() - t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "contributions": n_signals * 2,
        "store_mb": size / 2**20,
        "assign_setup_s": setup,
        "ingest_s": ingest_s,
        "restore_snapshot_s": snap_s,
        "restore_replay_s": replay_s,
        "plain_rebuild_s": plain_s,
        "ratio_snapshot": plain_s / snap_s,
        "ratio_replay": plain_s / replay_s,
    }


# ---------------------------------------------------------------- main


def _table(
    title: str, rows: list[dict[str, Any]], cols: list[tuple[str, str, Callable[[Any], str]]]
) -> None:
    print(f"\n{title}")
    print("  " + "  ".join(f"{h:>14}" for h, _, _ in cols))
    for r in rows:
        print("  " + "  ".join(f"{fmt(r[k]):>14}" for _, k, fmt in cols))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="the two smaller sizes of each, fewer signals"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--only",
        choices=["ingestion", "purge", "restore"],
        action="append",
        help="run only these (repeatable)",
    )
    args = ap.parse_args()
    only = set(args.only or ["ingestion", "purge", "restore"])
    q = args.quick
    out: dict[str, Any] = {"quick": q}
    f0 = lambda x: f"{x:,.0f}"  # noqa: E731
    f2 = lambda x: f"{x:,.2f}"  # noqa: E731
    f3 = lambda x: f"{x:,.3f}"  # noqa: E731
    if "ingestion" in only:
        sizes = [10_000, 100_000] if q else [10_000, 100_000, 1_000_000]
        out["ingestion"] = [ingestion(u, 50_000 if q else 300_000, 2 if q else 3) for u in sizes]
        _table(
            "ingestion (signal_batch, ephemeral) by users",
            out["ingestion"],
            [
                ("users", "users", f0),
                ("runtime sig/s", "runtime_signals_per_s", f0),
                ("simple loop sig/s", "simple_loop_signals_per_s", f0),
                ("ratio", "ratio", f3),
                ("assign set-up s", "assign_setup_s", f2),
            ],
        )
    if "purge" in only:
        sizes = [50_000, 500_000] if q else [50_000, 500_000, 5_000_000]
        out["purge"] = [purge(n) for n in sizes]
        _table(
            "purge of a user's 1,000 contributions by log size",
            out["purge"],
            [
                ("log records", "log_records", f0),
                ("purges", "purges", f0),
                ("p50 ms", "p50_ms", f2),
                ("p99 ms", "p99_ms", f2),
                ("max ms", "max_ms", f2),
                ("full GCs", "full_gc_passes", f0),
                ("full GC max ms", "full_gc_max_ms", f2),
                ("plain p50 ms", "plain_p50_ms", f3),
                ("ratio p50", "ratio_p50", f3),
            ],
        )
    if "restore" in only:
        sizes = [100_000, 1_000_000] if q else [100_000, 1_000_000, 5_000_000]
        out["restore"] = [restore(n) for n in sizes]
        _table(
            "restore by contributions held",
            out["restore"],
            [
                ("contributions", "contributions", f0),
                ("store MB", "store_mb", f0),
                ("snapshot s", "restore_snapshot_s", f2),
                ("replay s", "restore_replay_s", f2),
                ("plain s", "plain_rebuild_s", f2),
                ("ratio snap", "ratio_snapshot", f3),
                ("ratio replay", "ratio_replay", f3),
            ],
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
