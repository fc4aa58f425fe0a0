"""``tidal-actors replay``: apply an event log, each row at its own ``ts_ns``.

Owns the command's options and its run: the rows read (`eventlog.log`), applied in
batches, purged cohorts rebuilt in event time (`eventlog.rebuilds`); what it writes
out (the ``--scores-out`` CSV, the ``--report-out`` JSON) is `replay_outputs`'. The rules that keep a store
safe across runs (``--append``, ``--skip-rows``) are in `safety`, the data
directory and its settings file in `store`, the printed summary in `summary`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tidal_actors._clock import ManualClock
from tidal_actors._config import HOSTS
from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument, TidalError
from tidal_actors._text import plural
from tidal_actors.cli import store
from tidal_actors.cli.group import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    Integer,
    data_dir_of,
    fail,
    write_json,
)
from tidal_actors.cli.progress import phase_bars, read_bar, with_progress
from tidal_actors.cli.replay_outputs import replay_report, write_scores
from tidal_actors.cli.safety import (
    PENDING_KEY,
    RowFeed,
    check_replay_target,
    go_on_command,
    rebuilds_from_state,
)
from tidal_actors.cli.summary import print_replay_summary
from tidal_actors.cli.timepoints import FORMS, parse_time
from tidal_actors.loadsim.interrupt import EXIT_INTERRUPTED, STOP_NOTICE, StopOnSigint

if TYPE_CHECKING:
    from tidal_actors.eventlog.log import EventLogError

__all__ = ["duration_option", "replay", "time_point_option"]


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
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


def time_point_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Option callback: check a `timepoints` form early (an offset is resolved later)."""
    if value is not None:
        try:
            parse_time(value, "--at", 2**62)
        except InvalidArgument as exc:
            raise click.BadParameter(f"{value!r}: {exc.reason}", ctx, param) from None
    return value


def _delta(after: dict[str, int], before: dict[str, int], name: str) -> int:
    """How much counter ``name`` grew from ``before`` to ``after`` (``stats()``)."""
    return int(after.get(name, 0)) - int(before.get(name, 0))


