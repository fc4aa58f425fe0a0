"""Writing an event log: typed rows (`rows`) as CSV, header first, in a form the
reader reads back to the same rows."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from tidal_actors.eventlog.rows import HEADER, AssignRow, EventRow, PurgeRow, SignalRow

__all__ = ["format_row", "write_events"]


def format_row(row: EventRow) -> list[str]:
    """The CSV fields of ``row`` in :data:`HEADER` order (weights written with ``repr``)."""
    if isinstance(row, SignalRow):
        return [
            str(row.ts_ns),
            "signal",
            str(row.user_id),
            "",
            str(row.entity_id),
            str(row.signal_type),
            repr(float(row.weight)),
        ]
    if isinstance(row, (AssignRow, PurgeRow)):
        return [str(row.ts_ns), row.op, str(row.user_id), row.cohort, "", "", ""]
    return [str(row.ts_ns), row.op, str(row.user_id), "", "", "", ""]


def write_events(target: str | Path | IO[str], rows: Iterable[EventRow]) -> int:
    """Write ``rows`` as an event log (header first) to a path or a text file object.

    Returns:
        The number of rows written.

    Raises:
        OSError: the file cannot be written.
    """
    if isinstance(target, (str, Path)):
        with open(target, "w", encoding="utf-8", newline="") as fh:
            return write_events(fh, rows)
    writer = csv.writer(target, lineterminator="\n")
    # QUOTE_MINIMAL quotes a field holding the line terminator ("\n") but not a bare
    # "\r", which the reader then refuses in an unquoted field: quote such rows whole
    quoted = csv.writer(target, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(HEADER)
    n = 0
    for row in rows:
        fields = format_row(row)
        (quoted if any("\r" in f for f in fields) else writer).writerow(fields)
        n += 1
    return n
