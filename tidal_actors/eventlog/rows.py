"""The event log's format: its columns, its operations, the typed rows, and the error
that names a bad row.

The format is ``ts_ns,op,user_id,cohort,entity_id,signal_type,weight`` with ops
``assign``, ``signal``, ``leave``, ``rejoin``, ``purge``; `reader` turns a file into
these rows, `writer` writes them, `apply` drives a database through them.

Format rules (docs/cli.md, "The event log format", documents them for users):

- UTF-8, comma-separated, RFC 4180 quoting; the first line is the header naming the
  seven columns (any order). Blank lines are ignored.
- ``ts_ns``: int nanoseconds since the epoch in ``[0, 2**63)``; ``user_id`` (every op),
  ``entity_id`` and ``signal_type`` (``signal`` only): ints in ``[0, 2**64)``;
  ``weight`` (``signal`` only): a finite decimal ``>= 0``; ``cohort`` (``assign``:
  a cohort name; ``purge``: a cohort name or ``@community``). A field an op does not
  use must be empty.
- Rows are applied in file order, each at its own ``ts_ns``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from tidal_actors._errors import InvalidArgument

__all__ = [
    "HEADER",
    "OPS",
    "AssignRow",
    "EventLogError",
    "EventRow",
    "LeaveRow",
    "PurgeRow",
    "RejoinRow",
    "SignalRow",
]

HEADER: tuple[str, ...] = (
    "ts_ns",
    "op",
    "user_id",
    "cohort",
    "entity_id",
    "signal_type",
    "weight",
)
"""The seven columns of the event log, in their canonical order."""

OPS: tuple[str, ...] = ("assign", "signal", "leave", "rejoin", "purge")
"""The operations a row may carry."""


class EventLogError(InvalidArgument):
    """A row (or the header) of an event log is invalid.

    ``str(err)`` is one line: ``FILE:LINE: invalid FIELD=VALUE: REASON``.

    Attributes:
        path: the file, as given to the reader.
        line: 1-based line number where the offending record starts.
        field, value, reason: as in :class:`InvalidArgument`.
    """

    def __init__(self, path: str, line: int, field: str, value: object, reason: str) -> None:
        super().__init__(field, value, reason)
        self.path = path
        self.line = line
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        self.args = (f"{path}:{line}: invalid {field}={shown}: {reason}",)


@dataclass(frozen=True, slots=True)
class AssignRow:
    """``assign``: ``user_id`` joins ``cohort`` at ``ts_ns`` (int ns)."""

    op: ClassVar[str] = "assign"
    line: int
    ts_ns: int
    user_id: int
    cohort: str


@dataclass(frozen=True, slots=True)
class SignalRow:
    """``signal``: one engagement signal at ``ts_ns`` (int ns); ``weight`` is a float >= 0."""

    op: ClassVar[str] = "signal"
    line: int
    ts_ns: int
    user_id: int
    entity_id: int
    signal_type: int
    weight: float


@dataclass(frozen=True, slots=True)
class LeaveRow:
    """``leave``: ``user_id`` leaves the community layer at ``ts_ns`` (int ns)."""

    op: ClassVar[str] = "leave"
    line: int
    ts_ns: int
    user_id: int


@dataclass(frozen=True, slots=True)
class RejoinRow:
    """``rejoin``: ``user_id`` rejoins the community layer at ``ts_ns`` (int ns)."""

    op: ClassVar[str] = "rejoin"
    line: int
    ts_ns: int
    user_id: int


@dataclass(frozen=True, slots=True)
class PurgeRow:
    """``purge``: ``user_id`` asks to purge its contributions to ``cohort`` at ``ts_ns``."""

    op: ClassVar[str] = "purge"
    line: int
    ts_ns: int
    user_id: int
    cohort: str


EventRow = Union[AssignRow, SignalRow, LeaveRow, RejoinRow, PurgeRow]
"""Any typed row of an event log."""
