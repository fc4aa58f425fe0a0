"""Ingestion against honest baselines: the runtime beside the best plain code.

Run: ``python bench/bench_ingest.py`` (``--quick`` for a run of about two minutes;
``--json FILE`` writes every figure). Contenders, each timed on the same pre-built
signals (`tidal_actors.Signal` tuples cut into batches of 1,000 before any timing):

- ``tight_loop``: `ingest_baselines.tight_loop`, the fan-out and fold in plain
  Python dicts, one thread; ``simple_loop``: `bench_core.simple_loop`, the loop
  ``bench_core`` and ``bench_scaling`` compare with, on the same signals (a figure
  of its own, no ratio: it shows how far that loop is from the tight one);
- ``vector_fold``: `ingest_baselines.VectorFold` on the same batches, each converted
  from the tuples to numpy columns inside the timed region; ``vector_fold_columns``
  the same from columns converted beforehand (a bound, not a like-for-like rate);
- ``batch_ephemeral`` / ``batch_persistent``: ``TidalDb.signal_batch`` per batch,
  ``TidalDb.open(None)`` / a fresh directory, default `Config`;
- ``single_ephemeral``: ``TidalDb.signal_with_context`` one signal a call.

A runtime figure is the whole pipeline: from the first call until ``db.flush()``
returns, called from the main thread with SIGINT handled by the program (as the
command line does: with Python's default handler the main thread queues every call
for the actors' threads instead of running idle shards' work, `runtime.inline`);
every database is opened and its users assigned their cohorts (16 callers)
before its timing starts, and its log is checked to hold every record afterwards.
The baselines' results are checked against each other after every round, untimed
(scores to 1e-9 relative, counts and the log exactly).

Each rate is given per second of wall clock (``<shape>_<contender>_signals_per_s``)
and per second of the process's CPU time, every thread's (``..._per_cpu_s``); each
ratio ``<shape>_<runtime>_per_<baseline>`` likewise (``..._cpu``). On a shared
machine the runtime's several threads get more of the cores than one baseline
thread does, which flatters its wall-clock ratios; the CPU ratios leave that out.

Shapes: ``one_hour`` (20,000 users each in 1-3 of 100 cohorts, 5,000 entities with
Zipf popularity, exponent 1.1, 4 signal types, float32 weights 0.25-2, 200,000
signals with sorted timestamps within one window bucket); ``day`` (the same over 24
hours: keys keep moving to new buckets); ``core`` (`bench_core.workload` and
`bench_core.cohorts_for`: 10,000 users in 1-2 of 200 cohorts, 50,000 Zipf entities,
1 ms apart). ``--quick``: 30,000 signals, 4,000 users in the first two. Each figure
is the median of 3 rounds (``--rounds``; each round runs the baselines, then the
runtime's three), each ratio the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import cohorts_for, report, simple_loop, workload, zipf_entities  # noqa: E402
from ingest_baselines import VectorFold, routes_of, tight_loop  # noqa: E402

from tidal_actors import Config, Signal, TidalDb  # noqa: E402
from tidal_actors.loadsim.interrupt import StopOnSigint  # noqa: E402

HOUR = 3600 * 10**9
START = (10**18 // HOUR) * HOUR  # a bucket's start
BATCH = 1_000

Cohorts = dict[int, tuple[str, ...]]


def spread_workload(
    n_signals: int, n_users: int, hours: int, seed: int = 1
) -> tuple[list[Signal], Cohorts]:
    """Users in 1-3 of 100 cohorts, Zipf entities (5,000), 4 types, float32 weights,
    timestamps uniform over ``hours`` hours from a bucket's start, sorted."""
    rng = random.Random(seed)
    cohorts = {
        u: tuple(f"c{k}" for k in random.Random(u).sample(range(100), 1 + u % 3))
        for u in range(n_users)
    }
    ents = zipf_entities(n_signals, n_entities=5_000, seed=seed)
    span = hours * HOUR
    ts = sorted(START + rng.randrange(span) for _ in range(n_signals))
    weights = (0.25, 0.5, 1.0, 2.0)
    signals = [
        Signal(rng.randrange(n_users), ents[i], rng.randrange(4), rng.choice(weights), ts[i])
        for i in range(n_signals)
    ]
    return signals, cohorts


