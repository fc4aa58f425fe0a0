"""Batched ingestion of two revisions of the package, interleaved, on one machine.

Run: ``python bench/compare_revisions.py BEFORE [AFTER] [--pairs 5] [--signals 100000]``
(``AFTER`` defaults to the working tree). Each revision is checked out in a temporary
git worktree and imported from there; the two alternate, one process each per turn,
and which goes first alternates too, so both meet the same machine noise. Every
process times ``bench_core``'s workload (batch ephemeral ingestion, 2 ledger shards)
three times beside ``bench_core.simple_loop``, and reports the rate, its ratio to that
loop and the process CPU per signal (microseconds; less noisy than wall time with
threads). The medians over all rounds are printed per revision. The benchmark code
itself is this working tree's ``bench_core``, the same for both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ROUNDS = """
import sys, time
sys.path.insert(0, {bench!r})
import bench_core as bc
from tidal_actors import Config, Signal, TidalDb
n = {n}
signals = bc.workload(n, 10_000)
cohorts = bc.cohorts_for(10_000)
for _ in range(3):
    base = bc.simple_loop(signals, cohorts)
    with TidalDb.open(None, config=Config(ledger_shards=2)) as db:
        for u, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(u, c)
        t, c0 = time.perf_counter(), time.process_time()
        for k in range(0, n, 10_000):
            db.signal_batch([Signal(*s) for s in signals[k : k + 10_000]])
        db.flush()
        wall, cpu = time.perf_counter() - t, time.process_time() - c0
    print(n / wall, n / wall / base, cpu / n * 1e6)
"""


def worktree(rev: str, into: str) -> str:
    path = os.path.join(into, rev.replace("/", "_"))
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "--detach", path, rev],
        check=True,
        capture_output=True,
    )
    return path


def run_rounds(src: str, n: int) -> list[tuple[float, float, float]]:
    env = {**os.environ, "PYTHONPATH": src}
    code = ROUNDS.format(bench=HERE, n=n)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    )
    return [tuple(map(float, line.split())) for line in out.stdout.splitlines()]  # type: ignore[misc]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("before", help="a git revision")
    ap.add_argument("after", nargs="?", help="a git revision (default: the working tree)")
    ap.add_argument("--pairs", type=int, default=5, help="turns per revision (3 rounds each)")
    ap.add_argument("--signals", type=int, default=100_000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tidal-compare-")
    srcs: dict[str, str] = {}
    try:
        srcs[args.before] = worktree(args.before, tmp)
        after = args.after or "working tree"
        srcs[after] = worktree(args.after, tmp) if args.after else ROOT
        results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in srcs}
        order = list(srcs.items())
        for turn in range(args.pairs):
            # the order alternates, so neither revision always runs first in a turn
            for rev, src in order if turn % 2 == 0 else order[::-1]:
                results[rev] += run_rounds(src, args.signals)
                print(f"turn {turn + 1}/{args.pairs} {rev}: done", file=sys.stderr)
        for rev, rows in results.items():
            rate = statistics.median(r[0] for r in rows)
            ratio = statistics.median(r[1] for r in rows)
            cpu = statistics.median(r[2] for r in rows)
            print(
                f"{rev:<14} signals/s {rate:>9,.0f}  ratio to simple loop {ratio:.3f}"
                f"  CPU {cpu:.2f} us/signal  ({len(rows)} rounds)"
            )
    finally:
        for src in srcs.values():
            if src != ROOT:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", src])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
