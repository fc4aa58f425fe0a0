"""What the ``shards`` store layout costs on one machine, against ``single``.

One LMDB environment per shard (docs/storage-format.md#layouts) turns a group commit
that carried writes of several shards into one transaction (one fsync) per
environment, and a restore into one read per environment. This runs
`bench_control.measure` (assigns from 16 callers, then leaves and purges idle and
while one thread ingests batches of 1,000 signals flat out, and the ingestion rate)
on a persistent database of each layout, the two alternating for ``--rounds``
rounds in this process, then the reopen of each store (a clean close's snapshot),
and prints the medians and the ratios shards / single (below 1.0 for a rate, or
above 1.0 for a latency, is the layout's cost).

Run: ``python bench/bench_layouts.py [--quick] [--rounds 3] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_control import measure  # noqa: E402

from tidal_actors import Config, TidalDb  # noqa: E402

LAYOUTS = ("single", "shards")
RATES = ("assigns_per_s_16_callers", "ingest_signals_per_s", "ingest_with_control_signals_per_s")


def reopen_s(path: str, layout: str) -> float:
    """Seconds to open the store at ``path`` again (its snapshot) and close it."""
    start = time.perf_counter()
    with TidalDb.open(path, config=Config(rematerialize_after_ms=None, store_layout=layout)):
        pass
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="5,000 users, 60 operations, 2 s")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if args.quick:
        args.users, args.ops, args.seconds = 5_000, 60, 2.0
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="tidal-layouts-") as tmp:
        for r in range(args.rounds):
            for layout in LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]:
                path = os.path.join(tmp, f"{layout}-{r}")
                fig = measure(path, args.users, args.ops, args.seconds, layout)
                fig["reopen_s"] = reopen_s(path, layout)
                runs[layout].append(fig)
    out: dict[str, Any] = {
        k: {f: statistics.median(run[f] for run in runs[k]) for f in runs[k][0]} for k in LAYOUTS
    }
    out["shards_vs_single"] = {
        f: out["shards"][f] / out["single"][f] for f in out["single"] if out["single"][f]
    }
    print(
        f"{'figure (median of ' + str(args.rounds) + ')':40} {'single':>10} {'shards':>10} {'ratio':>7}"
    )
    for f, ratio in out["shards_vs_single"].items():
        note = " (a rate)" if f in RATES else ""
        print(f"{f:40} {out['single'][f]:10.2f} {out['shards'][f]:10.2f} {ratio:7.2f}{note}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
