"""The main job: `tidal-actors simulate` with the default scenario, runtime against
its reference model, by wall clock and by CPU.

The default scenario (2,000 users in 1-3 of 20 cohorts, 5,000 Zipf entities, 3
signal types, 50,000 signals over 14 days with hourly buckets; each user joins its
cohorts just before its first signal, plus leaves, rejoins and purges) sends a
``signal_batch`` before every control row, so the runtime sees about 20 signals a
call. Each round runs `loadsim.simulate.run_simulation` as the command does
(ephemeral `TidalDb`, `testing.ReferenceModel` as the oracle, the check included,
SIGINT handled as the command handles it, `loadsim.interrupt.StopOnSigint`, so
that the main thread may run idle shards' work itself, `runtime.inline`) and
reports:

- signals/s of the runtime's measured run and of the model (wall clock; the model
  is one thread, the runtime's actors share the interpreter lock, so under load the
  runtime gets more of the host and this ratio flatters it);
- CPU microseconds a signal: the whole process during the runtime's run (every
  thread), and the model's thread; their ratio is the one to compare across loads;
- each actor kind's thread CPU a signal, and whether the check passed.

Medians over ``--rounds`` (default 3; ``--quick``: one). Run:
``python bench/bench_main_job.py`` (``--json FILE``). ``--breakdown`` also times,
in the runtime's measured run, each actor's handler by message kind, the shards'
idle work (``on_idle``; persistence's holds its commits), the mailboxes' ``get``
and ``put`` by the thread's kind (the CPU of their locks and wake-ups), the
ledger's fold (``Adds.add_columns``) and log append
(``ContributionLog.append_columns``), and the caller's facade calls by operation
(thread CPU, microseconds a signal and a call; the timers add about a microsecond
a call, so the parts run a little high).

``--scenario NAME`` runs another built-in scenario instead (``--scenario all``: every
one, each figure prefixed with its name, then the lowest runtime / model ratios), and
``--scale F`` scales it as ``tidal-actors simulate --scale`` does if it has more than
``LARGE`` signals (the others run at full size): issue 16's "the runtime must beat
its reference model on every built-in scenario" is
``python bench/bench_main_job.py --scenario all --scale 0.2``. A scenario that keeps
a store (``persistent``, ``restart_at``) runs on one in a temporary directory, as the
command does.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_core import report  # noqa: E402

from tidal_actors import TidalDb  # noqa: E402
from tidal_actors.loadsim import simulate as sim  # noqa: E402
from tidal_actors.loadsim.generator import generate_events  # noqa: E402
from tidal_actors.loadsim.interrupt import StopOnSigint  # noqa: E402
from tidal_actors.loadsim.scenario import Scenario, builtin_scenarios, load_scenario  # noqa: E402
from tidal_actors.testing.reference import ReferenceModel  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
# ``--scale`` scales only the scenarios of more signals than this (steady, churn,
# purge-heavy, restart): the others run in seconds at full size, and scaled down to a
# few hundred signals they would time little but the fixed costs
LARGE = 100_000


def _thread_cpu() -> Counter[str]:
    """CPU seconds (user + system) of each live thread, summed by name without its
    trailing shard number (``tidal-ledger-1`` -> ``tidal-ledger``)."""
    out: Counter[str] = Counter()
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[re.sub(r"[-_]?\d+$", "", t.name)] += (int(f[11]) + int(f[12])) / _TICK
    return out


Parts = tuple[Counter[str], Counter[str]]


def _time_parts() -> Parts:
    """Wrap the handlers, the fold, the log append and the facade's calls with
    thread-CPU timers; returns (seconds, calls) by label, filled as they run."""
    from tidal_actors.actors.behaviour import Behaviour
    from tidal_actors.actors.ledger import LedgerShard
    from tidal_actors.actors.membership import MembershipShard
    from tidal_actors.actors.persistence import Persistence
    from tidal_actors.core.adds import Adds
    from tidal_actors.core.contrib_log import ContributionLog
    from tidal_actors.facades import _generated_blocking as gen
    from tidal_actors.runtime.mailbox import Mailbox

    secs: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    clock = time.thread_time

    def wrap(cls: Any, name: str, label: str | None) -> None:
        fn = getattr(cls, name)

        def timed(self: Any, *a: Any, **k: Any) -> Any:
            t = clock()
            try:
                return fn(self, *a, **k)
            finally:
                if label is None:
                    key = f"{type(self).__name__}.{type(a[0]).__name__}"
                elif label.endswith(", by"):  # the thread's kind: tidal-ledger-1 -> ledger
                    parts = threading.current_thread().name.split("-")
                    key = f"{label} {parts[1] if len(parts) > 1 else 'caller'}"
                else:
                    key = label
                secs[key] += clock() - t
                calls[key] += 1

        setattr(cls, name, timed)

    wrap(Behaviour, "receive", None)
    for cls in (LedgerShard, MembershipShard, Persistence):  # Persistence: its commits
        wrap(cls, "on_idle", f"{cls.__name__}.on_idle")
    for name in ("get", "put", "put_reserved"):  # CPU in the queue's locks and wake-ups
        wrap(Mailbox, name, f"mailbox {name}, by")
    wrap(Adds, "add_columns", "ledger fold (add_columns)")
    wrap(ContributionLog, "append_columns", "ledger log append (append_columns)")
    ops = ("signal_batch", "assign_cohort", "leave_community_layer", "rejoin_community_layer")
    for op in (*ops, "request_community_purge", "rematerialize"):
        wrap(gen.BlockingOperations, op, f"caller {op}")
    return secs, calls


def one_round(scenario: Scenario, events: list[Any], parts: Parts | None = None) -> dict[str, Any]:
    """One `run_simulation` of ``scenario``; its figures."""
    got: dict[str, Any] = {}
    measured, apply_events = sim._apply_measured, sim.apply_events

    def timed_run(*a: Any, **k: Any) -> None:  # the runtime's measured run
        if parts is not None:
            parts[0].clear()
            parts[1].clear()
        before, c0 = _thread_cpu(), time.process_time()
        measured(*a, **k)
        got["process_cpu"] = time.process_time() - c0
        after = _thread_cpu()
        got["threads"] = {name: after[name] - before.get(name, 0.0) for name in after}
        if parts is not None:
            got["parts"] = (dict(parts[0]), dict(parts[1]))

    def timed_model(db: Any, *a: Any, **k: Any) -> Any:  # the model's run is one thread
        if getattr(db, "_core", None) is not None:
            return apply_events(db, *a, **k)
        c0 = time.thread_time()
        out = apply_events(db, *a, **k)
        got["model_cpu"] = time.thread_time() - c0
        return out

    sim._apply_measured, sim.apply_events = timed_run, timed_model  # type: ignore[assignment]
    try:
        # SIGINT handled as the command handles it: with Python's default handler the
        # main thread would not run the shards' work itself (`runtime.inline`)
        with StopOnSigint(), tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
            path = os.path.join(tmp, "store") if scenario.durable else None
            result = sim.run_simulation(
                scenario,
                lambda cfg, clk: TidalDb.open(path, config=cfg, clock=clk),
                reference=ReferenceModel,
                events=events,
            )
    finally:
        sim._apply_measured, sim.apply_events = measured, apply_events  # type: ignore[assignment]
    n = result.counts.signals
    got.update(
        signals=n,
        runtime_signals_per_s=n / result.runtime_s,
        model_signals_per_s=n / result.reference_s,
        ok=result.ok,
    )
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--breakdown", action="store_true", help="time each handler and call")
    ap.add_argument(
        "--scenario",
        default="default",
        choices=[*builtin_scenarios(), "all"],
        help="the built-in scenario to run (all: every one in turn)",
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help=f"as simulate --scale, for scenarios of more than {LARGE:,} signals only",
    )
    args = ap.parse_args()
    names = builtin_scenarios() if args.scenario == "all" else [args.scenario]
    if args.breakdown and len(names) > 1:
        ap.error("--breakdown times one scenario: name it with --scenario")
    parts = _time_parts() if args.breakdown else None
    out: dict[str, Any] = {}
    for name in names:
        figures = scenario_figures(name, args, parts)
        for key, value in figures.items():
            out[key if len(names) == 1 else f"{name}_{key}"] = value
    if len(names) > 1:
        for kind in ("wall", "cpu"):
            key = f"runtime_over_model_{kind}"
            low = min(names, key=lambda x: float(out[f"{x}_{key}"]))
            out[f"lowest_{key} ({low})"] = out[f"{low}_{key}"]
    report(out, args.json)


def scenario_figures(name: str, args: argparse.Namespace, parts: Parts | None) -> dict[str, Any]:
    """The medians over the rounds of one scenario's runs (see the module)."""
    scenario = load_scenario(name)
    scale = args.scale if scenario.signals > LARGE else 1.0
    scenario = scenario.scaled(scale) if scale != 1.0 else scenario
    events = generate_events(scenario)
    rounds = [one_round(scenario, events, parts) for _ in range(1 if args.quick else args.rounds)]
    n = rounds[0]["signals"]

    def med(fn: Any) -> float:
        return float(statistics.median(fn(r) for r in rounds))

    out: dict[str, Any] = {
        "scale": scale,  # the one applied
        "signals": n,
        "rounds": len(rounds),
        "runtime_signals_per_s": med(lambda r: r["runtime_signals_per_s"]),
        "model_signals_per_s": med(lambda r: r["model_signals_per_s"]),
        "runtime_over_model_wall": med(
            lambda r: r["runtime_signals_per_s"] / r["model_signals_per_s"]
        ),
        "runtime_cpu_us_a_signal": med(lambda r: r["process_cpu"] / n * 1e6),
        "model_cpu_us_a_signal": med(lambda r: r["model_cpu"] / n * 1e6),
        "runtime_over_model_cpu": med(lambda r: r["model_cpu"] / r["process_cpu"]),
    }
    for name in sorted(rounds[0]["threads"]):
        if name.startswith("tidal-") or name == "MainThread":
            out[f"{name}_cpu_us_a_signal"] = med(
                lambda r, name=name: r["threads"].get(name, 0.0) / n * 1e6
            )
    out["checks_ok"] = sum(1 for r in rounds if r["ok"])
    if parts is not None:  # each part's median, largest first: us a signal, us a call
        rows = []
        for label in {x for r in rounds for x in r["parts"][0]}:
            us = med(lambda r, x=label: r["parts"][0].get(x, 0.0) / n * 1e6)
            per = med(lambda r, x=label: r["parts"][0].get(x, 0.0) / r["parts"][1].get(x, 1) * 1e6)
            rows.append((us, per, label))
        for us, per, label in sorted(rows, reverse=True):
            if us >= 0.05:
                out[f"{label}_us_a_signal"] = us
                out[f"{label}_us_a_call"] = per
    return out


if __name__ == "__main__":
    main()
