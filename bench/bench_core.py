"""Core benchmarks: ingestion beside a simple loop, leave latency, purge
latency at a full log, memory per retained contribution record.

Run: ``python bench/bench_core.py`` (``--quick`` for a smaller run). Every rate is
printed beside `simple_loop`, a plainly written single-threaded loop doing the same
fan-out (forward-decayed score, bucketed window, one contribution record per cohort)
in the same process: each ingestion figure is the median of three rounds, each round
timing the simple loop and then the runtime, and its ratio the median of the three
rounds' ratios. The simple loop is not the best plain code for the work: the tight
loop of ``bench/bench_ingest.py`` does more (latest-bucket moves, landmark moves) at
1.4-1.9 times its CPU rate (docs/performance.md), so a ratio here is against an
untuned loop; ``bench_ingest.py`` holds the ratios against the tight loop and a
vectorized fold. Purge latency: 100 users' purges (p99 is the
99th). Memory per retained record: RSS above the start once settled (a collection
and malloc_trim), and the bytes of the ledgers' structures by part.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import numpy as np

from tidal_actors import Config, Signal, TidalDb

HOUR = 3600 * 10**9
T0 = 10**18


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled_rss() -> int:
    """RSS after a full collection and glibc's malloc_trim (freed heap given back)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def structure_bytes(db: TidalDb) -> dict[str, int]:
    """Bytes held by the ledgers' structures, by part (`Aggregates.memory`,
    `ContributionLog.memory`); read while the actors are idle."""
    out: dict[str, int] = {}
    for ledger in db._core.ledgers:
        for part, n in {**ledger.state.aggregates.memory(), **ledger.state.log.memory()}.items():
            out[part] = out.get(part, 0) + n
    return out


def zipf_entities(
    n: int, n_entities: int = 50_000, exponent: float = 1.1, seed: int = 1
) -> list[int]:
    """Entity ids with Zipf-skewed popularity (rank r drawn with weight r ** -exponent)."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_entities + 1, dtype=np.float64) ** -exponent
    return rng.choice(n_entities, size=n, p=p / p.sum()).tolist()


def workload(n_signals: int, n_users: int, seed: int = 1) -> list[tuple[int, int, int, float, int]]:
    """Signals from uniform users on Zipf-popular entities, 4 signal types, 1 ms apart."""
    rng = random.Random(seed)
    ents = zipf_entities(n_signals, seed=seed)
    return [
        (rng.randrange(n_users), ents[i], rng.randrange(4), 1.0, T0 + i * 1_000_000)
        for i in range(n_signals)
    ]


def cohorts_for(n_users: int) -> dict[int, tuple[str, ...]]:
    return {u: tuple(f"c{(u * 7 + j) % 200}" for j in range(1 + u % 2)) for u in range(n_users)}


def simple_loop(
    signals: list[tuple[int, int, int, float, int]], cohorts: dict[int, tuple[str, ...]]
) -> float:
    """A simple baseline: the same fan-out in one thread with plain dicts and lists,
    written plainly, not tuned; signals per second.

    Per record: a forward-decayed sum per (cohort, entity, type) key against the key's
    first timestamp (no landmark move), a count and weight sum per (key, bucket) in
    one dict of every bucket (no latest bucket, no moves), six list appends for the
    log. Method lookups and a route tuple per signal stay in the loop. The tight loop
    of ``bench_ingest.py`` (`ingest_baselines.tight_loop`) is the best plain code for
    the same work."""
    half_life = 7 * 24 * HOUR
    width = HOUR
    scores: dict[tuple[str, int, int], list[float]] = {}
    buckets: dict[tuple[str, int, int, int], list[float]] = {}
    log_u: list[int] = []
    log_c: list[str] = []
    log_e: list[int] = []
    log_t: list[int] = []
    log_w: list[float] = []
    log_ts: list[int] = []
    left: set[int] = set()
    t = time.perf_counter()
    for u, e, ty, w, ts in signals:
        if u in left:
            continue
        for c in (*cohorts.get(u, ()), "@community"):
            key = (c, e, ty)
            st = scores.get(key)
            if st is None:
                st = scores[key] = [0.0, ts]
            st[0] += w * 2.0 ** ((ts - st[1]) / half_life)
            bk = (c, e, ty, ts // width)
            b = buckets.get(bk)
            if b is None:
                buckets[bk] = [1, w]
            else:
                b[0] += 1
                b[1] += w
            log_u.append(u)
            log_c.append(c)
            log_e.append(e)
            log_t.append(ty)
            log_w.append(w)
            log_ts.append(ts)
    return len(signals) / (time.perf_counter() - t)


def ingest(path: str | None, signals, cohorts, *, batch: bool) -> float:
    with TidalDb.open(path, config=Config(ledger_shards=2)) as db:
        for u, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(u, c)
        t = time.perf_counter()
        if batch:
            step = 10_000
            for k in range(0, len(signals), step):
                db.signal_batch(
                    [Signal(u, e, ty, w, ts) for u, e, ty, w, ts in signals[k : k + step]]
                )
        else:
            sig = db.signal_with_context
            for u, e, ty, w, ts in signals:
                sig(u, e, ty, w, ts)
        db.flush()
        return len(signals) / (time.perf_counter() - t)


def ingest_call_path(path: str | None, signals) -> float:
    """Only the caller's cost of signal_with_context (the actors drain afterwards)."""
    with TidalDb.open(path) as db:
        sig = db.signal_with_context
        t = time.perf_counter()
        for u, e, ty, w, ts in signals:
            sig(u, e, ty, w, ts)
        rate = len(signals) / (time.perf_counter() - t)
        db.flush()
        return rate


