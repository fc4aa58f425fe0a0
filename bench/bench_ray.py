"""The Ray host beside the pykka host, in the same run.

Run: ``python bench/bench_ray.py`` (``--quick`` for a run of about two minutes;
``--json FILE`` writes every figure). Needs the ``ray`` extra.

Figures:

- ``cluster_start_s``: ``ray.init`` of a local instance (2 CPUs, no dashboard), the
  cost paid once per process; with ``--nodes N`` (N > 1) a local multi-node
  ``ray.cluster_utils.Cluster`` of N nodes (1 CPU each) started and joined instead,
  and the ephemeral databases' actors spread over its nodes (a durable database's
  stay on the facade's node: one store); ``open_s_<host>``: opening an ephemeral database (the
  Ray host starts its actors and waits for them; median of the rounds);
- ``<shape>_<host>_signals_per_s``: batched ingestion, `bench_core.workload` and
  `bench_core.cohorts_for` over ``--users`` users, ``TidalDb.signal_batch`` of 10,000
  signals a call, ``Config(ledger_shards=2)`` with each host's default batch
  (``signal_batch_size`` None: 1,024 signals under the pykka host, 8,192 under the Ray
  host, `Config.batch_size`), and ``ray_b1024``: the Ray host with
  ``signal_batch_size=1024`` (its default before, eight times the calls), and (persistent
  only) ``ray_single``: the Ray host on a store of the ``single`` layout, whose history
  batches all go to the persistence actor (``persistent_ray_shards_per_single``: the
  default ``shards`` layout, each ledger committing its own, against it); from the first call until
  ``flush()`` returns; the cohorts are assigned before the timing. Shapes
  ``ephemeral`` and ``persistent`` (a fresh directory). Each contender runs once per
  round, in turn; a figure is the median of the rounds, ``<shape>_<ray>_per_pykka``
  the median of the rounds' ratios;
- ``<shape>_<host>_cpu_us_a_signal_<process>``: CPU (user and system) a signal of
  that ingestion, by process: ``facade`` (this process, every thread: under the
  pykka host all of the work) and, under the Ray host, each kind of actor's
  processes summed (``membership``, ``ledger``, ``coordinator``, ``persistence``;
  from ``/proc/<pid>/stat``): what docs/cluster.md's estimate of N machines uses;
- ``status_ms_<host>_p50/p99``: ``community_layer_status`` round trips (facade ->
  membership shard -> reply), on an idle ephemeral database; ``leave_ms_<host>_p50/p99``:
  ``leave_community_layer`` on a persistent one (a durable commit each).

Every database's counters are checked after its run (every signal received).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import cohorts_for, report, workload  # noqa: E402

from tidal_actors import Config, Signal, TidalDb  # noqa: E402
from tidal_actors.loadsim.interrupt import StopOnSigint  # noqa: E402

HOSTS = ("pykka", "ray")
CONTENDERS: dict[str, dict[str, Any]] = {  # the pykka host; the Ray host, two batch sizes
    "pykka": {"host": "pykka"},
    "ray": {"host": "ray"},  # its default batch (`Config.batch_size`: 8,192)
    "ray_b1024": {"host": "ray", "signal_batch_size": 1024},  # the pykka host's default
    # persistent only: the Ray host on a store of one environment (persistence writes
    # every history batch) against its default, one per shard (each ledger its own)
    "ray_single": {"host": "ray", "store_layout": "single"},
}


def opened(path: str | None, host: str, **settings: Any) -> tuple[TidalDb, float]:
    t = time.perf_counter()
    db = TidalDb.open(path, config=Config(ledger_shards=2, host=host, **settings))
    return db, time.perf_counter() - t


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _actor_pids(db: TidalDb) -> dict[str, int]:
    """The Ray host's actor processes, by kind (``membership``, ``ledger``, ...)."""
    import ray

    actors = db._core.host._actors  # type: ignore[attr-defined]
    return {f"{a[0]}-{a[1]}": int(ray.get(h.pid.remote())) for a, h in actors.items()}


