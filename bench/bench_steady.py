"""The `steady` scenario's set-up and measured run, as ``tidal-actors simulate`` runs
them, without the reference model and the check: the figures a change to control
operations moves, in a fraction of the command's time.

Prints the set-up (every user joins its cohorts from ``loadsim``'s callers: wall
seconds, process CPU per assign, assigns per commit, and CPU over wall, the share of
a core the set-up got) and the measured run (signals/s; leave and purge p50 / p99 /
max, with the counts: at ``--scale 0.1`` a p99 is one call). Run it with
``PYTHONPATH`` pointing at each revision in turn to compare two, alternating.

Run: ``python bench/bench_steady.py [--scale 0.1] [--json FILE]``
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from typing import Any

from tidal_actors import ManualClock, TidalDb
from tidal_actors.eventlog.log import ApplyCounts
from tidal_actors.loadsim import simulate as S
from tidal_actors.loadsim.generator import generate_events
from tidal_actors.loadsim.interrupt import until_stopped
from tidal_actors.loadsim.measure import Latency
from tidal_actors.loadsim.scenario import load_scenario
from tidal_actors.loadsim.setup import set_up


def run(scale: float) -> dict[str, Any]:
    scenario = load_scenario("steady").scaled(scale)
    events = generate_events(scenario)
    config = scenario.build_config()
    clock = ManualClock(scenario.start_ns)
    counts = ApplyCounts()
    out: dict[str, Any] = {"scale": scale}
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as d:
        db = TidalDb.open(f"{d}/store", config=config, clock=clock)
        try:
            persistence = db._core.persistence
            parts = until_stopped(events, lambda: False)
            commits = persistence.commits
            t, cpu = time.perf_counter(), time.process_time()
            n = set_up(db, events, clock, counts, parts)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            commits = persistence.commits - commits
            out["setup"] = {
                "assigns": n,
                "wall_s": wall,
                "cpu_us_per_assign": cpu / n * 1e6,
                "assigns_per_commit": n / max(1, commits),
                "cpu_over_wall": cpu / wall,
            }
            gc.collect()
            gc.freeze()  # as `run_simulation` does
            latency = Latency(None)
            latency.start()
            t = time.perf_counter()
            S._apply_measured(db, parts, clock, scenario.batch_size, counts, latency)
            db.flush()
            out["run_s"] = time.perf_counter() - t
            out["signals_per_s"] = counts.signals / out["run_s"]
            out["latency"] = latency.summary()
        finally:
            db.close()
            gc.unfreeze()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    r = run(args.scale)
    s = r["setup"]
    print(
        f"steady {r['scale']}: set-up {s['assigns']:,} assigns in {s['wall_s']:.2f} s, "
        f"{s['cpu_us_per_assign']:.0f} us CPU an assign, {s['assigns_per_commit']:.1f} "
        f"assigns a commit, CPU / wall {s['cpu_over_wall']:.2f}"
    )
    print(f"  run {r['run_s']:.1f} s, {r['signals_per_s']:,.0f} signals/s")
    for op in ("leave", "purge"):
        q = r["latency"].get(op)
        if q:
            print(
                f"  {op:6} p50 / p99 / max {q['p50_ms']:.1f} / {q['p99_ms']:.1f} / "
                f"{q['max_ms']:.1f} ms ({q['count']})"
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=1)


if __name__ == "__main__":
    main()