def leave_latency(path: str | None, n: int) -> tuple[float, float]:
    lat = []
    with TidalDb.open(path) as db:
        for u in range(n):
            db.signal_with_context(u, 1, 1)
            t = time.perf_counter()
            db.leave_community_layer(u)
            lat.append(time.perf_counter() - t)
    q = statistics.quantiles(lat, n=100)
    return q[49] * 1e3, q[98] * 1e3


def purge_at_full_log(
    log_records: int, user_records: int, repeats: int
) -> tuple[float, float, float, int, dict[str, int]]:
    """Purge latency of a user with ``user_records`` contributions while the log holds
    ``log_records`` records; also memory per retained record (RSS above the start,
    settled: after a collection and malloc_trim) and the structures' bytes by part."""
    rss0 = settled_rss()
    cfg = Config(max_contribution_log_entries=log_records, ledger_shards=2)
    lat = []
    with TidalDb.open(config=cfg) as db:
        n_users = 100_000
        for u in range(repeats):
            db.assign_cohort(u, "target")
        rng = random.Random(2)
        # background: users outside "target" fill the log (one record each: @community)
        step = 20_000
        filled = 0
        while filled < log_records - repeats * user_records * 2:
            ents = zipf_entities(step, seed=filled)
            db.signal_batch(
                [
                    Signal(
                        repeats + rng.randrange(n_users),
                        ents[i],
                        rng.randrange(4),
                        1.0,
                        T0 + filled + i,
                    )
                    for i in range(step)
                ]
            )
            filled += step
        for u in range(repeats):
            db.signal_batch(
                [Signal(u, rng.randrange(50_000), 1, 1.0, T0 + i) for i in range(user_records)]
            )
        db.flush()
        st = db.stats()
        per_record = (settled_rss() - rss0) / max(st["log_records"], 1)
        parts = structure_bytes(db)
        for u in range(repeats):
            t = time.perf_counter()
            _, m = db.request_community_purge(u, "target")
            lat.append(time.perf_counter() - t)
            assert len(m.entries) == user_records, (len(m.entries), m.evicted)
        retained = st["log_records"]
    lat.sort()
    p99 = lat[int(len(lat) * 0.99) - 1 if len(lat) >= 100 else -1] * 1e3
    return statistics.median(lat) * 1e3, p99, per_record, retained, parts


def report(out: dict[str, float], json_path: str | None) -> None:
    """Print ``out`` one figure a line (floats to 3 places) and, given a path, write
    it there as JSON."""
    width = max(len(k) for k in out)
    for k, v in out.items():
        print(f"{k:<{width}}  {v:,.3f}" if isinstance(v, float) else f"{k:<{width}}  {v:,}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(out, fh, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n = 100_000 if args.quick else 400_000
    users = 10_000
    signals = workload(n, users)
    cohorts = cohorts_for(users)
    out: dict[str, float] = {}
    tmp = tempfile.mkdtemp(prefix="tidal-bench-")
    rounds = 3  # each round: the simple loop, then the runtime; medians of the round ratios
    bases: list[float] = []
    for name, persistent, batch in (
        ("batch_ephemeral", False, True),
        ("batch_persistent", True, True),
        ("single_ephemeral", False, False),
        ("single_persistent", True, False),
    ):
        rates, ratios = [], []
        for r in range(rounds):
            base = simple_loop(signals, cohorts)
            rate = ingest(
                os.path.join(tmp, f"{name}-{r}") if persistent else None,
                signals,
                cohorts,
                batch=batch,
            )
            bases.append(base)
            rates.append(rate)
            ratios.append(rate / base)
        out[f"{name}_signals_per_s"] = statistics.median(rates)
        out[f"{name}_per_simple_loop"] = statistics.median(ratios)
    out["simple_loop_signals_per_s"] = statistics.median(bases)
    out["call_path_ephemeral_signals_per_s"] = statistics.median(
        ingest_call_path(None, signals) for _ in range(rounds)
    )
    out["leave_ephemeral_p50_ms"], out["leave_ephemeral_p99_ms"] = leave_latency(None, 2000)
    out["leave_persistent_p50_ms"], out["leave_persistent_p99_ms"] = leave_latency(
        os.path.join(tmp, "c"), 500
    )
    log_records = 500_000 if args.quick else 5_000_000
    p50, p99, per_rec, retained, parts = purge_at_full_log(log_records, 1000, 100)
    out["purge_1000_log_records"] = retained
    out["purge_1000_p50_ms"], out["purge_1000_p99_ms"] = p50, p99
    out["bytes_per_retained_record"] = per_rec
    out["structure_bytes_per_retained_record"] = sum(parts.values()) / max(retained, 1)
    for part, n in parts.items():
        out[f"structure_{part}_bytes_per_record"] = n / max(retained, 1)
    shutil.rmtree(tmp, ignore_errors=True)
    report(out, args.json)


if __name__ == "__main__":
    main()
