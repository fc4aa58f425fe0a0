"""What one hand-off between two threads costs: a put that wakes the thread waiting in
``get``, in CPU microseconds (both threads, `time.process_time`) and wall clock.

Two threads pass a message back and forth ``--hops`` times through two queues of one
kind: the actors' `runtime.mailbox.Mailbox` (a `queue.Queue`: a lock and two
condition variables in Python, a new lock a wait), `queue.Queue`, and the baseline
`queue.SimpleQueue` (written in C). Every get finds its queue empty and waits, as an
actor's thread mostly does in the main job (`bench_main_job.py --breakdown`: the
mailboxes' ``get`` and ``put``). Each kind's figures are medians over ``--rounds``
rounds, the kinds alternating; ratios to ``SimpleQueue`` within a round. Run: ``python
bench/bench_hop.py`` (``--quick``: fewer hops; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402
from pykka._envelope import Envelope  # noqa: E402

from tidal_actors.runtime.mailbox import Mailbox  # noqa: E402

KINDS: dict[str, Callable[[], Any]] = {
    "simple_queue": queue.SimpleQueue,
    "queue": queue.Queue,
    "mailbox": lambda: Mailbox(1 << 20),
}


def hops(make: Callable[[], Any], n: int) -> tuple[float, float]:
    """(CPU, wall) microseconds a hop over ``n`` round trips (two hops each)."""
    a, b = make(), make()
    msg = Envelope("x")

    def echo() -> None:
        for _ in range(n):
            b.put(a.get())

    t = threading.Thread(target=echo)
    t.start()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        a.put(msg)
        b.get()
    t.join()
    return (time.process_time() - c0) / n / 2 * 1e6, (time.perf_counter() - w0) / n / 2 * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hops", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="5,000 round trips a round")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    n = 5_000 if args.quick else args.hops
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in list(KINDS) if r % 2 else list(KINDS)[::-1]:
            got[kind].append(hops(KINDS[kind], n))
    out: dict[str, Any] = {"round_trips": n, "rounds": args.rounds}
    for kind, runs in got.items():
        out[f"{kind}_cpu_us_a_hop"] = statistics.median(c for c, _ in runs)
        out[f"{kind}_wall_us_a_hop"] = statistics.median(w for _, w in runs)
        if kind != "simple_queue":
            base = got["simple_queue"]
            out[f"{kind}_over_simple_queue_cpu"] = statistics.median(
                c / b[0] for (c, _), b in zip(runs, base)
            )
    report(out, args.json)


if __name__ == "__main__":
    main()