def ingest(
    path: str | None, settings: dict[str, Any], signals: list[Any], cohorts: dict[int, Any]
) -> tuple[float, dict[str, float]]:
    """The rate (signals/s) and the CPU seconds a signal spent by each process: the
    facade's (``facade``: every thread of this process) and, under the Ray host,
    each kind of actor's (summed over its shards)."""
    db, _ = opened(path, **settings)
    with db:
        for u, cs in cohorts.items():
            for c in cs:
                db.assign_cohort(u, c)
        batches = [
            [Signal(u, e, ty, w, ts) for u, e, ty, w, ts in signals[k : k + 10_000]]
            for k in range(0, len(signals), 10_000)
        ]
        pids = _actor_pids(db) if settings["host"] == "ray" else {}
        before = {name: _process_cpu_s(pid) for name, pid in pids.items()}
        c0 = time.process_time()
        t = time.perf_counter()
        for b in batches:
            db.signal_batch(b)
        db.flush()
        rate = len(signals) / (time.perf_counter() - t)
        cpu = {"facade": time.process_time() - c0}
        for name, pid in pids.items():
            kind = name.rsplit("-", 1)[0]
            cpu[kind] = cpu.get(kind, 0.0) + _process_cpu_s(pid) - before[name]
        got = db.stats()["signals"]
        assert got == len(signals), (settings, got)
    return rate, {k: v / len(signals) for k, v in cpu.items()}


def quantiles_ms(lat: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(lat, n=100)
    return q[49] * 1e3, q[98] * 1e3


def round_trips(host: str, n: int, tmp: str) -> dict[str, float]:
    out: dict[str, float] = {}
    db, _ = opened(None, host)
    with db:
        lat = []
        for u in range(n):
            t = time.perf_counter()
            db.community_layer_status(u)
            lat.append(time.perf_counter() - t)
        out[f"status_ms_{host}_p50"], out[f"status_ms_{host}_p99"] = quantiles_ms(lat)
    db, _ = opened(os.path.join(tmp, f"leave-{host}"), host)
    with db:
        lat = []
        for u in range(n):
            db.signal_with_context(u, 1, 1)
            t = time.perf_counter()
            db.leave_community_layer(u)
            lat.append(time.perf_counter() - t)
        out[f"leave_ms_{host}_p50"], out[f"leave_ms_{host}_p99"] = quantiles_ms(lat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about two minutes)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--nodes", type=int, default=1, help="nodes of a local multi-node cluster")
    args = ap.parse_args()
    import ray

    from tidal_actors.runtime.ray_replies import NAMESPACE

    n = 100_000 if args.quick else 400_000
    rounds = 2 if args.quick else args.rounds
    out: dict[str, float] = {"signals": n, "users": args.users, "rounds": rounds}
    out["nodes"] = args.nodes
    t = time.perf_counter()
    cluster = None
    if args.nodes > 1:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(
            address="local",  # a new instance, never one another program started
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            namespace=NAMESPACE,
        )
    out["cluster_start_s"] = time.perf_counter() - t
    signals = workload(n, args.users)
    cohorts = cohorts_for(args.users)
    tmp = tempfile.mkdtemp(prefix="tidal-bench-ray-")
    # the calls run under a program's SIGINT handler, as the command line's: with
    # Python's default one the main thread queues every message (runtime/inline.py),
    # and the pykka host would not run at its best
    with StopOnSigint():
        try:
            opens: dict[str, list[float]] = {h: [] for h in HOSTS}
            for shape in ("ephemeral", "persistent"):
                rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
                cpus: dict[str, list[float]] = {}
                for r in range(rounds):
                    for name, settings in CONTENDERS.items():
                        if name == "ray_single" and shape == "ephemeral":
                            continue  # no store: the layouts do not differ
                        path = (
                            os.path.join(tmp, f"{shape}-{name}-{r}")
                            if shape == "persistent"
                            else None
                        )
                        rate, cpu = ingest(path, settings, signals, cohorts)
                        rates[name].append(rate)
                        if name in ("pykka", "ray"):
                            for kind, sec in cpu.items():
                                key = f"{shape}_{name}_cpu_us_a_signal_{kind}"
                                cpus.setdefault(key, []).append(sec * 1e6)
                for key, values in cpus.items():
                    out[key] = statistics.median(values)
                for name in CONTENDERS:
                    if rates[name]:
                        out[f"{shape}_{name}_signals_per_s"] = statistics.median(rates[name])
                if shape == "persistent":
                    out["persistent_ray_shards_per_single"] = statistics.median(
                        [a / b for a, b in zip(rates["ray"], rates["ray_single"])]
                    )
                for name in ("ray", "ray_b1024"):
                    out[f"{shape}_{name}_per_pykka"] = statistics.median(
                        [a / b for a, b in zip(rates[name], rates["pykka"])]
                    )
            for _ in range(rounds):
                for host in HOSTS:
                    db, s = opened(None, host)
                    db.close()
                    opens[host].append(s)
            for host in HOSTS:
                out[f"open_s_{host}"] = statistics.median(opens[host])
            for host in HOSTS:
                out.update(round_trips(host, 100 if args.quick else 300, tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
    report(out, args.json)


if __name__ == "__main__":
    main()
