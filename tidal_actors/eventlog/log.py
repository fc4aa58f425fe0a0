"""The event log: the library's CSV interchange format, read, written and applied.

The format (``ts_ns,op,user_id,cohort,entity_id,signal_type,weight``; ops
``assign``, ``signal``, ``leave``, ``rejoin``, ``purge``), its rules and the typed
rows are in `rows`; the validating reader that turns a file into typed rows in
`reader`; the writer in `writer`; :func:`apply_events`, which drives any object with
the database API (``TidalDb`` or the reference model) through the rows in event
time, in `apply`. Every name is importable from here.
"""

from tidal_actors.eventlog.apply import (
    ApplyCounts,
    EventSink,
    apply_events,
    settle_rematerializations,
)
from tidal_actors.eventlog.reader import EventLogReader, read_events
from tidal_actors.eventlog.rows import (
    HEADER,
    OPS,
    AssignRow,
    EventLogError,
    EventRow,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
)
from tidal_actors.eventlog.writer import format_row, write_events

__all__ = [
    "HEADER",
    "OPS",
    "ApplyCounts",
    "AssignRow",
    "EventLogError",
    "EventLogReader",
    "EventRow",
    "EventSink",
    "LeaveRow",
    "PurgeRow",
    "RejoinRow",
    "SignalRow",
    "apply_events",
    "format_row",
    "read_events",
    "settle_rematerializations",
    "write_events",
]
