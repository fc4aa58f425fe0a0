"""The contribution log's (user, cohort) index: appending by batch and finding a pair.

Compares, in one process on the same batches, `ContributionLog.append_columns` (the
pair index by batch: pair codes, one argsort per ``FLUSH_AT`` records, runs merged
size-tiered) with a baseline that indexes one record at a time into a dict of
``bytearray`` positions (the layout a snapshot stores, `pair_index.entry_bytes`).
Both also extend the log's detail-row column. Batches are built before the timed
region, for both alike.

Workload: 20,000 users, each in 1-3 of 100 cohorts; a batch of 1,000 signals gives
one record per (signal, cohort of its user), about 2,000 records; users uniform.
``--wide`` draws users from the whole uint64 range (wide pair keys). Figures:
records/s of each and their ratio (median of the rounds' ratios), the index's bytes
per record, and the time to find one pair's positions (`ContributionLog.entry`
against a dict lookup) at the end.

``--purge N``: instead, `bench_core.purge_at_full_log` with the log at N records
(100 purges of a user's 1,000 contributions through the runtime), timing the log's
own part of each purge, `ContributionLog.prepare` and `ContributionLog.apply`,
in place.

Run: ``python bench/bench_pair_index.py`` (``--records N``, default 5,000,000;
``--quick``: 500,000; ``--rounds R``, default 3; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import sys
import time
from array import array

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import report  # noqa: E402

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog

I64, PAIR = struct.Struct("=q"), struct.Struct("=qq")


class DictIndex:
    """Baseline: the log column and a dict ``(user, cohort) -> bytearray`` of
    int64s (item 0, then positions), filled one record at a time."""

    def __init__(self) -> None:
        self.d = array("q")
        self.base = 0
        self.index: dict[tuple[int, str], bytearray] = {}

    def append_columns(self, users: list[int], cohorts: list[str], rows: range) -> None:
        index = self.index
        get = index.get
        d = self.d
        start = self.base + len(d)
        d.extend(rows)
        pack, pack_new = I64.pack, PAIR.pack
        for pos, key in enumerate(zip(users, cohorts), start):
            lst = get(key)
            if lst is None:
                index[key] = bytearray(pack_new(0, pos))
            else:
                lst.extend(pack(pos))

    def positions(self, user: int, cohort: str) -> np.ndarray:
        return np.frombuffer(bytes(self.index[(user, cohort)]), dtype=np.int64)[1:]

    def index_bytes(self) -> int:
        size = sys.getsizeof
        n = size(self.index)
        for key, lst in self.index.items():
            n += size(key) + size(key[0]) + size(lst)
        return n


def batches(n_records: int, wide: bool, seed: int = 1) -> list[tuple[np.ndarray, list[str], range]]:
    rng = random.Random(seed)
    n_users = 20_000
    ids = [rng.getrandbits(64) if wide else u for u in range(n_users)]
    names = [f"cohort-{i:03d}" for i in range(100)]
    mine = [rng.sample(names, rng.randint(1, 3)) for _ in range(n_users)]
    out = []
    row = 0
    while row < n_records:
        us: list[int] = []
        cs: list[str] = []
        for _ in range(1000):
            u = rng.randrange(n_users)
            for c in mine[u]:
                us.append(ids[u])
                cs.append(c)
        out.append((np.array(us, dtype=np.uint64), cs, range(row, row + len(us))))
        row += len(us)
    return out


def run(n_records: int, rounds: int, wide: bool) -> dict[str, float]:
    data = batches(n_records, wide)
    total = sum(len(b[1]) for b in data)
    as_lists = [(u.tolist(), c, r) for u, c, r in data]  # the baseline's input
    old_rates, new_rates, ratios = [], [], []
    old = new = None
    for _ in range(rounds):
        old = DictIndex()
        t = time.perf_counter()
        for us, cs, rows in as_lists:
            old.append_columns(us, cs, rows)
        old_rate = total / (time.perf_counter() - t)
        new = ContributionLog(Aggregates(lambda t: 3_600_000_000_000, 3_600_000_000_000, 24))
        t = time.perf_counter()
        for ua, cs, rows in data:
            new.append_columns(ua, cs, rows)
        new._flush()  # the pending tail too
        new_rate = total / (time.perf_counter() - t)
        old_rates.append(old_rate)
        new_rates.append(new_rate)
        ratios.append(new_rate / old_rate)
    assert old is not None and new is not None
    rng = random.Random(3)
    probes = [
        (int(u[i]), c[i]) for u, c, _ in rng.sample(data, 100) for i in [rng.randrange(len(c))]
    ]
    t = time.perf_counter()
    want = [old.positions(u, c) for u, c in probes]
    old_find = (time.perf_counter() - t) / len(probes)
    lat = []
    for (u, c), w in zip(probes, want):
        t = time.perf_counter()
        e = new.entry(u, c)
        lat.append(time.perf_counter() - t)
        assert e is not None and np.array_equal(e[1], w)
    lat.sort()
    return {
        "records": total,
        "runs": len(new.runs),
        "baseline_records_per_s": statistics.median(old_rates),
        "batched_records_per_s": statistics.median(new_rates),
        "ratio": statistics.median(ratios),
        "baseline_index_bytes_per_record": old.index_bytes() / total,
        "batched_index_bytes_per_record": new.index_bytes() / total,
        "baseline_find_us": old_find * 1e6,
        "batched_find_p50_us": statistics.median(lat) * 1e6,
        "batched_find_max_us": lat[-1] * 1e6,
    }


def purge_parts(n_records: int) -> dict[str, float]:
    """`bench_core.purge_at_full_log` at ``n_records``, with the time of the log's
    prepare and apply of each purge."""
    import bench_core

    times: dict[str, list[float]] = {"prepare": [], "apply": []}
    saved = {name: getattr(ContributionLog, name) for name in times}

    def timed(name: str):  # type: ignore[no-untyped-def]
        inner = saved[name]

        def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return inner(self, *args, **kwargs)
            finally:
                times[name].append(time.perf_counter() - t)

        return call

    for name in times:
        setattr(ContributionLog, name, timed(name))
    try:
        p50, p99, _, retained, parts = bench_core.purge_at_full_log(n_records, 1000, 100)
    finally:
        for name, fn in saved.items():
            setattr(ContributionLog, name, fn)
    out = {"log_records": retained, "purge_p50_ms": p50, "purge_p99_ms": p99}
    for name, lat in times.items():
        lat = sorted(lat[-100:])  # the purges' (the set-up purges none)
        out[f"{name}_p50_ms"] = statistics.median(lat) * 1e3
        out[f"{name}_max_ms"] = lat[-1] * 1e3
    out["pair_index_bytes_per_record"] = parts["pair_index"] / max(retained, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--quick", action="store_true", help="500,000 records")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--purge", type=int, help="time purges at a log of this many records")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n = 500_000 if args.quick else args.records
    out: dict[str, float] = {}
    if args.purge:
        out = purge_parts(args.purge)
    else:
        for label, wide in (("narrow", False), ("wide", True)):
            for k, v in run(n, args.rounds, wide).items():
                out[f"{label}_{k}"] = v
    report(out, args.json)


if __name__ == "__main__":
    main()
