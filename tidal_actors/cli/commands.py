"""The ``tidal-actors`` command line: ``replay``, ``inspect`` and ``simulate``.

Owns argument parsing (click), progress bars (tqdm, on standard error), the printed
summaries, the ``--scores-out`` / ``--report-out`` files and the exit codes: 0 ok,
2 bad input (a bad row, argument, config or scenario), 1 the run failed (the check
of ``simulate`` found a difference, or the runtime raised), 130 stopped by Ctrl-C
(SIGINT) at a row boundary. It holds no semantics: rows are read and applied by
``_eventlog``, scenarios by ``_simulate``, purged cohorts rebuilt in event time by
``_rebuilds``, every database is opened by :func:`_open_db`; ``_cli_replay`` holds
the rules that keep a store safe across runs (``--append``, ``--skip-rows``).

A data directory written by ``replay`` or ``simulate`` also holds
``tidal-actors-cli.json`` (written before the first row): the settings it was
written with and the last event time, so that ``inspect`` reads scores with the
right half-lives at the right time and a later ``replay --append`` into the same
directory keeps its settings unless told otherwise; and, after a stopped run, where
it stopped and (replay) the purged cohorts still waiting for their rebuild.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from tqdm import tqdm

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument, TidalError
from tidal_actors._text import plural
from tidal_actors.cli.group import TOP_DATA_DIR_HELP, Group, closed_pipe, data_dir_of
from tidal_actors.cli.inspect import inspect
from tidal_actors.cli.progress import phase_bars
from tidal_actors.cli.replay import (
    PENDING_KEY,
    STATE_FILE,
    RowFeed,
    check_replay_target,
    go_on_command,
    holds_store,
    rebuilds_from_state,
    report_interrupted_simulation,
    simulate_target_refusal,
)
from tidal_actors.cli.simulate import print_summary
from tidal_actors.cli.timepoints import FORMS, parse_time
from tidal_actors.eventlog.log import (
    ApplyCounts,
    EventLogError,
    EventLogReader,
    EventRow,
    apply_events,
)
from tidal_actors.loadsim.interrupt import EXIT_INTERRUPTED, STOP_NOTICE, Interrupted, StopOnSigint
from tidal_actors.loadsim.phases import PhaseFn

__all__ = ["cli", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
SCORES_HEADER = (
    "cohort",
    "entity_id",
    "signal_type",
    "decay_score",
    "window_count",
    "window_weight",
)
_PROGRESS_EVERY = 1024  # rows between progress-bar updates


# ---------------------------------------------------------------- helpers


def _open_db(
    data_dir: Path | None, config: Config, clock: ManualClock, read_only: bool = False
) -> Any:
    """Open the runtime: ``TidalDb`` on ``data_dir`` (None: ephemeral, nothing on disk);
    ``read_only`` (inspect): one read of the store, beside a writer if there is one,
    with the settings the store records; nothing is written (`_readonly`)."""
    from tidal_actors.facades.blocking import TidalDb

    if read_only and data_dir is not None:
        return TidalDb.open(os.fspath(data_dir), config=config, clock=clock, read_only=True)
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    return TidalDb.open(
        os.fspath(data_dir) if data_dir is not None else None, config=config, clock=clock
    )


@contextlib.contextmanager
def _opened(
    data_dir: Path | None, config: Config, clock: ManualClock, phase: PhaseFn
) -> Iterator[Any]:
    """:func:`_open_db`, its open and its close (a restore, a snapshot) shown as phases."""
    with phase("open the store" if data_dir is not None else "open", None, ""):
        db = _open_db(data_dir, config, clock)
    try:
        yield db
    finally:
        with phase("close the store" if data_dir is not None else "close", None, ""):
            db.close()


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"tidal-actors: error: {message}", err=True)
    sys.exit(code)


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Option callback: a duration (90d, 12h, 30m, 15s, 250ms, plain ns) as int ns > 0."""
    if value is None:
        return None
    try:
        ns = parse_duration(value, f"--{(param.name or 'duration').replace('_', '-')}")
    except InvalidArgument as exc:
        raise click.BadParameter(f"{value!r}: {exc.reason}", ctx, param) from None
    if ns <= 0:
        raise click.BadParameter(f"{value!r}: must be positive", ctx, param)
    return ns


