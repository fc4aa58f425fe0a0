"""Recovery time of a ledger killed under the Ray host (restore by handshake).

Run: ``python bench/bench_ray_restart.py`` (``--signals N`` in the store before the
kills, ``--kills K``; ``--json FILE`` writes every figure). Needs the ``ray`` extra.

A persistent database, ``Config(ledger_shards=2, host="ray")``, ``--signals``
signals of `bench_core.workload` over ``--users`` users committed first (a flush).
Then ``--kills`` times, in turn on ledger 0 and 1: one more batch of 10,000 signals
(``signal_batch``, not flushed: on its way at the kill), SIGKILL of the ledger's
process, then ``flush()``, the first call that must pass through the restarted
ledger (a barrier through every ledger to persistence). Figures:

- ``recovery_s_min/median/max``: from the kill until that ``flush()`` returns (Ray
  notices the death, starts a process, the new incarnation fences, asks the
  coordinator, has persistence read the store, restores, and its senders re-send);
- ``restore_s_median``: of that, the new incarnation's own restore (fence, ask the
  coordinator, persistence's read of the store, rebuild; from its constructor's
  start, as its fault report says); the rest is Ray's (noticing the death, a new
  worker process importing the library) and the senders' re-sends;
- ``flush_s_median``: the same batch and ``flush()`` with no kill, in the same run
  (the baseline), and ``recovery_per_flush``: the ratio of the medians;
- ``store_signals``: signals in the store at the last kill.

Every kill is checked: the database's ``stats()["signals"]`` counts every signal,
and a ``restarted`` fault report arrives for each kill. At the end the records the
ledgers hold (``log_records``) and those the membership shards sent (``records``)
both equal the count computed from the signals sent (one record per cohort of the
signal's user and one for the community layer): none lost, none applied twice.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import cohorts_for, report, workload  # noqa: E402

from tidal_actors import Config, Signal, TidalDb  # noqa: E402
from tidal_actors.actors import messages as M  # noqa: E402

BATCH = 10_000


def batches(n: int, users: int, seed: int) -> list[list[Signal]]:
    sig = [Signal(*s) for s in workload(n, users, seed=seed)]
    return [sig[i : i + BATCH] for i in range(0, n, BATCH)]


def restore_seconds(restarts: list[Any], n: int) -> list[float]:
    """Each "restarted" fault report's restore time, from its cause ("restored in
    1.234 s", or "restored from <what it read> in 1.234 s"); there must be ``n``."""
    took = [re.search(r"restored (?:from .*? )?in ([0-9.]+) s", r.cause) for r in restarts]
    out = [float(m.group(1)) for m in took if m is not None]
    assert len(out) == n, [r.cause for r in restarts]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--signals", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="tidal_actors")
    tmp = tempfile.mkdtemp(prefix="bench-ray-restart-")
    figures: dict[str, Any] = {}
    try:
        db = TidalDb.open(os.path.join(tmp, "store"), config=Config(ledger_shards=2, host="ray"))
        for user, cs in cohorts_for(args.users).items():
            for c in cs:
                db.assign_cohort(user, c)
        cohorts = cohorts_for(args.users)
        sent = want = 0

        def expect(b: list[Signal]) -> int:  # one record per cohort, one for the community
            return sum(1 + len(cohorts[s.user_id]) for s in b)

        for b in batches(args.signals, args.users, seed=1):
            db.signal_batch(b)
            sent += len(b)
            want += expect(b)
        db.flush()
        extra = batches(BATCH * 2 * args.kills, args.users, seed=2)
        recovery, plain = [], []
        for k in range(args.kills):
            db.signal_batch(extra[2 * k])  # baseline: a batch, then flush
            sent += BATCH
            want += expect(extra[2 * k])
            t = time.perf_counter()
            db.flush()
            plain.append(time.perf_counter() - t)
            db.signal_batch(extra[2 * k + 1])  # on its way at the kill
            sent += BATCH
            want += expect(extra[2 * k + 1])
            pid = db._core.host.pids()[(M.LEDGER, k % 2)]
            t = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            db.flush()
            recovery.append(time.perf_counter() - t)
            assert db.stats()["signals"] == sent
            print(f"kill {k + 1} (ledger {k % 2}): {recovery[-1]:.2f} s", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            restarts = [r for r in db._core.fault_reports() if r.action == "restarted"]
            if len(restarts) >= args.kills:
                break
            time.sleep(0.1)
        assert len(restarts) == args.kills, restarts
        restore = restore_seconds(restarts, args.kills)
        stats = db.stats()
        held, emitted = stats["log_records"], stats["records"]
        assert held == emitted == want, (held, emitted, want)
        db.close()
        figures = {
            "store_signals": sent,
            "store_records": want,
            "kills": args.kills,
            "recovery_s_min": min(recovery),
            "recovery_s_median": statistics.median(recovery),
            "recovery_s_max": max(recovery),
            "restore_s_median": statistics.median(restore),
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
