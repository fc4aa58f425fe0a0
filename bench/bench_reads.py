"""Read benchmarks: serving reads from the ledger shards' published views.

Run: ``python bench/bench_reads.py`` (``--quick`` for a smaller run; ``--json PATH``
also writes the figures). One process, one store: 200,000 signals from 10,000 users
in 1-2 cohorts each plus ``@community`` (600,000-odd contribution records, Zipf-popular
entities, 4 signal types), then, each beside its baselines run in the same process:

* point read (``read_decay_score``) and top-10 (``top_entities``) p50 from a blocking
  caller, idle and while another thread ingests flat out (``signal_batch`` of 1,000),
  the reader spinning, then pausing 0.5 ms after each read (``paced``: the
  ingesting threads get the interpreter lock as often, whatever a read costs; the
  signals/s and publications/s of that phase are printed);
* 8 reader threads together beside one reader (reads/s and p50);
* awaited reads from 100 trio tasks and from 100 asyncio tasks (reads/s), then the
  same with a checkpoint after each read (``trio.lowlevel.checkpoint()``,
  ``asyncio.sleep(0)``: a read a view answers yields to the loop nowhere);
* baselines: a plain dict lookup with the same decay formula, a top-10 of the same
  rows kept sorted by rank (the first ten of one cohort and type's sorted list),
  and SQLite (stdlib, in memory) holding the same aggregate table with an index on
  ``(cohort, type, rank)``.

Also printed: the publications each ledger made and the CPU seconds they took,
against the ingestion's wall time; how far ``latest`` reads lag ingestion; and
ingestion flat out with no reader (the shards then publish nothing) beside the same
with a thread reading at ``latest`` flat out, and with a thread reading the dict
baseline flat out (the same contention for the interpreter lock, without views).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import T0, cohorts_for, report, workload  # noqa: E402

from tidal_actors import COMMUNITY, Config, Signal, TidalDb, open_tidal  # noqa: E402
from tidal_actors.actors.ledger_views import WANTED_S  # noqa: E402

HALF_LIFE = 7 * 24 * 3600 * 10**9
# the signals are stamped from three days before the run on (the database's clock is
# the system's, as a serving path's: every read is at or after every signal)
NOW = time.time_ns()
START = NOW - 3 * 24 * 3600 * 10**9


def p50_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000.0


def timed_calls(fn: Callable[[int], object], n: int, pause_s: float = 0.0) -> list[int]:
    """Nanoseconds of each of ``n`` calls ``fn(i)``; with ``pause_s``, a sleep that
    long after each (a reader serving requests, not spinning)."""
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        t = clock()
        fn(i)
        out.append(clock() - t)
        if pause_s:
            time.sleep(pause_s)
    return out


def load(
    db: TidalDb, signals: list[tuple[int, int, int, float, int]], cohorts: dict[int, Any]
) -> None:
    for u, cs in cohorts.items():
        for c in cs:
            db.assign_cohort(u, c)
    for k in range(0, len(signals), 1000):
        db.signal_batch(
            [Signal(u, e, t, w, ts - T0 + START) for u, e, t, w, ts in signals[k : k + 1000]]
        )
    db.flush()


def keys_of(db: TidalDb, limit: int) -> list[tuple[str, int, int]]:
    rows = db.aggregate_rows(at_ns=NOW)
    step = max(1, len(rows) // limit)
    return [(c, e, t) for c, e, t, *_ in rows[::step]][:limit]


class Baselines:
    """The same aggregate rows as plain Python and as SQLite (see the module doc)."""

    def __init__(self, rows: list[tuple[str, int, int, float]]) -> None:
        # (cohort, entity, type) -> (fd_sum, landmark): the score at NOW is rebuilt
        # from them with the decay formula, as a hand-made store would
        self.point = {(c, e, t): (s, NOW) for c, e, t, s in rows}
        self.ranked: dict[tuple[str, int], list[tuple[float, int, float, int]]] = {}
        for c, e, t, s in rows:
            self.ranked.setdefault((c, t), []).append((s, e, s, NOW))
        for ranked in self.ranked.values():  # kept sorted, best first, as a maintained index
            ranked.sort(key=lambda r: (-r[0], r[1]))
        self.sql = sqlite3.connect(":memory:", check_same_thread=False)
        self.sql.execute(
            "CREATE TABLE agg (cohort TEXT, entity INTEGER, type INTEGER, fd REAL, "
            "landmark INTEGER, rank REAL, PRIMARY KEY (cohort, entity, type))"
        )
        self.sql.execute("CREATE INDEX by_rank ON agg (cohort, type, rank DESC)")
        self.sql.executemany(
            "INSERT INTO agg VALUES (?, ?, ?, ?, ?, ?)",
            [(c, e % 2**63, t, s, NOW, s) for c, e, t, s in rows],
        )
        self.sql.commit()

    def dict_point(self, key: tuple[str, int, int]) -> float:
        fd, landmark = self.point.get(key, (0.0, NOW))
        return fd * 2.0 ** (-(NOW - landmark) / HALF_LIFE)

    def dict_top(self, cohort: str, stype: int) -> list[tuple[int, float]]:
        best = self.ranked.get((cohort, stype), [])[:10]
        return [(e, fd * 2.0 ** (-(NOW - lm) / HALF_LIFE)) for _r, e, fd, lm in best]

    def sql_point(self, key: tuple[str, int, int]) -> float:
        row = self.sql.execute(
            "SELECT fd, landmark FROM agg WHERE cohort = ? AND entity = ? AND type = ?",
            (key[0], key[1] % 2**63, key[2]),
        ).fetchone()
        return 0.0 if row is None else row[0] * 2.0 ** (-(NOW - row[1]) / HALF_LIFE)

    def sql_top(self, cohort: str, stype: int) -> list[tuple[int, float]]:
        rows = self.sql.execute(
            "SELECT entity, fd, landmark FROM agg WHERE cohort = ? AND type = ? "
            "ORDER BY rank DESC LIMIT 10",
            (cohort, stype),
        ).fetchall()
        return [(e, fd * 2.0 ** (-(NOW - lm) / HALF_LIFE)) for e, fd, lm in rows]


def blocking_figures(
    db: TidalDb,
    keys: list[tuple[str, int, int]],
    tops: list[tuple[str, int]],
    n: int,
    tag: str,
    pause_s: float = 0.0,
) -> dict[str, float]:
    nk, nt = len(keys), len(tops)
    out = {}
    for mode in ("read_your_writes", "latest"):
        out[f"{tag}_point_p50_us_{mode}"] = p50_us(
            timed_calls(
                lambda i, m=mode: db.read_decay_score(*keys[i % nk], consistency=m), n, pause_s
            )
        )
        out[f"{tag}_top10_p50_us_{mode}"] = p50_us(
            timed_calls(
                lambda i, m=mode: db.top_entities(*tops[i % nt], 10, consistency=m), n, pause_s
            )
        )
    return out


def readers_together(
    db: TidalDb, keys: list[tuple[str, int, int]], threads: int, n: int
) -> tuple[float, float]:
    """(reads/s over all threads, p50 us) of ``threads`` threads reading at once."""
    samples: list[list[int]] = []
    go = threading.Barrier(threads + 1)

    def reader(j: int) -> None:
        go.wait()
        samples.append(timed_calls(lambda i: db.read_decay_score(*keys[(i + j) % len(keys)]), n))

    ts = [threading.Thread(target=reader, args=(j,)) for j in range(threads)]
    for t in ts:
        t.start()
    go.wait()
    start = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - start
    return threads * n / wall, p50_us([x for s in samples for x in s])


MARK = (COMMUNITY, 2**63, 9)  # a key only the ingesting thread's marks go to


def ingest_beside(
    db: TidalDb,
    users: int,
    stop: threading.Event,
    counted: list[int],
    marks: list[float] | None = None,
) -> threading.Thread:
    """A thread ingesting flat out (batches of 1,000, timestamps before ``NOW``);
    with ``marks``, each batch also carries one signal to `MARK`, its submission time
    appended to ``marks``."""

    def run() -> None:
        i = 0
        base = START + 3600 * 10**9
        while not stop.is_set():
            batch = [
                Signal(
                    (i + j) * 7919 % users,
                    (i + j) * 104729 % 50_000,
                    (i + j) % 4,
                    1.0,
                    base + i + j,
                )
                for j in range(1000)
            ]
            if marks is not None:
                batch.append(Signal(0, MARK[1], MARK[2], 1.0, time.time_ns()))
                marks.append(time.perf_counter())
            db.signal_batch(batch)
            i += 1000
        counted.append(i)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def ingest_with_and_without_reader(
    db: TidalDb,
    users: int,
    keys: list[tuple[str, int, int]],
    seconds: float,
    baseline: Callable[[tuple[str, int, int]], object],
) -> dict[str, float]:
    """Ingestion flat out for ``seconds`` with no reader (the shards stop publishing
    within ``WANTED_S``), with a thread reading at ``latest`` flat out, and with a
    thread reading the dict baseline flat out (the same share of the interpreter lock,
    no views), twice each, interleaved: signals/s (medians), and views published and
    their CPU seconds per wall second with the ``latest`` reader."""
    rates: dict[str, list[float]] = {"none": [], "latest": [], "dict": []}
    pubs = pub_s = wall_reading = 0.0
    for mode in ("none", "latest", "dict") * 2:
        time.sleep(WANTED_S + 0.2)  # without a reader the next message drops views
        stop, counted = threading.Event(), []
        done = threading.Event()

        def reader(done: threading.Event = done, mode: str = mode) -> None:
            i = 0
            while not done.is_set():
                if mode == "latest":
                    db.read_decay_score(*keys[i % len(keys)], consistency="latest")
                else:
                    baseline(keys[i % len(keys)])
                i += 1

        r = threading.Thread(target=reader, daemon=True)
        if mode != "none":
            r.start()
        before = [(lg.publications, lg.publish_s) for lg in db._core.ledgers]
        t = time.perf_counter()
        ingester = ingest_beside(db, users, stop, counted)
        time.sleep(seconds)
        stop.set()
        ingester.join()
        wall = time.perf_counter() - t
        done.set()
        if mode != "none":
            r.join()
        if mode == "latest":
            pubs += sum(lg.publications for lg in db._core.ledgers) - sum(p for p, _ in before)
            pub_s += sum(lg.publish_s for lg in db._core.ledgers) - sum(s for _, s in before)
            wall_reading += wall
        db.flush()
        rates[mode].append(counted[0] / wall)
    med = {m: statistics.median(v) for m, v in rates.items()}
    return {
        "ingest_no_reader_signals_per_s": med["none"],
        "ingest_latest_reader_signals_per_s": med["latest"],
        "ingest_dict_reader_signals_per_s": med["dict"],
        "ratio_ingest_latest_reader_vs_none": med["latest"] / med["none"],
        "ratio_ingest_latest_reader_vs_dict_reader": med["latest"] / med["dict"],
        "ingest_latest_reader_publications_per_s": pubs / wall_reading,
        "ingest_latest_reader_publish_cpu_s_per_wall_s": pub_s / wall_reading,
    }


async def trio_rate(
    path: str, config: Config, keys: list[tuple[str, int, int]], n: int
) -> tuple[float, float]:
    """Reads/s of 100 tasks; then the same with a checkpoint after each read (what
    a read answered from a view does not do: docs/async.md, "Cancellation")."""
    async with open_tidal(path, config=config) as db:
        per = n // 100
        rates = []
        for checkpoint in (False, True):

            async def worker(j: int, checkpoint: bool = checkpoint) -> None:
                for i in range(per):
                    await db.read_decay_score(*keys[(i * 100 + j) % len(keys)])
                    if checkpoint:
                        await trio.lowlevel.checkpoint()

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for j in range(100):
                    nursery.start_soon(worker, j)
            rates.append(per * 100 / (time.perf_counter() - start))
        return rates[0], rates[1]


async def asyncio_rate(
    path: str, config: Config, keys: list[tuple[str, int, int]], n: int
) -> tuple[float, float]:
    """As `trio_rate`, the yield being ``asyncio.sleep(0)``."""
    async with open_tidal(path, config=config) as db:
        per = n // 100
        rates = []
        for checkpoint in (False, True):

            async def worker(j: int, checkpoint: bool = checkpoint) -> None:
                for i in range(per):
                    await db.read_decay_score(*keys[(i * 100 + j) % len(keys)])
                    if checkpoint:
                        await asyncio.sleep(0)

            start = time.perf_counter()
            await asyncio.gather(*(worker(j) for j in range(100)))
            rates.append(per * 100 / (time.perf_counter() - start))
        return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n_signals, users, n = (50_000, 3_000, 5_000) if args.quick else (200_000, 10_000, 20_000)
    config = Config(half_life_ns=HALF_LIFE)
    tmp = tempfile.mkdtemp(
        prefix="tidal-bench-reads-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    path = os.path.join(tmp, "db")
    out: dict[str, float] = {}
    try:
        db = TidalDb.open(path, config=config)
        t = time.perf_counter()
        load(db, workload(n_signals, users), cohorts_for(users))
        out["load_s"] = time.perf_counter() - t
        rows = db.aggregate_rows(at_ns=NOW)
        out["keys"] = len(rows)
        out["records"] = db.stats()["records"]
        keys = keys_of(db, 2_000)
        tops = sorted({(c, t) for c, _e, t in keys})
        base = Baselines([(c, e, t, s) for c, e, t, s, _n, _w in rows])
        # baselines and the runtime, idle
        out["idle_point_p50_us_dict"] = p50_us(
            timed_calls(lambda i: base.dict_point(keys[i % len(keys)]), n)
        )
        out["idle_point_p50_us_sqlite"] = p50_us(
            timed_calls(lambda i: base.sql_point(keys[i % len(keys)]), n)
        )
        out["idle_top10_p50_us_dict"] = p50_us(
            timed_calls(lambda i: base.dict_top(*tops[i % len(tops)]), n)
        )
        out["idle_top10_p50_us_sqlite"] = p50_us(
            timed_calls(lambda i: base.sql_top(*tops[i % len(tops)]), n)
        )
        out.update(blocking_figures(db, keys, tops, n, "idle"))
        # while another thread ingests flat out
        stop, counted = threading.Event(), []
        before = [(lg.publications, lg.publish_s) for lg in db._core.ledgers]
        t = time.perf_counter()
        ingester = ingest_beside(db, users, stop, counted)
        time.sleep(0.5)
        out.update(blocking_figures(db, keys, tops, n, "ingesting"))
        stop.set()
        ingester.join()
        wall = time.perf_counter() - t
        out["ingesting_signals_per_s"] = counted[0] / wall
        pubs = sum(lg.publications for lg in db._core.ledgers) - sum(p for p, _ in before)
        pub_s = sum(lg.publish_s for lg in db._core.ledgers) - sum(s for _, s in before)
        out["ingesting_publications"] = pubs
        out["ingesting_publish_s_per_wall_s"] = pub_s / wall
        out["ingesting_publish_us_each"] = pub_s / max(pubs, 1) * 1e6
        db.flush()
        # the same while the reader pauses 0.5 ms after each read (a server's reader,
        # not one spinning): the ingesting threads then get the interpreter lock as
        # often whatever the reads cost, and the shards publish at their own pace
        stop, counted = threading.Event(), []
        before = sum(lg.publications for lg in db._core.ledgers)
        t = time.perf_counter()
        ingester = ingest_beside(db, users, stop, counted)
        time.sleep(0.5)
        out.update(blocking_figures(db, keys, tops, n // 4, "paced", 0.0005))
        stop.set()
        ingester.join()
        wall = time.perf_counter() - t
        out["paced_signals_per_s"] = counted[0] / wall
        out["paced_publications_per_s"] = (
            sum(lg.publications for lg in db._core.ledgers) - before
        ) / wall
        for k in ("point", "top10"):
            for tag in ("ingesting", "paced"):
                out[f"ratio_{k}_{tag}_vs_idle"] = (
                    out[f"{tag}_{k}_p50_us_read_your_writes"]
                    / out[f"idle_{k}_p50_us_read_your_writes"]
                )
        db.flush()
        # how far behind latest reads are: the time from a mark's submission to the
        # first latest read that counts it, while ingesting flat out
        stop, counted, marks = threading.Event(), [], []
        ingester = ingest_beside(db, users, stop, counted, marks)
        lags = []
        end = time.perf_counter() + (2.0 if args.quick else 5.0)
        while time.perf_counter() < end:
            seen = db.read_window(*MARK, consistency="latest").count
            now = time.perf_counter()
            while len(lags) < seen and len(lags) < len(marks):
                lags.append(now - marks[len(lags)])
            time.sleep(0.0005)  # a reader polling, not spinning (the GIL is shared)
        stop.set()
        ingester.join()
        lags.sort()
        out["ingesting_latest_lag_p50_ms"] = lags[len(lags) // 2] * 1e3 if lags else -1.0
        out["ingesting_latest_lag_p99_ms"] = lags[len(lags) * 99 // 100] * 1e3 if lags else -1.0
        db.flush()
        out.update(
            ingest_with_and_without_reader(
                db, users, keys, 1.0 if args.quick else 2.0, base.dict_point
            )
        )
        one = readers_together(db, keys, 1, n)
        eight = readers_together(db, keys, 8, n // 4)
        out["readers_1_reads_per_s"], out["readers_1_p50_us"] = one
        out["readers_8_reads_per_s"], out["readers_8_p50_us"] = eight
        out["ratio_readers_8_vs_1_rate"] = eight[0] / one[0]
        db.close()
        rate, checkpointed = trio.run(trio_rate, path, config, keys, n * 5)
        out["trio_100_tasks_reads_per_s"] = rate
        out["trio_100_tasks_checkpoint_each_reads_per_s"] = checkpointed
        rate, checkpointed = asyncio.run(asyncio_rate(path, config, keys, n * 5))
        out["asyncio_100_tasks_reads_per_s"] = rate
        out["asyncio_100_tasks_sleep0_each_reads_per_s"] = checkpointed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(out, args.json)


if __name__ == "__main__":
    main()