def _time_point(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Option callback: check a `_timepoints` form early (an offset is resolved later)."""
    if value is not None:
        try:
            parse_time(value, "--at", 2**62)
        except InvalidArgument as exc:
            raise click.BadParameter(f"{value!r}: {exc.reason}", ctx, param) from None
    return value


TIMESTAMP = click.IntRange(0, 2**63 - 1)
ID = click.IntRange(0, 2**64 - 1)


def _iso(ns: int | None) -> str:
    """``ns`` (int ns since the epoch) as a UTC time to the millisecond, for people."""
    if ns is None:
        return "-"
    moment = _dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=_dt.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ns // 1_000_000 % 1000:03d} UTC"


def _stamp(ns: int | None) -> str:
    return "-" if ns is None else f"{ns} ({_iso(ns)})"


def _read_state(data_dir: Path) -> dict[str, Any]:
    try:
        with open(data_dir / STATE_FILE, encoding="utf-8") as fh:
            state = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _fail(f"{data_dir / STATE_FILE}: unreadable ({exc})", EXIT_BAD_INPUT)
    return state if isinstance(state, dict) else {}


def _write_state(
    data_dir: Path, config: Config, last_event_ns: int | None, source: str, **extra: Any
) -> None:
    """Write the settings file (atomically): ``config``, the last event time (int ns,
    never moved back), what wrote it, and ``extra`` keys (a None value removes one)."""
    state = _read_state(data_dir)
    previous = state.get("last_event_ns")
    if isinstance(previous, int) and (last_event_ns is None or previous > last_event_ns):
        last_event_ns = previous
    state.update(
        format=1, config=dataclasses.asdict(config), last_event_ns=last_event_ns, source=source
    )
    for key, value in extra.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    tmp = data_dir / (STATE_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, data_dir / STATE_FILE)


def _stored_config(data_dir: Path | None) -> Config | None:
    if data_dir is None or not data_dir.is_dir():
        return None
    mapping = _read_state(data_dir).get("config")
    if not isinstance(mapping, dict):
        return None
    try:
        return Config.from_mapping(mapping)
    except InvalidArgument as exc:
        _fail(f"{data_dir / STATE_FILE}: {exc}", EXIT_BAD_INPUT)


def _build_config(
    data_dir: Path | None,
    config_file: Path | None,
    half_life: int | None,
    window_width: int | None,
    window_buckets: int | None,
) -> Config:
    """Settings: ``--config`` file, else the data directory's, else defaults; then flags."""
    try:
        if config_file is not None:
            config = Config.from_toml(config_file)
        else:
            config = _stored_config(data_dir) or Config()
        changes: dict[str, Any] = {}
        if half_life is not None:
            changes["half_life_ns"] = half_life
        if window_width is not None:
            changes["window_width_ns"] = window_width
        if window_buckets is not None:
            changes["window_buckets"] = window_buckets
        return config.replace(**changes) if changes else config
    except InvalidArgument as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _bar(total: int, unit: str, quiet: bool, desc: str) -> tqdm[Any]:
    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        disable=quiet or not sys.stderr.isatty(),
        leave=False,
        dynamic_ncols=True,
    )


def _with_progress(
    rows: Iterable[EventRow], bar: tqdm[Any], position: Any = None
) -> Iterator[EventRow]:
    """Yield ``rows``, moving ``bar`` every few rows (to ``position()``, the bytes of
    the file read, or by count) and showing the rows so far beside it."""
    n = 0
    for row in rows:
        yield row
        n += 1
        if n % _PROGRESS_EVERY == 0:
            bar.set_postfix_str(f"{n:,} rows", refresh=False)
            bar.update((position() if position else n) - bar.n)
    bar.set_postfix_str(f"{n:,} rows", refresh=False)
    bar.update((position() if position else n) - bar.n)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        _fail(f"cannot write {path}: {exc}", EXIT_BAD_INPUT)


def _write_scores(path: Path, rows: Iterable[tuple[str, int, int, float, int, float]]) -> int:
    n = 0
    try:
        with open(path, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(SCORES_HEADER)
            for cohort, entity_id, signal_type, score, count, weight in rows:
                writer.writerow(
                    (
                        cohort,
                        entity_id,
                        signal_type,
                        repr(float(score)),
                        int(count),
                        repr(float(weight)),
                    )
                )
                n += 1
    except OSError as exc:
        _fail(f"cannot write {path}: {exc}", EXIT_BAD_INPUT)
    return n


def _delta(after: dict[str, int], before: dict[str, int], name: str) -> int:
    return int(after.get(name, 0)) - int(before.get(name, 0))


# ---------------------------------------------------------------- commands


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tidal_actors", prog_name="tidal-actors")
@click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), help=TOP_DATA_DIR_HELP
)
def cli(data_dir: Path | None) -> None:
    """tidal-actors: replay engagement logs, inspect a store, run simulations.

    Exit status: 0 ok, 2 bad input (a bad row, argument, config or scenario),
    1 the run failed (simulate's check found a difference, or the runtime failed),
    130 stopped by Ctrl-C (replay and simulate stop at a row boundary, the store
    flushed and closed).
    """


