"""What ``tidal-actors replay`` and ``simulate`` print when they end.

Owns replay's summary (:func:`print_replay_summary`: rows, signals, control
operations, records, event time, skipped rows, the files written, the store and how
to go on after a stop) and simulate's (:func:`print_summary`): the summary a newcomer reads (what ran, throughput beside the reference model,
latency percentiles, the reopen and the check) and the ``--verbose`` lines (timings
of each part, counters, memory and the ledgers' structures); ``--report-out`` holds
every figure either way. Reads a `loadsim.report.SimulationResult`; computes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tidal_actors._text import plural
from tidal_actors.cli.timepoints import iso, stamp

__all__ = ["print_replay_summary", "print_summary"]


def print_replay_summary(
    out: Callable[[str], Any],
    report: Mapping[str, Any],
    *,
    skip_errors: Sequence[object],
    scores_written: int | None,
    scores_out: Path | None,
    report_out: Path | None,
    complete: bool,
    waiting: int,
    go_on: str | None,
) -> None:
    """Print replay's summary with ``out``.

    Args:
        report: the ``--report-out`` mapping (counts, times in int ns, ``error``,
            ``interrupted``, ``data_dir``).
        skip_errors: the first skipped rows' errors (``--skip-invalid``), each
            printed as it reads.
        scores_written: aggregate rows written to ``scores_out`` (None: none written).
        complete: every row applied and the rebuilds due run.
        waiting: purged cohorts waiting for re-materialization after a stop.
        go_on: what to do to go on after a stop (None: nothing to say).
    """
    verb = (
        "stopped at a bad row after"
        if report["error"] is not None
        else "interrupted after"
        if report["interrupted"]
        else "replayed"
    )
    skipped, skipped_first = report["skipped_rows"], report["skipped_first_rows"]
    out(
        f"{verb} {plural(report['rows'], 'row')} of {report['events']} in "
        f"{report['elapsed_s']:.3f} s"
        + (f" (after skipping the first {skipped_first:,})" if skipped_first else "")
        + (f" ({plural(skipped, 'invalid row')} skipped)" if skipped else "")
    )
    out(f"  host       {report['host']}")
    out(
        f"  signals    {report['signals']:>10,}   forwarded {report['forwarded']:,}, "
        f"gated {report['gated']:,}   ({report['signals_per_s']:,.0f} signals/s)"
    )
    out(
        f"  control    assigns {report['assigns']:,}, leaves {report['leaves']:,}, "
        f"rejoins {report['rejoins']:,}, purges {report['purges']:,}"
    )
    out(
        f"  records    {plural(report['contribution_records'], 'contribution record')}, "
        f"{report['retracted_records']:,} retracted in {plural(report['manifests'], 'manifest')}"
    )
    back = report["rows_back_in_time"]
    out(
        f"  event time {iso(report['first_ts_ns'])} .. {iso(report['last_ts_ns'])}"
        + (
            f"; {plural(back, 'row')} earlier than the row before (applied at their own ts_ns)"
            if back
            else ""
        )
    )
    for err in skip_errors:
        out(f"  skipped    {err}")
    if skipped > len(skip_errors):
        out(f"  skipped    ... and {skipped - len(skip_errors):,} more")
    if scores_written is not None:
        out(
            f"  scores     {plural(scores_written, 'aggregate row')} at "
            f"{stamp(report['at_ns'])} -> {scores_out}"
        )
    if report_out is not None:
        out(f"  report     {report_out}")
    data_dir = report["data_dir"]
    out(
        f"  store      {data_dir if data_dir is not None else 'ephemeral'}"
        + (
            ""
            if complete or data_dir is None
            else f" (flushed and closed; {plural(waiting, 'purged cohort')} "
            "waiting for re-materialization)"
        )
    )
    if go_on is not None:
        out("  to go on   " + go_on)


def print_summary(
    out: Callable[[str], Any],
    result: Any,
    events: list[Any],
    generated_s: float,
    data_dir: Path | None,
    verbose: bool,
    iso: Callable[[int], str],
    host: str,
) -> None:
    """Print the run's summary with ``out`` (``verbose``: the internals too; ``host``:
    where the actors ran, ``Config.host``)."""
    scenario, c, check = result.scenario, result.counts, result.check
    config = scenario.build_config()
    with_events = len({r.user_id for r in events})
    idle = scenario.users - with_events
    out(
        f"scenario {scenario.name} (seed {scenario.seed}): {plural(scenario.users, 'user')}"
        + (f" ({idle:,} of them without any event)" if idle > 0 else "")
        + f", {plural(scenario.cohorts, 'cohort')}, {plural(scenario.entities, 'entity', 'entities')}, "
        f"{plural(len(scenario.signal_types), 'signal type')}"
    )
    where = (
        "on the store " + str(data_dir)
        if data_dir is not None
        else "on a temporary store"
        if scenario.durable
        else "in memory (no store)"
    )
    out(
        f"  ran        {plural(result.events, 'row')} {where}: {plural(c.signals, 'signal')}, "
        f"{plural(c.assigns, 'assign')}, {plural(c.leaves, 'leave')}, "
        f"{plural(c.rejoins, 'rejoin')}, {plural(c.purges, 'purge')}"
    )
    out(f"  host       {host}")
    if c.purges:
        out(
            f"  purges     {plural(c.manifest_entries, 'record')} retracted in "
            f"{plural(c.manifests, 'manifest')}; {plural(c.manifest_evicted, 'record')} the log "
            "had evicted before the purge (reported as evicted)"
        )
    out(
        f"  throughput {result.signals_per_s:>10,.0f} signals/s through the runtime "
        f"(actors, {result.runtime_s:.3f} s)"
    )
    out(
        f"             {result.reference_signals_per_s:>10,.0f} signals/s through the reference "
        f"model (single-threaded, in memory, {result.reference_s:.3f} s)"
    )
    if result.signals_per_s < result.reference_signals_per_s:
        out(
            "             (the model is a single-threaded in-memory fold: a runtime that also "
            "routes, logs and persists is expected to be slower)"
        )
    if verbose:
        _internals(out, result, generated_s, config)
    out(f"  latency    {'ms:':<12}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}{'count':>13}")
    for op, q in result.latency.items():
        name = "signal ack" if op == "signal" else op
        out(
            f"    {name:<19}{q['p50_ms']:>10.3f}{q['p99_ms']:>10.3f}{q['p99_9_ms']:>10.3f}"
            f"{q['max_ms']:>10.3f}{int(q['count']):>13,}"
        )
    if "signal" in result.latency:
        out(
            "    (signal ack: a signal_batch call's time, weighted by its signals: one slow "
            "batch can set p99 to max)"
        )
    if result.restart is not None:
        r = result.restart
        out(
            f"  restart    after {r['after_rows']:,} rows: reopened in {r['restore_s']:.3f} s, "
            f"{_verdict(r['differences'])}"
        )
        for line in r["differences"]:
            out(f"    {line}")
    if result.restore_s is not None:
        out(
            f"  restore    {result.restore_s:.3f} s to reopen the store at the end, "
            f"{_verdict(result.reopen_differences)}"
        )
        for line in result.reopen_differences:
            out(f"    {line}")
    if check.ok:
        which = (
            "every user with an event"
            if check.users == with_events
            else f"a sample of the {with_events:,} users with an event"
        )
        out(
            f"  check      OK: the runtime agrees with the reference model on "
            f"{plural(check.aggregate_rows, 'aggregate row')}, {plural(check.users, 'user')} "
            f"({which}) and {plural(check.manifests, 'manifest')}, read at {iso(result.at_ns)} "
            "(event time)"
        )
    else:
        out(
            f"  check      FAILED: {plural(check.mismatches, 'difference')} from the reference model"
        )
        for line in check.details:
            out(f"    {line}")
    if not verbose:
        out(
            "  (--verbose adds timings, counters and memory; --report-out FILE writes every "
            "figure as JSON)"
        )


def _verdict(differences: list[str]) -> str:
    return (
        "every figure equal" if not differences else f"{plural(len(differences), 'figure')} changed"
    )


def _internals(out: Callable[[str], Any], result: Any, generated_s: float, config: Any) -> None:
    """The ``--verbose`` lines."""
    s, mem = result.stats, result.memory
    rows_per_s = result.events / result.runtime_s if result.runtime_s > 0 else 0.0
    out(
        f"  timings    generated in {generated_s:.2f} s; "
        + (
            f"set-up (every user joins its cohorts up front, 64 callers, not measured) "
            f"{result.setup_s:.2f} s; "
            if result.setup_s
            else ""
        )
        + f"run {result.runtime_s:.3f} s ({rows_per_s:,.0f} rows/s, "
        f"{config.membership_shards} membership / {config.ledger_shards} ledger shards); "
        f"reference model {result.reference_s:.3f} s"
    )
    out(
        f"  counters   forwarded {s.get('forwarded', 0):,}, gated {s.get('gated', 0):,}, "
        f"records {s.get('records', 0):,}, retracted {s.get('retracted', 0):,}"
    )
    if not mem:
        return
    out(
        f"  memory     peak {mem['peak_bytes'] / 2**20:,.1f} MiB, end "
        f"{mem['end_bytes'] / 2**20:,.1f} MiB above the start (RSS); "
        f"{plural(mem['retained_records'], 'contribution record')} retained"
    )
    per = mem.get("bytes_per_retained_record")
    if per is not None:
        out(
            f"             {per:,.1f} B per retained record (RSS)"
            + (
                f", {mem['structure_bytes_per_retained_record']:,.1f} B in the ledgers' structures"
                if mem.get("structure_bytes_per_retained_record")
                else ""
            )
        )
    if mem.get("structures"):
        out(
            "             "
            + ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in mem["structures"].items())
        )
