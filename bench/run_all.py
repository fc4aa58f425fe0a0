"""Run every benchmark in ``bench/`` and print (and optionally save) their figures.

Run: ``python bench/run_all.py`` (``--quick`` for a run of a few minutes; ``--json
FILE`` writes every figure). Each benchmark runs in its own process, one after the
other, so none inherits another's memory or threads; every figure sits beside a plain
single-threaded baseline measured in the same process and run (see each module's
docstring), so the ratios hold on a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = [  # (name, script, how it hands over its figures: a --json FILE or JSON printed last)
    ("core", "bench_core.py", "file"),  # ingestion, leave, purge at a full log, memory
    ("ingest", "bench_ingest.py", "file"),  # ingestion against the tight loop and a numpy fold
    ("scaling", "bench_scaling.py", "file"),  # how ingestion, purge and restore grow
    ("aio", "bench_aio.py", "stdout"),  # the trio facade
    ("memory", "bench_memory.py", "file"),  # memory bounded by the log cap
    ("record_memory", "bench_record_memory.py", "file"),  # bytes a retained record at 5M
    ("control", "bench_control.py", "file"),  # leave and purge under full ingestion, group commit
    ("layouts", "bench_layouts.py", "file"),  # the shards store layout against single
    ("history_read", "bench_history_read.py", "file"),  # a ledger's own history against all
    ("pair_index", "bench_pair_index.py", "file"),  # the log's pair index: append, find
    ("small_batches", "bench_small_batches.py", "file"),  # signal_batch of 10 signals a call
    ("main_job", "bench_main_job.py", "file"),  # the default simulate against its model
    # every built-in scenario against its model, the large ones at a fifth (issue 16, item 5)
    ("scenarios", "bench_main_job.py --scenario all --scale 0.2", "file"),
    ("fold_paths", "bench_fold_paths.py", "file"),  # the fold's two paths on the main job's batches
    ("ledger_replay", "bench_ledger_replay.py", "file"),  # the job's ledgers in one thread
    ("hop", "bench_hop.py", "file"),  # a hand-off between threads: the Mailbox's, C's
    ("reads", "bench_reads.py", "file"),  # serving reads from the published views
    ("gc_pauses", "bench_gc_pauses.py", "file"),  # full collections while ingesting
    ("store", "bench_store.py", "file"),  # bytes a record on disk, history codec, restore
    (
        "lateness",
        "bench_loop_lateness.py",
        "stdout",
    ),  # the event loop with 2,000 tasks sending signals
]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes in all)")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument(
        "--only",
        action="append",
        choices=[name for name, _, _ in BENCHES],
        help="run only these benchmarks (repeatable)",
    )
    args = ap.parse_args()
    results: dict[str, object] = {
        "quick": args.quick,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    failed = []
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as tmp:
        for name, script, hand_over in BENCHES:
            if args.only and name not in args.only:
                continue
            script, *options = script.split()  # a script and the options it runs with
            path = os.path.join(HERE, script)
            if not os.path.exists(path):
                continue
            out = os.path.join(tmp, f"{name}.json")
            cmd = [sys.executable, path, *options]
            cmd += ["--json", out] if hand_over == "file" else ["--json"]
            cmd += ["--quick"] if args.quick else []
            print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
            t = time.perf_counter()
            # lines are shown as they come (progress on standard error passes straight
            # through); the JSON object a benchmark hands over on standard output, last,
            # is kept back
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            lines: list[str] = []
            json_from: int | None = None
            for line in proc.stdout:
                lines.append(line)
                if hand_over == "stdout" and json_from is None and line.startswith("{"):
                    json_from = len(lines) - 1
                if json_from is None:
                    print(line, end="", flush=True)
            proc.wait()
            if json_from is not None:
                tail = "".join(lines[json_from:])
                try:
                    results[name] = json.loads(tail)
                except ValueError:
                    print(tail, end="")
            print(
                f"== {name}: {time.perf_counter() - t:.0f} s, exit {proc.returncode}\n", flush=True
            )
            if proc.returncode != 0:
                failed.append(name)
                continue
            if hand_over == "file":
                with open(out) as fh:
                    results[name] = json.load(fh)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
