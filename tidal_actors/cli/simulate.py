"""``tidal-actors simulate``: generate a seeded scenario, run it measured, and check
it against the reference model.

Owns the command's options and its run: the scenario loaded and scaled
(`loadsim.scenario`), the rows generated, the measured run and the check
(`loadsim.simulate.run_simulation`, given the runtime's factory and the oracle,
``tidal_actors.testing.ReferenceModel``), ``--events-out``, ``--report-out`` and
``--plot``. What it prints is in `summary`; the refusal of a directory that is not
empty and what a stopped run prints are in `safety`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import click

from tidal_actors._clock import ManualClock
from tidal_actors._config import HOSTS, Config
from tidal_actors._errors import InvalidArgument, TidalError
from tidal_actors.cli import store
from tidal_actors.cli.group import EXIT_BAD_INPUT, EXIT_FAILED, data_dir_of, fail, write_json
from tidal_actors.cli.progress import phase_bars
from tidal_actors.cli.safety import (
    holds_store,
    report_interrupted_simulation,
    simulate_target_refusal,
)
from tidal_actors.cli.summary import print_summary
from tidal_actors.cli.timepoints import iso
from tidal_actors.loadsim.interrupt import EXIT_INTERRUPTED, STOP_NOTICE, Interrupted, StopOnSigint

__all__ = ["simulate"]


@click.command()
@click.option(
    "--scenario",
    "scenario_name",
    metavar="FILE.toml|NAME",
    help="Scenario file, or a built-in name (default, small, eviction, steady, "
    "churn, purge-heavy, restart). Default: the built-in default scenario.",
)
@click.option(
    "--scale",
    type=float,
    default=1.0,
    show_default=True,
    metavar="F",
    help="Multiply users, entities, signals and the log cap by F (0.01: a quick run).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run the runtime on a store here (must be new or empty). A scenario "
    "with persistent = true or restart_at uses a temporary one otherwise.",
)
@click.option("--seed", type=int, metavar="N", help="Override the scenario's seed.")
@click.option(
    "--events-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the generated event log here (replayable).",
)
@click.option(
    "--report-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's figures (counts, throughput, latency percentiles, "
    "memory, restore time, the timeline, the check) as JSON here.",
)
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.png",
    help="Draw throughput and latency over the run (needs the 'plot' extra).",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print timings, counters and memory (--report-out has them all).",
)
@click.option(
    "--host",
    type=click.Choice(HOSTS),
    help="Where the runtime's actors run: pykka (threads in this process) or ray (one "
    "Ray actor each; needs the 'ray' extra; RAY_ADDRESS picks the cluster, else Ray "
    "joins the latest cluster started on this machine: on a machine others use, set "
    "RAY_ADDRESS=local). Default: the scenario's settings (pykka).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@click.pass_context
def simulate(
    ctx: click.Context,
    scenario_name: str | None,
    scale: float,
    data_dir: Path | None,
    seed: int | None,
    events_out: Path | None,
    report_out: Path | None,
    plot_out: Path | None,
    verbose: bool,
    host: str | None,
    quiet: bool,
) -> None:
    """Generate a seeded scenario, run it measured, and check it against the reference model.

    The rows go through the runtime (every call timed: p50/p99/p99.9 of signal
    acknowledgement, leave and purge; peak memory and memory per retained
    contribution; restore time on a store) and through the single-threaded reference
    model; every aggregate row, user status, leave history, cohort set and manifest
    must agree (floats to relative 1e-9), and a reopened store must answer exactly
    as before it closed. Exit status 1 if not.
    """
    import tempfile

    from tidal_actors.eventlog.log import write_events

    data_dir = data_dir_of(ctx, data_dir)
    # checked before the run, which can take many minutes
    store.check_outputs(
        {"--events-out": events_out, "--report-out": report_out, "--plot": plot_out}
    )
    from tidal_actors.loadsim.simulate import (
        generate_events,
        load_scenario,
        plot_timeline,
        run_simulation,
    )
    from tidal_actors.testing.reference import ReferenceModel

    try:
        scenario = load_scenario(scenario_name).scaled(scale)
    except InvalidArgument as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if seed is not None:
        scenario = scenario.with_seed(seed)
    if plot_out is not None:
        try:  # checked before the run, which can take many minutes
            import matplotlib  # noqa: F401
        except ImportError:
            fail(
                "--plot needs matplotlib: pip install -e '.[plot]' (from the repository's folder)",
                EXIT_BAD_INPUT,
            )
    if data_dir is not None and data_dir.is_dir() and any(data_dir.iterdir()):
        state = store.read_state(data_dir) if holds_store(data_dir) else {}
        fail(simulate_target_refusal(data_dir, state), EXIT_BAD_INPUT)
    if data_dir is not None:
        store.make_data_dir(data_dir)
    if data_dir is not None and not scenario.persistent:
        # a run on a store ends, like any persistent one, with a close and a timed reopen
        scenario = dataclasses.replace(scenario, persistent=True)
    config = scenario.build_config()

    phase = phase_bars(quiet, f"simulate {scenario.name}: ")
    started = time.perf_counter()
    with phase("generate the events", None, ""):
        events = generate_events(scenario)
    generated_s = time.perf_counter() - started
    if events_out is not None:
        try:
            write_events(events_out, events)
        except OSError as exc:
            fail(f"cannot write {events_out}: {exc}", EXIT_BAD_INPUT)

    source = f"simulate {scenario.name} seed {scenario.seed}"

    def open_store(cfg: Config, clk: ManualClock) -> Any:
        db = store.open_db(store_dir, cfg if host is None else cfg.replace(host=host), clk)
        if data_dir is not None and not (data_dir / store.STATE_FILE).exists():
            store.write_state(data_dir, config, None, source)  # before the first row
        return db

    stop = StopOnSigint(STOP_NOTICE)
    with stop, contextlib.ExitStack() as stack:
        store_dir = data_dir
        if store_dir is None and scenario.durable:
            store_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="tidal-simulate-"))
            )
            store_dir = store_dir / "store"
        try:
            result = run_simulation(
                scenario,
                open_store,
                reference=ReferenceModel,
                events=events,
                phase=phase,
                stop=stop.requested,
            )
        except Interrupted as exc:  # the store is flushed and closed
            if data_dir is not None:
                store.write_state(
                    data_dir,
                    config,
                    exc.counts.max_ts_ns,
                    source,
                    stopped={
                        "after_rows": exc.rows,
                        "of_rows": len(events),
                        "why": "interrupted",
                        "phase": exc.phase,
                    },
                )
            report_interrupted_simulation(exc, len(events), data_dir, store_dir)
            sys.exit(EXIT_INTERRUPTED)
        except InvalidArgument as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except TidalError as exc:
            fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED)
    if data_dir is not None:
        store.write_state(data_dir, config, result.at_ns, source, stopped=None)

    print_summary(
        click.echo, result, events, generated_s, data_dir, verbose, iso, host or config.host
    )
    if report_out is not None:
        write_json(report_out, result.report())
    if plot_out is not None:
        try:
            plot_timeline(result, plot_out)
        except InvalidArgument as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        click.echo(f"  plot       {plot_out}")
    if not result.ok:
        sys.exit(EXIT_FAILED)
