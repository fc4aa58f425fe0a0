"""A ledger's reads of its settled history: its own environment alone against every
history key of the store (`storage.history.HistoryReader`), at 4 ledgers.

A persistent database, ``Config(ledger_shards=4, store_layout="shards")``,
``--signals`` signals of `bench_core.workload` over ``--users`` users in 200 cohorts
(`bench_core.cohorts_for`) committed, closed and reopened (the restore settles every
record out of the contribution log: its detail is read back from the history). The
history is self-contained (written under 4 ledgers), so a ledger's reader lists and
reads its own environment alone (``own``); ``whole`` is the reader of every history
key of the store (``HistoryReader(whole=True)``, the path of the ``single`` layout
and of a store reopened under another ledger count), run in the same process,
alternating with ``own``, ``--rounds`` times each; medians:

- ``rebuild_<j>_own_s`` / ``_whole_s`` / ``_whole_over_own``: ``rematerialize`` of
  the first cohort of ledger ``j`` (`RematJob`; the live reader's path switched);
- ``settled_read_<j>_own_s`` / ...: a read inside a settled time range on ledger
  ``j``, with a fresh reader (no range indexed yet): `HistoryReader.settled_detail`
  over the whole span of the signals;
- ``batches_<j>_own`` / ``batches_whole``: history keys each reader lists.

Both paths' answers are compared (the same rows read and the same report). Run:
``python bench/bench_history_read.py`` (``--signals N``, 400,000; ``--rounds R``, 3;
``--quick``: 100,000; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import T0, cohorts_for, report, workload  # noqa: E402

from tidal_actors import Config, ManualClock, Signal, TidalDb  # noqa: E402
from tidal_actors.core.sharding import ledger_shard_of  # noqa: E402
from tidal_actors.storage.history import HistoryReader  # noqa: E402

LEDGERS = 4


def _build(path: str, cfg: Config, n: int, users: int) -> None:
    cohorts = cohorts_for(users)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for u, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(u, c)
        sigs = workload(n, users)
        for i in range(0, n, 10_000):
            db.signal_batch([Signal(*s) for s in sigs[i : i + 10_000]])
            db.flush()


def _rebuild(db: Any, reader: HistoryReader, cohort: str, whole: bool) -> tuple[float, Any]:
    reader.whole = whole
    t = time.perf_counter()
    r = db.rematerialize(cohort)
    took = time.perf_counter() - t
    reader.whole = False
    return took, (r.records_read, r.records_excluded, r.matched_live)


def _settled_read(db: Any, j: int, whole: bool, span: tuple[int, int]) -> tuple[float, Any]:
    state = db._core.ledgers[j].state
    reader = HistoryReader(db._core.store, j, whole=whole)
    upto = dict(state.aggregates.settled_upto)
    t = time.perf_counter()
    reader.settled_detail(("", 0, 0), span[0], span[1], upto)
    took = time.perf_counter() - t
    # the keys of ledger j's cohorts (the whole store's reader indexes the others' too)
    index = reader._ranges[span]
    return took, sorted(
        (k, v[0].tolist(), v[1].tolist())
        for k, v in index.items()
        if ledger_shard_of(k[0], LEDGERS) == j
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--signals", type=int, default=400_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100,000 signals")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n = 100_000 if args.quick else args.signals
    cfg = Config(
        ledger_shards=LEDGERS,
        membership_shards=2,
        store_layout="shards",
        max_contribution_log_entries=20_000,
        rematerialize_after_ms=None,
    )
    tmp = tempfile.mkdtemp(prefix="tidal-bench-")
    path = os.path.join(tmp, "db")
    out: dict[str, Any] = {"signals": n, "ledgers": LEDGERS, "load_1m": os.getloadavg()[0]}
    try:
        _build(path, cfg, n, args.users)
        span = (T0, T0 + n * 1_000_000)
        all_cohorts = sorted({c for cs in cohorts_for(args.users).values() for c in cs})
        with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
            out["batches_whole"] = len(HistoryReader(db._core.store, 0, whole=True).batch_keys())
            for j in range(LEDGERS):
                reader = db._core.ledgers[j].state.history
                assert isinstance(reader, HistoryReader)
                out[f"batches_{j}_own"] = len(reader.batch_keys())
                cohort = next(c for c in all_cohorts if ledger_shard_of(c, LEDGERS) == j)
                times: dict[str, dict[bool, list[float]]] = {"rebuild": {}, "settled_read": {}}
                for _ in range(args.rounds):
                    for whole in (True, False):
                        took, got = _rebuild(db, reader, cohort, whole)
                        times["rebuild"].setdefault(whole, []).append(took)
                        seen = out.setdefault(f"_rebuild_{j}", got)
                        assert got == seen, (j, whole, got, seen)
                        took, rows = _settled_read(db, j, whole, span)
                        times["settled_read"].setdefault(whole, []).append(took)
                        if whole:
                            ref = rows
                        else:
                            assert rows == ref, j
                for what, by in times.items():
                    w, o = statistics.median(by[True]), statistics.median(by[False])
                    out[f"{what}_{j}_own_s"] = o
                    out[f"{what}_{j}_whole_s"] = w
                    out[f"{what}_{j}_whole_over_own"] = w / o
                out[f"records_read_{j}"] = out.pop(f"_rebuild_{j}")[0]
        out["load_1m_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(out, args.json)


if __name__ == "__main__":
    main()
