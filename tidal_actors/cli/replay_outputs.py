"""What ``tidal-actors replay`` writes out: the ``--scores-out`` CSV of the aggregate
rows (:data:`SCORES_HEADER`, :func:`write_scores`) and the run's report
(:func:`replay_report`: the ``--report-out`` JSON, which the printed summary,
`summary.print_replay_summary`, reads too).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal_actors.cli.group import EXIT_BAD_INPUT, fail

if TYPE_CHECKING:
    from tidal_actors.eventlog.log import ApplyCounts, EventLogError

__all__ = ["SCORES_HEADER", "replay_report", "write_scores"]

SCORES_HEADER = (
    "cohort",
    "entity_id",
    "signal_type",
    "decay_score",
    "window_count",
    "window_weight",
)
"""The header of ``--scores-out``: one aggregate row per line, scores as ``repr``."""


def write_scores(path: Path, rows: Iterable[tuple[str, int, int, float, int, float]]) -> int:
    """Write ``rows`` (``aggregate_rows``) as the ``--scores-out`` CSV; returns how
    many. A file that cannot be written ends the command with exit status 2."""
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
        fail(f"cannot write {path}: {exc}", EXIT_BAD_INPUT)
    return n


def replay_report(
    *,
    events: Path,
    data_dir: Path | None,
    host: str,
    counts: ApplyCounts,
    skipped_first_rows: int,
    delta: Callable[[str], int],
    skipped_rows: int,
    at: int,
    elapsed: float,
    error: EventLogError | None,
    interrupted: bool,
    next_skip_rows: int | None,
    rematerializations: Sequence[tuple[str, int]],
) -> dict[str, Any]:
    """The report of a replay (``--report-out``): the rows and what they did, from
    ``counts`` (`eventlog.log.ApplyCounts`) and ``delta`` (how much a ``stats()``
    counter grew over the run), the read time ``at`` (int ns), ``elapsed`` seconds,
    and where a stopped run goes on (``next_skip_rows``, None once complete)."""
    return {
        "events": str(events),
        "data_dir": None if data_dir is None else str(data_dir),
        "host": host,
        "rows": counts.rows,
        "skipped_first_rows": skipped_first_rows,
        "signals": counts.signals,
        "forwarded": delta("forwarded"),
        "gated": delta("gated"),
        "contribution_records": delta("records"),
        "purges": counts.purges,
        "retracted_records": delta("retracted"),
        "manifests": counts.manifests,
        "leaves": counts.leaves,
        "rejoins": counts.rejoins,
        "assigns": counts.assigns,
        "skipped_rows": skipped_rows,
        "first_ts_ns": counts.first_ts_ns,
        "last_ts_ns": counts.max_ts_ns,
        "rows_back_in_time": counts.back_in_time,
        "at_ns": at,
        "elapsed_s": elapsed,
        "signals_per_s": counts.signals / elapsed if elapsed > 0 else 0.0,
        "error": None if error is None else str(error),
        "interrupted": interrupted,
        "next_skip_rows": next_skip_rows,
        "rematerializations": [[c, t] for c, t in rematerializations],
    }
