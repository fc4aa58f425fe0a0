"""The ledger fold's two paths on the main job's own batches, by batch size.

Runs `tidal-actors simulate`'s default scenario once (as `bench_main_job.py` does),
keeping every `Attribute` message the ledger shards get, then adds the same messages,
in the same order, to fresh aggregates (`LedgerState`) four ways, alternating which
goes first from one message to the next so that they meet the same machine noise:

- ``vectorized``: every batch with numpy (`Adds.add_columns`, ``small_batch = 0``);
- ``records``: every batch one record at a time in plain Python (`core.record_adds`);
- ``default``: batches of up to ``SMALL_BATCH`` records one at a time, larger ones
  with numpy (what the ledger runs);
- ``up_to_8``: the split at 8 records instead.

Prints the thread CPU of each way, microseconds a record, by batch size (records a
message) and in all, with each way's ratio to ``vectorized``. Run:
``python bench/bench_fold_paths.py`` (``--json FILE``; ``--quick`` is the same run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402

from tidal_actors import TidalDb  # noqa: E402
from tidal_actors.actors import ledger  # noqa: E402
from tidal_actors.core.aggregates import Aggregates  # noqa: E402
from tidal_actors.core.record_adds import SMALL_BATCH  # noqa: E402
from tidal_actors.core.states import LedgerState  # noqa: E402
from tidal_actors.loadsim import simulate as sim  # noqa: E402
from tidal_actors.loadsim.scenario import load_scenario  # noqa: E402
from tidal_actors.testing.reference import ReferenceModel  # noqa: E402


class _Vectorized(Aggregates):
    __slots__ = ()
    small_batch = 0


class _Records(Aggregates):
    __slots__ = ()
    small_batch = 1 << 62


class _UpTo8(Aggregates):
    __slots__ = ()
    small_batch = 8


WAYS: dict[str, type[Aggregates]] = {
    "vectorized": _Vectorized,
    "records": _Records,
    "default": Aggregates,
    "up_to_8": _UpTo8,
}
SIZES = ((8, "1-8"), (32, "9-32"), (64, "33-64"), (128, "65-128"), (256, "129-256"))


def _size(n: int) -> str:
    for top, name in SIZES:
        if n <= top:
            return name
    return "257+"


def capture() -> tuple[list[tuple[int, Any]], Any]:
    """The default scenario's run, its ledgers' attributions in the order handled."""
    got: list[tuple[int, Any]] = []
    cfg: list[Any] = []
    handle = ledger.LedgerShard._on_attribute

    def keep(self: ledger.LedgerShard, msg: Any) -> None:
        got.append((self.index, msg))
        cfg[:] = [self.ctx.config]
        handle(self, msg)

    ledger.LedgerShard._on_attribute = keep  # type: ignore[method-assign]
    try:
        sim.run_simulation(
            load_scenario(),
            lambda c, clk: TidalDb.open(None, config=c, clock=clk),
            reference=ReferenceModel,
        )
    finally:
        ledger.LedgerShard._on_attribute = handle  # type: ignore[method-assign]
    return got, cfg[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--quick", action="store_true", help="the same run (about a minute)")
    args = ap.parse_args()
    msgs, cfg = capture()
    cpu: dict[str, Counter[str]] = {w: Counter() for w in WAYS}
    states: dict[str, dict[int, LedgerState]] = {w: {} for w in WAYS}
    records: Counter[str] = Counter()
    order = list(WAYS)
    for j, (shard, m) in enumerate(msgs):
        size = _size(len(m))
        records[size] += len(m)
        for way in order if j % 2 else order[::-1]:
            st = states[way].get(shard)
            if st is None:
                st = states[way][shard] = LedgerState(cfg)
                st.aggregates.__class__ = WAYS[way]  # same slots: only small_batch differs
            t0 = time.thread_time()
            st.aggregates.add_columns(
                m.mshard, m.rseqs, m.users, m.cohorts, m.entities, m.types, m.weights, m.timestamps
            )
            cpu[way][size] += time.thread_time() - t0
    out: dict[str, Any] = {"messages": len(msgs), "small_batch": SMALL_BATCH}
    for size in [name for _, name in SIZES] + ["257+", "all"]:
        n = sum(records.values()) if size == "all" else records[size]
        if not n:
            continue
        out[f"{size}_records"] = n
        base = sum(cpu["vectorized"].values()) if size == "all" else cpu["vectorized"][size]
        for way in WAYS:
            t = sum(cpu[way].values()) if size == "all" else cpu[way][size]
            out[f"{size}_{way}_us_a_record"] = t / n * 1e6
            if way != "vectorized":
                out[f"{size}_{way}_over_vectorized"] = t / base
    report(out, args.json)


if __name__ == "__main__":
    main()
