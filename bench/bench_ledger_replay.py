"""The main job's ledger work replayed in one thread: its cost a message and a record,
and what the threads around it cost the same code.

Runs `tidal-actors simulate`'s default scenario once (as `bench_main_job.py` does),
keeping every `Attribute` message the ledger shards get (`bench_fold_paths.capture`),
then replays them, in order, into fresh `LedgerState`s in this thread: the fold
(`Aggregates.add_columns`) and the log append (`ContributionLog.append_columns`),
thread CPU a message (the mailbox, trimming, settling and publishing are not in it).

- ``fit``: back to back, best of ``--rounds`` a message; a least-squares line through
  the messages of at most ``SMALL_BATCH`` records gives the fixed cost a message and
  the cost a record.
- ``idle``: the same replay, alternating message by message, every other message
  after sleeping 0.2 ms first (the thread blocks, as an actor's thread does between
  messages in the job); microseconds a record of the messages right after a sleep
  and of the others, against a back-to-back replay in the same process.
- ``beside``: back to back, beside two threads playing queue ping-pong with a little
  Python work in each turn (they take the interpreter lock from the replay).

Each way's microseconds a record and its ratio to the back-to-back replay run in the
same process just before it (``*_over_alone``). Run: ``python
bench/bench_ledger_replay.py`` (``--rounds N``, 3; ``--json FILE``; ``--quick`` is
the same run).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402
from bench_fold_paths import capture  # noqa: E402

from tidal_actors.core.record_adds import SMALL_BATCH  # noqa: E402
from tidal_actors.core.states import LedgerState  # noqa: E402

Msgs = list[tuple[int, Any]]


def replay(msgs: Msgs, cfg: Any, sleep_every_other: bool = False) -> tuple[list[float], float]:
    """The messages into fresh states; (thread CPU of each, seconds), and the seconds
    spent on the messages right after a sleep (0.0 without sleeps)."""
    states: dict[int, LedgerState] = {}
    out: list[float] = []
    after = 0.0
    clock = time.thread_time
    for j, (shard, m) in enumerate(msgs):
        st = states.get(shard)
        if st is None:
            st = states[shard] = LedgerState(cfg)
        slept = sleep_every_other and j % 2 == 1
        if slept:
            time.sleep(0.0002)
        t0 = clock()
        rows = st.aggregates.add_columns(
            m.mshard, m.rseqs, m.users, m.cohorts, m.entities, m.types, m.weights, m.timestamps
        )
        st.log.append_columns(m.users, m.cohorts, rows)
        took = clock() - t0
        out.append(took)
        if slept:
            after += took
    return out, after


class _PingPong:
    """Two threads handing a counter back and forth through queues, each turn a few
    hundred dict reads in Python."""

    def __init__(self) -> None:
        self.stop = False
        a: queue.Queue[int] = queue.Queue()
        b: queue.Queue[int] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._run, args=(a, b), daemon=True),
            threading.Thread(target=self._run, args=(b, a), daemon=True),
        ]
        for t in self.threads:
            t.start()
        a.put(0)

    def _run(self, qin: queue.Queue[int], qout: queue.Queue[int]) -> None:
        d = {i: i for i in range(20_000)}
        while not self.stop:
            try:
                x = qin.get(timeout=0.1)
            except queue.Empty:
                continue
            s = 0
            for i in range(300):
                s += d[(x * 7919 + i * 613) % 20_000]
            qout.put(x + 1)

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--quick", action="store_true", help="the same run (about a minute)")
    args = ap.parse_args()
    msgs, cfg = capture()
    sizes = np.array([len(m) for _, m in msgs])
    records = int(sizes.sum())
    best = np.full(len(msgs), np.inf)
    for _ in range(args.rounds):
        best = np.minimum(best, replay(msgs, cfg)[0])
    small = sizes <= SMALL_BATCH
    fixed, per = np.linalg.lstsq(
        np.vstack([np.ones(int(small.sum())), sizes[small]]).T, best[small] * 1e6, rcond=None
    )[0]
    out: dict[str, Any] = {
        "messages": len(msgs),
        "records": records,
        "records_a_message": records / len(msgs),
        "best_us_a_message": float(best.sum()) / len(msgs) * 1e6,
        "fit_fixed_us_a_message": float(fixed),
        "fit_us_a_record": float(per),
    }
    odd = sizes[1::2].sum()
    even = records - odd
    ways: dict[str, list[tuple[float, float, float]]] = {"idle": [], "beside": []}
    for _ in range(args.rounds):
        for way in ways:
            alone = sum(replay(msgs, cfg)[0]) / records
            if way == "idle":
                each, after = replay(msgs, cfg, sleep_every_other=True)
                ways[way].append((alone, after / odd, (sum(each) - after) / even))
            else:
                pp = _PingPong()
                try:
                    got = sum(replay(msgs, cfg)[0]) / records
                finally:
                    pp.close()
                ways[way].append((alone, got, got))
    for way, runs in ways.items():  # medians over the rounds; ratios within a round

        def med(fn: Any, runs: list[tuple[float, float, float]] = runs) -> float:
            return float(np.median([fn(r) for r in runs]))

        out[f"{way}_alone_us_a_record"] = med(lambda r: r[0]) * 1e6
        if way == "idle":
            out["idle_after_sleep_us_a_record"] = med(lambda r: r[1]) * 1e6
            out["idle_after_sleep_over_alone"] = med(lambda r: r[1] / r[0])
            out["idle_others_us_a_record"] = med(lambda r: r[2]) * 1e6
            out["idle_others_over_alone"] = med(lambda r: r[2] / r[0])
        else:
            out["beside_us_a_record"] = med(lambda r: r[1]) * 1e6
            out["beside_over_alone"] = med(lambda r: r[1] / r[0])
    report(out, args.json)


if __name__ == "__main__":
    main()