def core_workload(n_signals: int) -> tuple[list[Signal], Cohorts]:
    """`bench_core`'s shape: 10,000 users in 1-2 of 200 cohorts, 1 ms apart."""
    return [Signal(*s) for s in workload(n_signals, 10_000)], cohorts_for(10_000)


def assign_all(db: TidalDb, cohorts: Cohorts) -> None:
    """Every user joins its cohorts, in order; 16 callers at once (group commit)."""

    def join(item: tuple[int, tuple[str, ...]]) -> None:
        for c in item[1]:
            db.assign_cohort(item[0], c)

    with ThreadPoolExecutor(16) as pool:
        for _ in pool.map(join, cohorts.items(), chunksize=64):
            pass


def timed(n: int, fn: Callable[..., object], *args: Any) -> tuple[float, float]:
    """``fn(*args)`` over ``n`` signals (a collection first): signals per second of
    wall clock, and per second of the process's CPU time (every thread's)."""
    gc.collect()
    c = time.process_time()
    t = time.perf_counter()
    fn(*args)
    wall = time.perf_counter() - t
    return n / wall, n / max(time.process_time() - c, 1e-9)


def run_runtime(
    path: str | None, batches: Sequence[list[Signal]], cohorts: Cohorts, *, batch: bool
) -> tuple[float, float]:
    """Signals per second (wall clock, CPU) through a fresh database, until ``flush``
    returns; checks that every record reached the log."""
    n = sum(map(len, batches))
    # SIGINT handled by the program (as a service or the command line does): with
    # Python's default handler the main thread would not run idle shards' work
    # itself (`runtime.inline`) and every call would queue for the actors' threads
    with StopOnSigint(), TidalDb.open(path, config=Config()) as db:
        t = time.perf_counter()
        assign_all(db, cohorts)
        db.flush()
        print(f"    set-up {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)

        def go() -> None:
            if batch:
                sb = db.signal_batch
                for b in batches:
                    sb(b)
            else:
                sig = db.signal_with_context
                for b in batches:
                    for s in b:
                        sig(*s)
            db.flush()

        rate = timed(n, go)
        st = db.stats()
        expect = sum(len(cohorts.get(s.user_id, ())) + 1 for b in batches for s in b)
        assert st["log_records"] == expect, (st["log_records"], expect)
    return rate


def check_equal(
    loop: tuple[dict[Any, list[Any]], dict[Any, tuple[int, float]], list[Any]],
    fold: VectorFold,
    at: int,
) -> None:
    """Assert the two baselines' states agree: each key's score at ``at`` to 1e-9
    relative, its latest bucket and counts exactly, weight sums to 1e-9, every older
    bucket, and the log record by record.

    Raises:
        AssertionError: naming the first difference.
    """
    state, older, log = loop
    n = fold.n_keys
    assert n == len(state), (n, len(state))
    keys = [fold.key(k) for k in range(n)]
    rows = [state[key] for key in keys]
    fd, lm, lb, lc, lw = (np.array(col) for col in zip(*rows))
    hl = fold.half_life[:n]
    s_loop = fd * np.exp2((lm - at) / hl)
    s_fold = fold.fd[:n] * np.exp2((fold.landmark[:n] - at) / hl)
    rel = np.abs(s_fold - s_loop) / np.maximum(np.abs(s_loop), 1e-300)
    assert rel.max() <= 1e-9, ("score", keys[int(rel.argmax())], float(rel.max()))
    assert np.array_equal(lb, fold.latest_b[:n]), "latest bucket"
    assert np.array_equal(lc, fold.latest_count[:n]), "latest count"
    assert np.allclose(lw, fold.latest_wsum[:n], rtol=1e-9, atol=0), "latest weight sum"
    f_older = fold.older()
    assert len(f_older) == len(older), ("older buckets", len(f_older), len(older))
    for (k, b), (cnt, ws) in f_older.items():
        cl, wl = older[keys[k], b]
        assert cnt == cl and abs(ws - wl) <= 1e-9 * abs(wl), ("older", keys[k], b)
    assert fold.log() == log, "log"


def fold_all(fold: VectorFold, batches: Sequence[list[Signal]]) -> None:
    for b in batches:
        fold.fold_tuples(b)


def fold_columns(fold: VectorFold, cols: Sequence[tuple[np.ndarray, ...]]) -> None:
    for c in cols:
        fold.fold(*c)


def baselines(
    batches: list[list[Signal]], cohorts: Cohorts, hl: dict[int, int]
) -> dict[str, tuple[float, float]]:
    """The baselines once each; their results checked against each other, untimed."""
    n = sum(map(len, batches))
    out: dict[str, tuple[float, float]] = {}
    state: dict[Any, list[Any]] = {}
    older: dict[Any, tuple[int, float]] = {}
    log: list[Any] = []
    routes = routes_of(cohorts)
    out["tight_loop"] = timed(n, tight_loop, batches, routes, hl, HOUR, state, older, log)
    fold = VectorFold(cohorts, hl, HOUR)
    out["vector_fold"] = timed(n, fold_all, fold, batches)
    check_equal((state, older, log), fold, max(s.timestamp_ns or 0 for b in batches for s in b))
    del state, older, log, fold
    cols = [
        tuple(np.array(c, dtype=np.float64 if i == 3 else np.int64) for i, c in enumerate(z[:5]))
        for z in (list(zip(*b)) for b in batches)
    ]
    out["vector_fold_columns"] = timed(n, fold_columns, VectorFold(cohorts, hl, HOUR), cols)
    cols.clear()
    plain = [s[:5] for b in batches for s in b]
    out["simple_loop"] = timed(n, simple_loop, plain, cohorts)
    return out


def round_once(
    batches: list[list[Signal]], cohorts: Cohorts, hl: dict[int, int], tmp: str, tag: str
) -> dict[str, tuple[float, float]]:
    """One round: every contender once; signals per second (wall clock, CPU) by
    contender."""
    out = baselines(batches, cohorts, hl)
    out["batch_ephemeral"] = run_runtime(None, batches, cohorts, batch=True)
    path = os.path.join(tmp, tag)
    out["batch_persistent"] = run_runtime(path, batches, cohorts, batch=True)
    shutil.rmtree(path, ignore_errors=True)
    out["single_ephemeral"] = run_runtime(None, batches, cohorts, batch=False)
    return out


RUNTIME = ("batch_ephemeral", "batch_persistent", "single_ephemeral")
BASELINES = ("tight_loop", "vector_fold")


def measure_shape(
    name: str, signals: list[Signal], cohorts: Cohorts, rounds: int, tmp: str
) -> dict[str, float]:
    """Medians over ``rounds`` rounds: rates (signals/s) and runtime / baseline ratios."""
    batches = [signals[k : k + BATCH] for k in range(0, len(signals), BATCH)]
    hl = {t: Config().half_life_for(t) for t in {s.signal_type for s in signals}}
    per_round = []
    for r in range(rounds):
        per_round.append(round_once(batches, cohorts, hl, tmp, f"{name}-{r}"))
        rates = ", ".join(f"{k} {v[0]:,.0f}/s" for k, v in per_round[-1].items())
        print(f"  {name} round {r + 1}: {rates}", file=sys.stderr, flush=True)
    out: dict[str, float] = {}
    for i, clock in ((0, ""), (1, "_cpu")):
        for k in per_round[0]:
            out[f"{name}_{k}_signals_per{clock}_s"] = statistics.median(r[k][i] for r in per_round)
        out[f"{name}_tight_loop_per_simple_loop{clock}"] = statistics.median(
            r["tight_loop"][i] / r["simple_loop"][i] for r in per_round
        )
        for k in RUNTIME:
            for base in BASELINES:
                out[f"{name}_{k}_per_{base}{clock}"] = statistics.median(
                    r[k][i] / r[base][i] for r in per_round
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about two minutes)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per shape (default 3)")
    args = ap.parse_args()
    n = 30_000 if args.quick else 200_000
    users = 4_000 if args.quick else 20_000
    shapes = {
        "one_hour": lambda: spread_workload(n, users, 1),
        "day": lambda: spread_workload(n, users, 24),
        "core": lambda: core_workload(n),
    }
    out: dict[str, float] = {"signals": n}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-ingest-") as tmp:
        for name, make in shapes.items():
            signals, cohorts = make()
            out.update(measure_shape(name, signals, cohorts, args.rounds, tmp))
            del signals, cohorts
            gc.collect()
    report(out, args.json)


if __name__ == "__main__":
    main()
