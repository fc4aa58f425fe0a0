"""Recovery time of a membership shard killed under the Ray host (restart in place).

Run: ``python bench/bench_ray_membership_restart.py`` (``--signals N`` in the store
before the kills, ``--kills K``; ``--json FILE`` writes every figure). Needs the
``ray`` extra.

A persistent database, ``Config(membership_shards=2, ledger_shards=2, host="ray")``,
``--signals`` signals of `bench_core.workload` over ``--users`` users committed
first (a flush). Then ``--kills`` times, in turn on membership shard 0 and 1: a
batch of 10,000 signals and ``flush()`` (the baseline), SIGKILL of the shard's
process, a wait until the facade has heard of the new incarnation (its links number
for a newer epoch), then another batch and ``flush()``. Figures:

- ``heard_s_min/median/max``: from the kill until the facade has the restart's
  notice (Ray notices the death, starts a process, the new incarnation fences the
  failed one, has the coordinator end its purges, asks the ledgers and persistence,
  restores, and tells every actor);
- ``restore_s_median``: of that, the new incarnation's own restore (from its
  constructor's start, as its fault report says);
- ``recovery_s_median``: from the kill until the batch after it is flushed;
- ``flush_s_median``: a batch and ``flush()`` with no kill (the baseline), and
  ``recovery_per_flush``: the ratio of the medians;
- ``store_signals``: signals in the store at the last kill.

Every kill is checked: a ``restarted`` fault report arrives for each, and at the end
the records the ledgers hold (``log_records``) equal the count computed from the
signals sent (one record per cohort of the signal's user and one for the community
layer): none lost, none applied twice (every signal is flushed before each kill, so
none is in doubt).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import cohorts_for, report  # noqa: E402
from bench_ray_restart import BATCH, batches, restore_seconds  # noqa: E402

from tidal_actors import Config, TidalDb  # noqa: E402
from tidal_actors.actors import messages as M  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--signals", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="tidal_actors")
    tmp = tempfile.mkdtemp(prefix="bench-ray-mrestart-")
    figures: dict[str, Any] = {}
    cfg = Config(membership_shards=2, ledger_shards=2, host="ray")
    try:
        db = TidalDb.open(os.path.join(tmp, "store"), config=cfg)
        cohorts = cohorts_for(args.users)
        for user, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(user, c)
        sent = want = 0

        def send(b: list[Any]) -> None:
            nonlocal sent, want
            db.signal_batch(b)
            sent += len(b)
            want += sum(1 + len(cohorts[s.user_id]) for s in b)  # cohorts + community

        for b in batches(args.signals, args.users, seed=1):
            send(b)
        db.flush()
        extra = batches(BATCH * 2 * args.kills, args.users, seed=2)
        host = db._core.host
        heard, recovery, plain = [], [], []
        for k in range(args.kills):
            send(extra[2 * k])  # baseline: a batch, then flush
            t = time.perf_counter()
            db.flush()
            plain.append(time.perf_counter() - t)
            shard = (M.MEMBERSHIP, k % 2)
            pid, epoch = host.pids()[shard], host.links.epoch(shard)
            t = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            while host.links.epoch(shard) == epoch:
                time.sleep(0.005)
            heard.append(time.perf_counter() - t)
            send(extra[2 * k + 1])
            db.flush()
            recovery.append(time.perf_counter() - t)
            print(f"kill {k + 1} (membership {k % 2}): {recovery[-1]:.2f} s", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            restarts = [r for r in db._core.fault_reports() if r.action == "restarted"]
            if len(restarts) >= args.kills:
                break
            time.sleep(0.1)
        assert len(restarts) == args.kills, restarts
        restore = restore_seconds(restarts, args.kills)
        held = db.stats()["log_records"]
        assert held == want, (held, want)
        db.close()
        figures = {
            "store_signals": sent,
            "store_records": want,
            "kills": args.kills,
            "heard_s_min": min(heard),
            "heard_s_median": statistics.median(heard),
            "heard_s_max": max(heard),
            "restore_s_median": statistics.median(restore),
            "recovery_s_median": statistics.median(recovery),
            "flush_s_median": statistics.median(plain),
            "recovery_per_flush": statistics.median(recovery) / statistics.median(plain),
            "load_average_1min": os.getloadavg()[0],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        ray.shutdown()
    report(figures, args.json)


if __name__ == "__main__":
    main()