@click.command()
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
    help="Add the log to the store already in --data-dir. Its settings are kept: "
    "--config or a flag giving a setting the store records another value is refused. "
    "Without it such a directory is refused: replaying a log into a store "
    "that holds it applies every row again.",
)
@click.option(
    "--skip-rows",
    type=Integer(min=0),
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
    callback=duration_option,
    help="Decay half-life, e.g. 7d (overrides --config).",
)
@click.option(
    "--window-width",
    metavar="DURATION",
    callback=duration_option,
    help="Window bucket width, e.g. 1h.",
)
@click.option("--window-buckets", type=Integer(min=1), metavar="N", help="Buckets per window read.")
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    callback=time_point_option,
    help=f"Read --scores-out at this time: {FORMS}. Default: the log's last ts_ns; "
    "the store's last event time when no row is replayed (an offset is from it).",
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
    type=Integer(min=1),
    default=1024,
    show_default=True,
    metavar="N",
    help="Longest run of signals sent in one signal_batch call.",
)
@click.option(
    "--host",
    type=click.Choice(HOSTS),
    help="Where the actors run: pykka (threads in this process) or ray (one Ray actor "
    "each; needs the 'ray' extra; RAY_ADDRESS or --config's ray_address picks the "
    "cluster, else Ray joins the latest cluster started on this machine: on a machine "
    "others use, set RAY_ADDRESS=local). Default: the settings' host (pykka).",
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
    host: str | None,
    quiet: bool,
) -> None:
    """Apply the event log EVENTS.csv, each row at its own ts_ns.

    The format is ts_ns,op,user_id,cohort,entity_id,signal_type,weight with ops
    assign, signal, leave, rejoin, purge (see docs/cli.md). A bad row stops the replay
    with exit status 2; every row before it stays applied (and durable with
    --data-dir). Ctrl-C stops it at a row boundary with exit status 130, the store
    flushed and closed, and prints how to go on (--skip-rows N --append).
    Durations: 90d, 12h, 30m, 15s, 250ms or integer nanoseconds.
    """
    # the runtime is imported here, when the command runs, not for `--help`
    from tidal_actors.eventlog.log import ApplyCounts, EventLogError, EventLogReader, apply_events

    data_dir = data_dir_of(ctx, data_dir)
    store.check_outputs({"--scores-out": scores_out, "--report-out": report_out})
    check_replay_target(data_dir, append)
    config = store.build_config(
        data_dir, config_file, half_life, window_width, window_buckets, append, host
    )
    state = store.read_state(data_dir) if data_dir is not None and data_dir.is_dir() else {}
    try:
        # purged cohorts are rebuilt in event time (see eventlog.rebuilds), not by the
        # runtime's wall-clock timer, which the replay's database has off
        rebuilds = rebuilds_from_state(config.rematerialize_after_ms, state)
    except InvalidArgument as exc:
        fail(
            f"{data_dir / store.STATE_FILE if data_dir else store.STATE_FILE}: {exc}",
            EXIT_BAD_INPUT,
        )
    reader = EventLogReader(events, skip_invalid=skip_invalid)
    try:  # a bad header is refused before anything is opened or made: no summary of 0 rows
        reader.check_header()
    except EventLogError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:
        fail(f"cannot read {events}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    if data_dir is not None:
        store.make_data_dir(data_dir)
    clock = ManualClock(0)
    counts = ApplyCounts()
    error: EventLogError | None = None
    scores_written: int | None = None
    source = f"replay {events}"
    stop = StopOnSigint(STOP_NOTICE)
    with stop:
        try:
            size = events.stat().st_size
            phase = phase_bars(quiet, f"replay {events.name}: ")
            # where this run's actors run (--host, in `config`) is not kept with the store
            run_config = config.replace(rematerialize_after_ms=None)
            with store.opened(data_dir, run_config, clock, phase) as db:
                if data_dir is not None:  # before the first row: it survives a kill
                    store.write_state(data_dir, config, None, source)
                before = dict(db.stats())
                started = time.perf_counter()
                # rows are not known before the end: the bar is the file's bytes read
                with read_bar(size, "B", quiet, f"{events.name}: bytes of the file read") as bar:
                    feed = RowFeed(
                        with_progress(reader, bar, lambda: reader.bytes_read),
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
                # the last event time: this run's, else (no row replayed) the store's
                last = state.get("last_event_ns")
                end = (
                    counts.max_ts_ns
                    if counts.max_ts_ns is not None
                    else last
                    if isinstance(last, int)
                    else clock.now_ns()
                )
                with phase("flush, and the rebuilds still due", None, ""):
                    db.flush()
                    if complete:
                        # the rebuilds still due run now, each at its due event time: the
                        # scores written and the store left do not depend on the replay's speed
                        rebuilds.finish(db, clock, end)
                elapsed = time.perf_counter() - started
                after = dict(db.stats())
                at = end if at_text is None else parse_time(at_text, "--at", end)
                if scores_out is not None and complete:
                    with phase("write the scores", None, ""):
                        scores_written = write_scores(scores_out, db.aggregate_rows(at))
            # a bad row met while skipping is where the rows applied end
            next_skip = (feed.skipped if error else skip_rows) + counts.rows
            if data_dir is not None:
                extra: dict[str, object] = {PENDING_KEY: rebuilds.pending()}
                if complete:
                    extra["stopped"] = None
                elif counts.rows:  # a run that applied nothing leaves the position as it was
                    why = "bad row" if error else "interrupted" if feed.cut else "short log"
                    extra["stopped"] = {"after_rows": next_skip, "why": why}
                store.write_state(data_dir, config, counts.max_ts_ns, source, **extra)
        except OSError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except InvalidArgument as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except TidalError as exc:
            fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED)

    report = replay_report(
        events=events,
        data_dir=data_dir,
        host=run_config.host,
        counts=counts,
        skipped_first_rows=feed.skipped,
        delta=lambda name: _delta(after, before, name),
        skipped_rows=reader.skipped,
        at=at,
        elapsed=elapsed,
        error=error,
        interrupted=feed.cut,
        next_skip_rows=None if complete else next_skip,
        rematerializations=rebuilds.done,
    )
    if report_out is not None:
        write_json(report_out, report)

    outputs = {"--scores-out": scores_out, "--report-out": report_out}
    if error is not None and feed.skipped < skip_rows and data_dir is not None:
        fail(  # the user meant to step over this row by count: say how to
            f"{error}. --skip-rows counts valid rows and does not step over an invalid "
            f"one, so nothing was applied. Fix {error.path}:{error.line}, then: "
            + go_on_command(events, data_dir, next_skip, False, outputs)
            + "; or skip invalid rows: "
            + go_on_command(events, data_dir, next_skip, True, outputs),
            EXIT_BAD_INPUT,
        )
    go_on: str | None = None
    if not complete and not feed.short:
        go_on = (
            (f"fix {error.path}:{error.line}, then: " if error is not None else "")
            + go_on_command(
                events,
                data_dir,
                next_skip,
                skip_invalid,
                outputs,
            )
            if data_dir is not None
            else "nothing was kept (no --data-dir): replay the whole log again"
        )
    if feed.short:  # nothing was replayed: the error below says why, no summary of it
        fail(
            f"invalid --skip-rows={skip_rows}: the log has only {feed.skipped:,} rows",
            EXIT_BAD_INPUT,
        )
    print_replay_summary(
        click.echo,
        report,
        skip_errors=reader.skip_errors,
        scores_written=scores_written,
        scores_out=scores_out,
        report_out=report_out,
        complete=complete,
        waiting=len(rebuilds.pending()),
        go_on=go_on,
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
    if feed.cut:
        click.echo(
            f"tidal-actors: interrupted after {plural(next_skip, 'row')} of {events}", err=True
        )
        sys.exit(EXIT_INTERRUPTED)