@cli.command()
@click.argument(
    "events", metavar="EVENTS.csv", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Store the state here (created if absent) instead of an ephemeral store. "
    "It must be new or empty, or hold a store and --append be given.",
)
@click.option(
    "--append",
    is_flag=True,
    help="Add the log to the store already in --data-dir (its settings are kept). "
    "Without it such a directory is refused: replaying a log into a store "
    "that holds it applies every row again.",
)
@click.option(
    "--skip-rows",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Skip the first N rows of the log (rows as the summary counts them), e.g. "
    "to go on after a stopped replay with --append.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Settings file (as config/default.toml). Default: the data directory's "
    "settings from an earlier run, else the defaults.",
)
@click.option(
    "--half-life",
    metavar="DURATION",
    callback=_duration,
    help="Decay half-life, e.g. 7d (overrides --config).",
)
@click.option(
    "--window-width", metavar="DURATION", callback=_duration, help="Window bucket width, e.g. 1h."
)
@click.option(
    "--window-buckets", type=click.IntRange(min=1), metavar="N", help="Buckets per window read."
)
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    callback=_time_point,
    help=f"Read --scores-out at this time: {FORMS}. Default: the log's last ts_ns "
    "(an offset is from it).",
)
@click.option(
    "--scores-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every aggregate row (cohort, entity, type) as CSV here.",
)
@click.option(
    "--report-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write counts and timing as JSON here.",
)
@click.option("--skip-invalid", is_flag=True, help="Skip and count bad rows instead of stopping.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    metavar="N",
    help="Longest run of signals sent in one signal_batch call.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.pass_context
def replay(
    ctx: click.Context,
    events: Path,
    data_dir: Path | None,
    append: bool,
    skip_rows: int,
    config_file: Path | None,
    half_life: int | None,
    window_width: int | None,
    window_buckets: int | None,
    at_text: str | None,
    scores_out: Path | None,
    report_out: Path | None,
    skip_invalid: bool,
    batch_size: int,
    quiet: bool,
) -> None:
    """Apply the event log EVENTS.csv, each row at its own ts_ns.

    The format is ts_ns,op,user_id,cohort,entity_id,signal_type,weight with ops
    assign, signal, leave, rejoin, purge (see the README). A bad row stops the replay
    with exit status 2; every row before it stays applied (and durable with
    --data-dir). Ctrl-C stops it at a row boundary with exit status 130, the store
    flushed and closed, and prints how to go on (--skip-rows N --append).
    Durations: 90d, 12h, 30m, 15s, 250ms or integer nanoseconds.
    """
    data_dir = data_dir_of(ctx, data_dir)
    check_replay_target(data_dir, append)
    config = _build_config(data_dir, config_file, half_life, window_width, window_buckets)
    state = _read_state(data_dir) if data_dir is not None and data_dir.is_dir() else {}
    try:
        # purged cohorts are rebuilt in event time (see _rebuilds), not by the
        # runtime's wall-clock timer, which the replay's database has off
        rebuilds = rebuilds_from_state(config.rematerialize_after_ms, state)
    except InvalidArgument as exc:
        _fail(f"{data_dir / STATE_FILE if data_dir else STATE_FILE}: {exc}", EXIT_BAD_INPUT)
    clock = ManualClock(0)
    reader = EventLogReader(events, skip_invalid=skip_invalid)
    counts = ApplyCounts()
    error: EventLogError | None = None
    scores_written: int | None = None
    source = f"replay {events}"
    stop = StopOnSigint(STOP_NOTICE)
    with stop:
        try:
            size = events.stat().st_size
            phase = phase_bars(quiet, f"replay {events.name}: ")
            with _opened(data_dir, config.replace(rematerialize_after_ms=None), clock, phase) as db:
                if data_dir is not None:  # before the first row: it survives a kill
                    _write_state(data_dir, config, None, source)
                before = dict(db.stats())
                started = time.perf_counter()
                # rows are not known before the end: the bar is the file's bytes read
                with _bar(size, "B", quiet, f"{events.name}: bytes of the file read") as bar:
                    feed = RowFeed(
                        _with_progress(reader, bar, lambda: reader.bytes_read),
                        skip_rows,
                        stop.requested,
                    )
                    try:
                        apply_events(
                            db, feed, clock, batch_size=batch_size, counts=counts, rebuilds=rebuilds
                        )
                    except EventLogError as exc:
                        error = exc
                complete = error is None and not feed.cut and not feed.short
                with phase("flush, and the rebuilds still due", None, ""):
                    db.flush()
                    if complete:
                        # the rebuilds still due run now, each at its due event time: the
                        # scores written and the store left do not depend on the replay's speed
                        last = state.get("last_event_ns")
                        end = (
                            counts.max_ts_ns
                            if counts.max_ts_ns is not None
                            else last
                            if isinstance(last, int)
                            else clock.now_ns()
                        )
                        rebuilds.finish(db, clock, end)
                elapsed = time.perf_counter() - started
                after = dict(db.stats())
                last_ts = counts.max_ts_ns or 0
                at = last_ts if at_text is None else parse_time(at_text, "--at", last_ts)
                if scores_out is not None and complete:
                    with phase("write the scores", None, ""):
                        scores_written = _write_scores(scores_out, db.aggregate_rows(at))
            next_skip = skip_rows + counts.rows
            if data_dir is not None:
                stopped = (
                    None
                    if complete
                    else {
                        "after_rows": next_skip,
                        "why": "bad row" if error else "interrupted" if feed.cut else "short log",
                    }
                )
                _write_state(
                    data_dir,
                    config,
                    counts.max_ts_ns,
                    source,
                    **{PENDING_KEY: rebuilds.pending(), "stopped": stopped},
                )
        except OSError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except InvalidArgument as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except TidalError as exc:
            _fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED)

    report = {
        "events": str(events),
        "data_dir": None if data_dir is None else str(data_dir),
        "rows": counts.rows,
        "skipped_first_rows": feed.skipped,
        "signals": counts.signals,
        "forwarded": _delta(after, before, "forwarded"),
        "gated": _delta(after, before, "gated"),
        "contribution_records": _delta(after, before, "records"),
        "purges": counts.purges,
        "retracted_records": _delta(after, before, "retracted"),
        "manifests": counts.manifests,
        "leaves": counts.leaves,
        "rejoins": counts.rejoins,
        "assigns": counts.assigns,
        "skipped_rows": reader.skipped,
        "first_ts_ns": counts.first_ts_ns,
        "last_ts_ns": counts.max_ts_ns,
        "rows_back_in_time": counts.back_in_time,
        "at_ns": at,
        "elapsed_s": elapsed,
        "signals_per_s": counts.signals / elapsed if elapsed > 0 else 0.0,
        "error": None if error is None else str(error),
        "interrupted": feed.cut,
        "next_skip_rows": None if complete else next_skip,
        "rematerializations": [[c, t] for c, t in rebuilds.done],
    }
    if report_out is not None:
        _write_json(report_out, report)

    out = click.echo
    verb = (
        "stopped at a bad row after" if error else "interrupted after" if feed.cut else "replayed"
    )
    out(
        f"{verb} {plural(counts.rows, 'row')} of {events} in {elapsed:.3f} s"
        + (f" (after skipping the first {feed.skipped:,})" if feed.skipped else "")
        + (f" ({plural(reader.skipped, 'invalid row')} skipped)" if reader.skipped else "")
    )
    out(
        f"  signals    {counts.signals:>10,}   forwarded {report['forwarded']:,}, "
        f"gated {report['gated']:,}   ({report['signals_per_s']:,.0f} signals/s)"
    )
    out(
        f"  control    assigns {counts.assigns:,}, leaves {counts.leaves:,}, "
        f"rejoins {counts.rejoins:,}, purges {counts.purges:,}"
    )
    out(
        f"  records    {plural(_delta(after, before, 'records'), 'contribution record')}, "
        f"{report['retracted_records']:,} retracted in {plural(counts.manifests, 'manifest')}"
    )
    out(
        f"  event time {_iso(counts.first_ts_ns)} .. {_iso(counts.max_ts_ns)}"
        + (
            f"; {plural(counts.back_in_time, 'row')} earlier than the row before "
            "(applied at their own ts_ns)"
            if counts.back_in_time
            else ""
        )
    )
    for err in reader.skip_errors:
        out(f"  skipped    {err}")
    if reader.skipped > len(reader.skip_errors):
        out(f"  skipped    ... and {reader.skipped - len(reader.skip_errors):,} more")
    if scores_written is not None:
        out(
            f"  scores     {plural(scores_written, 'aggregate row')} at {_stamp(at)} -> {scores_out}"
        )
    if report_out is not None:
        out(f"  report     {report_out}")
    out(
        f"  store      {data_dir if data_dir is not None else 'ephemeral'}"
        + (
            ""
            if complete or data_dir is None
            else f" (flushed and closed; {plural(len(rebuilds.pending()), 'purged cohort')} "
            "waiting for re-materialization)"
        )
    )
    if not complete and not feed.short:
        what = f"fix {error.path}:{error.line}, then: " if error is not None else ""
        out(
            "  to go on   "
            + (
                what
                + go_on_command(
                    events,
                    data_dir,
                    next_skip,
                    skip_invalid,
                    {"--scores-out": scores_out, "--report-out": report_out},
                )
                if data_dir is not None
                else "nothing was kept (no --data-dir): replay the whole log again"
            )
        )
    accepted = _delta(after, before, "signals")
    if accepted != counts.signals:
        click.echo(
            f"tidal-actors: warning: sent {counts.signals} signals, the database "
            f"counted {accepted}",
            err=True,
        )
    if error is not None:
        click.echo(f"tidal-actors: error: {error}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if feed.short:
        _fail(
            f"invalid --skip-rows={skip_rows}: the log has only {feed.skipped:,} rows",
            EXIT_BAD_INPUT,
        )
    if feed.cut:
        click.echo(
            f"tidal-actors: interrupted after {plural(next_skip, 'row')} of {events}", err=True
        )
        sys.exit(EXIT_INTERRUPTED)


# ---------------------------------------------------------------- inspect

cli.add_command(inspect)  # tidal_actors/_cli_inspect.py


# ---------------------------------------------------------------- simulate


@cli.command()
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
        _fail(str(exc), EXIT_BAD_INPUT)
    if seed is not None:
        scenario = scenario.with_seed(seed)
    if plot_out is not None:
        try:  # checked before the run, which can take many minutes
            import matplotlib  # noqa: F401
        except ImportError:
            _fail(
                "--plot needs matplotlib: pip install -e '.[plot]' (from the repository's folder)",
                EXIT_BAD_INPUT,
            )
    if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
        state = _read_state(data_dir) if holds_store(data_dir) else {}
        _fail(simulate_target_refusal(data_dir, state), EXIT_BAD_INPUT)
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
            _fail(f"cannot write {events_out}: {exc}", EXIT_BAD_INPUT)

    source = f"simulate {scenario.name} seed {scenario.seed}"

    def open_store(cfg: Config, clk: ManualClock) -> Any:
        db = _open_db(store, cfg, clk)
        if data_dir is not None and not (data_dir / STATE_FILE).exists():
            _write_state(data_dir, config, None, source)  # before the first row
        return db

    stop = StopOnSigint(STOP_NOTICE)
    with stop, contextlib.ExitStack() as stack:
        store = data_dir
        if store is None and scenario.durable:
            store = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tidal-simulate-")))
            store = store / "store"
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
                _write_state(
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
            report_interrupted_simulation(exc, len(events), data_dir, store)
            sys.exit(EXIT_INTERRUPTED)
        except InvalidArgument as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except TidalError as exc:
            _fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED)
    if data_dir is not None:
        _write_state(data_dir, config, result.at_ns, source, stopped=None)

    print_summary(click.echo, result, events, generated_s, data_dir, verbose, _iso)
    if report_out is not None:
        _write_json(report_out, result.report())
    if plot_out is not None:
        try:
            plot_timeline(result, plot_out)
        except InvalidArgument as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        click.echo(f"  plot       {plot_out}")
    if not result.ok:
        sys.exit(EXIT_FAILED)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``tidal-actors`` console script (exits with the status above).

    A second Ctrl-C (the first asks ``replay`` and ``simulate`` to stop at a row
    boundary) aborts at once, exit status 130: the store was not closed, and its next
    open restores it as after a crash (every flushed row is there)."""
    try:
        rv = cli.main(args=argv, prog_name="tidal-actors", standalone_mode=False)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
    except BrokenPipeError:
        closed_pipe()
    except (KeyboardInterrupt, click.exceptions.Abort):  # click turns the first into the second
        click.echo(
            "tidal-actors: aborted (Ctrl-C again): the store, if any, was not closed; "
            "its next open restores everything flushed, as after a crash",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(rv, int) and rv:  # ctx.exit(code) returns it when not standalone
        sys.exit(rv)


if __name__ == "__main__":
    main()
