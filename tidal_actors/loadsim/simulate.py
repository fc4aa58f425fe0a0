"""Seeded load simulation with a differential check against a reference model.

:func:`run_simulation` generates a scenario's rows (`generator`), applies them to
the runtime while measuring it (`measure`: the latency of every call, throughput
and latency over time, peak memory and memory per retained contribution, restore
time, a close and reopen in the middle when the scenario asks for one), then applies
the same rows to the reference model and compares what both answer (`check`). It
opens no database itself and imports no reference model: the caller passes a
factory for each (``open_db`` and ``reference``), so the command line decides where
the runtime's data lives and which oracle judges it.

The names of the modules below are importable from here too: scenarios
(`scenario`), the generator, the check, the measurements and the result
(`report`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors.eventlog.log import (
    ApplyCounts,
    EventRow,
    EventSink,
    PurgeRow,
    apply_events,
    settle_rematerializations,
)
from tidal_actors.loadsim.check import (
    REL_TOL,
    CheckResult,
    Oracle,
    Readable,
    ReferenceFactory,
    compare_states,
    differences,
    figures,
)
from tidal_actors.loadsim.generator import generate_events
from tidal_actors.loadsim.interrupt import Interrupted, until_stopped
from tidal_actors.loadsim.measure import (
    LATENCY_OPS,
    Latency,
    PeakRss,
    settled_rss,
    structure_bytes,
)
from tidal_actors.loadsim.phases import PhaseFn, Tick, no_phase, ticking
from tidal_actors.loadsim.plot import plot_timeline
from tidal_actors.loadsim.report import SimulationResult
from tidal_actors.loadsim.scenario import (
    Scenario,
    SignalTypeSpec,
    builtin_scenarios,
    load_scenario,
)
from tidal_actors.loadsim.setup import set_up

__all__ = [
    "LATENCY_OPS",
    "REL_TOL",
    "CheckResult",
    "Latency",
    "Oracle",
    "ReferenceFactory",
    "Scenario",
    "SignalTypeSpec",
    "SimulationResult",
    "builtin_scenarios",
    "compare_states",
    "generate_events",
    "load_scenario",
    "plot_timeline",
    "run_simulation",
]

_COUNTERS = ("signals", "forwarded", "gated", "records", "purges", "retracted")
"""Counters summed over the runs of a store closed and reopened in the middle."""


class _Db(EventSink, Readable, Protocol):
    def flush(self) -> None: ...

    def close(self) -> None: ...


def _apply_measured(
    db: _Db,
    rows: Iterable[EventRow],
    clock: ManualClock,
    batch_size: int,
    counts: ApplyCounts,
    latency: Latency,
) -> None:
    """:func:`~tidal_actors.eventlog.log.apply_events`, timing every call into ``latency``."""
    apply_events(db, rows, clock, batch_size=batch_size, counts=counts, on_call=latency.record)


def run_simulation(
    scenario: Scenario,
    open_db: Callable[[Config, ManualClock], Any],
    *,
    reference: ReferenceFactory,
    events: list[EventRow] | None = None,
    progress: Callable[[Iterable[EventRow]], Iterator[EventRow]] | None = None,
    interval_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    phase: PhaseFn | None = None,
) -> SimulationResult:
    """Run ``scenario`` through the runtime, measuring it, then through the reference
    model, and compare them.

    Order: the rows go through the runtime first (timing every call; closing and
    reopening the store after ``scenario.restart_at`` of them, if set, and checking
    that every figure is kept), the memory is measured, then the reference model
    takes the same rows and both are compared. With ``scenario.durable`` the store is
    then closed and reopened once more (the restore time) and checked again.

    Args:
        scenario: what to generate.
        open_db: ``(config, clock) -> db``; the runtime under test (a ``TidalDb``
            opened with that config and clock). Called again to reopen the same
            store; the last one opened is flushed and closed here.
        reference: ``(config=, clock=, history=) -> model``; the oracle the runtime is
            checked against (``tidal_actors.testing.ReferenceModel``), built once
            with the run's config, its own clock, and ``history`` False when the
            runtime is ephemeral (no history to re-materialize from).
        events: the rows to apply, if already generated (default: generate them).
        progress: wraps the row iterable of the runtime's run (for a progress bar);
            with ``phase``, unused.
        interval_s: the timeline's interval (wall seconds; None: chosen from the
            run's length, see `timeline.resolution`).
        stop: checked before each row (of both passes): once it returns True the run
            stops at that row boundary and raises :class:`Interrupted`.
        phase: told of each phase (set-up, the run, flushing and measuring, the
            reference model, the check, closing and reopening the store) with its
            size, and of the units done (`phases.PhaseFn`), for a progress display.

    Returns:
        A :class:`SimulationResult`; ``result.ok`` tells whether everything agreed.

    Raises:
        TidalError: from the runtime (an InvalidArgument would mean a generator bug).
        Interrupted: ``stop()`` became true; the runtime's database is flushed and
            closed first (``.rows`` rows applied to it; ``.phase`` ``"check"`` if
            they all were and the comparison did not run).
    """
    if events is None:
        events = generate_events(scenario)
    config = scenario.build_config()
    at_ns = max((r.ts_ns for r in events), default=scenario.start_ns)
    users = sorted({r.user_id for r in events})
    if scenario.check_users and len(users) > scenario.check_users:
        users = sorted(random.Random(scenario.seed).sample(users, scenario.check_users))

    baseline = settled_rss()
    sampler = PeakRss()
    sampler.start()
    clock = ManualClock(scenario.start_ns)
    counts = ApplyCounts()
    latency = Latency(interval_s)
    earlier: dict[str, int] = {}
    restart: dict[str, Any] | None = None
    split = len(events) if scenario.restart_at is None else int(len(events) * scenario.restart_at)
    # the cohort of each purge row (None for other rows), by row index
    purged = [r.cohort if isinstance(r, PurgeRow) else None for r in events]
    halt = stop if stop is not None else (lambda: False)
    watch: PhaseFn = phase if phase is not None else no_phase
    rows: Iterable[EventRow] = (
        progress(events) if progress is not None and phase is None else events
    )
    parts = until_stopped(rows, halt)
    with watch("open the store" if scenario.durable else "open", None, ""):
        db: _Db = open_db(config, clock)
    run_bar = contextlib.ExitStack()
    try:
        setup_s = 0.0
        done = 0
        if scenario.assign_upfront:
            t = time.perf_counter()
            done = set_up(db, events, clock, counts, parts, watch)
            setup_s = time.perf_counter() - t
            latency = Latency(interval_s)  # the measured load starts now
        # what is alive now (the generated rows above all: millions of tracked objects
        # at full size) is frozen for the measured run, so that the full collections
        # during it walk what the run creates, not the load generator's rows
        gc.collect()
        gc.freeze()
        run_bar.callback(gc.unfreeze)
        tick = run_bar.enter_context(watch("run (measured)", len(events) - done, "row"))
        latency.start()
        started = time.perf_counter()
        paused = 0.0
        _apply_measured(
            db,
            ticking(itertools.islice(parts, max(0, split - done)), tick),
            clock,
            scenario.batch_size,
            counts,
            latency,
        )
        if counts.rows < split:  # only a stop cuts the rows short
            raise Interrupted(counts.rows, "runtime", counts)
        if scenario.restart_at is not None:
            pause = time.perf_counter()
            latency.mark("restart")  # the pause: flush, settle, compare, close, reopen
            db.flush()
            settle_rematerializations(db, purged[:split])
            now = counts.max_ts_ns if counts.max_ts_ns is not None else scenario.start_ns
            before = figures(db, now, users)
            earlier = dict(db.stats())
            with watch("restart: close and reopen the store", None, ""):
                db.close()
                t = time.perf_counter()
                db = open_db(config, clock)
                restore = time.perf_counter() - t
            after = figures(db, now, users)
            restart = {
                "after_rows": counts.rows,
                "restore_s": restore,
                "differences": differences(before, after),
            }
            del before, after
            paused = time.perf_counter() - pause
            latency.mark("resumed")
            _apply_measured(db, ticking(parts, tick), clock, scenario.batch_size, counts, latency)
            if counts.rows < len(events):
                raise Interrupted(counts.rows, "runtime", counts)
        db.flush()
        runtime_s = time.perf_counter() - started - paused
        run_bar.close()
        latency.close_window()
        run_bar.enter_context(watch("measure memory", None, ""))
        peak = sampler.stop()
        stats = dict(db.stats())
        for name in _COUNTERS:
            if name in earlier:
                stats[name] = stats.get(name, 0) + earlier[name]
        end = settled_rss()
        # the log trims evicted records lazily: at most the cap are retained
        retained = min(int(stats.get("log_records", 0)), config.max_contribution_log_entries)
        memory: dict[str, Any] = {
            "baseline_rss": baseline,
            "peak_rss": peak,
            "end_rss": end,
            "peak_bytes": peak - baseline,
            "end_bytes": end - baseline,
            "retained_records": retained,
            "bytes_per_retained_record": (end - baseline) / retained if retained else None,
        }
        parts_bytes = structure_bytes(db)
        if parts_bytes is not None:
            memory["structures"] = parts_bytes
            memory["structure_bytes_per_retained_record"] = (
                sum(parts_bytes.values()) / retained if retained else None
            )
        run_bar.close()

        ref_clock = ManualClock(scenario.start_ns)
        # an ephemeral runtime has no history to re-materialize from: nor has the model
        durable = bool(getattr(getattr(getattr(db, "_core", None), "store", None), "durable", True))
        ref = reference(config=config, clock=ref_clock, history=durable)
        with watch("reference model (single-threaded)", len(events), "row") as tick:
            t = time.perf_counter()
            ref_rows = apply_events(
                ref,
                ticking(until_stopped(events, halt), tick),
                ref_clock,
                batch_size=scenario.batch_size,
            ).rows
            if ref_rows < len(events):
                raise Interrupted(counts.rows, "check", counts)
            reference_s = time.perf_counter() - t
        if halt():  # asked during the model's last rows: stop before the comparison
            raise Interrupted(counts.rows, "check", counts)
        with watch("check: rebuild purged cohorts", None, ""):
            settle_rematerializations(db, purged)
            settle_rematerializations(ref, purged)
        with watch("check: compare with the reference model", len(users), "user") as tick:

            def tick_or_stop(n: int, tick: Tick = tick) -> None:
                if halt():  # asked during the comparison: it stops after this user
                    raise Interrupted(counts.rows, "check", counts)
                tick(n)

            check = compare_states(db, ref, at_ns, users, stats, tick_or_stop)
        del ref

        restore_s: float | None = None
        reopen_differences: list[str] = []
        if scenario.durable:
            with watch("close and reopen the store (restore time)", None, ""):
                before = figures(db, at_ns, users)
                db.close()
                t = time.perf_counter()
                db = open_db(config, clock)
                restore_s = time.perf_counter() - t
                reopen_differences = differences(before, figures(db, at_ns, users))
    finally:
        run_bar.close()
        if sampler.is_alive():
            sampler.stop()
        with watch("close", None, ""):
            db.close()
    return SimulationResult(
        scenario,
        len(events),
        counts,
        runtime_s,
        reference_s,
        stats,
        at_ns,
        check,
        latency.summary(),
        latency.timeline,
        latency.marks,
        memory,
        restore_s,
        restart,
        reopen_differences,
        setup_s,
        latency.points(),
    )
