"""The event log: the library's CSV interchange format, read, written and applied.

Owns the format (``ts_ns,op,user_id,cohort,entity_id,signal_type,weight``; ops
``assign``, ``signal``, ``leave``, ``rejoin``, ``purge``), the validating reader that
turns a file into typed rows, the writer, and :func:`apply_events`, which drives any
object with the database API (``TidalDb`` or the reference model) through the rows in
event time. It must not know how the database works inside.

Format rules (the README documents them for users):

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

import contextlib
import csv
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import (
    IO,
    Any,
    ClassVar,
    Protocol,
    Union,
)

from tidal_actors._clock import ManualClock
from tidal_actors._errors import InvalidArgument, UnknownCohort
from tidal_actors._types import PurgeId, PurgeManifest, Signal
from tidal_actors.core.validate import check_cohort, check_id, check_timestamp, check_weight

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

# Which optional columns each op uses (ts_ns, op and user_id are always required).
_USES: dict[str, frozenset[str]] = {
    "assign": frozenset({"cohort"}),
    "signal": frozenset({"entity_id", "signal_type", "weight"}),
    "leave": frozenset(),
    "rejoin": frozenset(),
    "purge": frozenset({"cohort"}),
}
_OPTIONAL = ("cohort", "entity_id", "signal_type", "weight")
_I63 = 2**63
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _has_surrogate(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


class _Lines:
    """Decodes a binary file line by line for :mod:`csv`, remembering what went wrong.

    Lines that are not UTF-8 are passed on with ``surrogateescape`` so the CSV parser
    keeps its place; the reader then names the field holding the bad bytes.
    """

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.bytes_read = 0
        self.line_no = 0
        self.bad_utf8: set[int] = set()
        self.last_terminated = True

    def __iter__(self) -> Iterator[str]:
        first = True
        for raw in self._fh:
            self.line_no += 1
            self.bytes_read += len(raw)
            self.last_terminated = raw.endswith(b"\n")
            if first:
                first = False
                if raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                self.bad_utf8.add(self.line_no)
                yield raw.decode("utf-8", "surrogateescape")


class EventLogReader:
    """Reads and validates an event log, yielding typed rows in file order.

    Args:
        path: the CSV file (see the module docstring for the format).
        skip_invalid: if False (default), the first invalid row raises
            :class:`EventLogError`; if True, invalid rows are skipped and counted in
            :attr:`skipped` (the first few kept in :attr:`skip_errors`). A missing or
            wrong header always raises.

    Attributes:
        rows: valid rows yielded so far.
        skipped: invalid rows skipped so far.
        skip_errors: the first ``keep_errors`` skipped rows' errors.
        bytes_read: bytes consumed from the file so far (for progress bars).
        size: the file's size in bytes (read when iteration starts).

    Iterating raises :class:`EventLogError` (file, line, field, value) and
    ``OSError`` if the file cannot be read. Iterate once per reader.
    """

    def __init__(
        self, path: str | Path, *, skip_invalid: bool = False, keep_errors: int = 10
    ) -> None:
        self.path = str(path)
        self.skip_invalid = skip_invalid
        self.keep_errors = keep_errors
        self.rows = 0
        self.skipped = 0
        self.skip_errors: list[EventLogError] = []
        self._lines: _Lines | None = None
        self.size = 0

    @property
    def bytes_read(self) -> int:
        return self._lines.bytes_read if self._lines is not None else 0

    def __iter__(self) -> Iterator[EventRow]:
        with open(self.path, "rb") as fh:
            try:
                self.size = Path(self.path).stat().st_size
            except OSError:
                self.size = 0
            self._lines = lines = _Lines(fh)
            reader = csv.reader(lines, strict=True)
            order = self._read_header(reader)
            end = lines.line_no
            while True:
                start = end + 1
                try:
                    record = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    end = lines.line_no
                    self._reject(
                        EventLogError(self.path, start, "csv", "", f"malformed CSV: {exc}")
                    )
                    continue
                end = lines.line_no
                if not record or record == [""]:
                    continue  # blank line
                try:
                    row = self._parse(record, order, start, end)
                except EventLogError as err:
                    self._reject(err)
                    continue
                self.rows += 1
                yield row

    def _reject(self, err: EventLogError) -> None:
        if not self.skip_invalid:
            raise err
        self.skipped += 1
        if len(self.skip_errors) < self.keep_errors:
            self.skip_errors.append(err)

    def _read_header(self, reader: Any) -> tuple[int, ...] | None:
        """The column order: indices of :data:`HEADER`'s names, None if canonical."""
        try:
            first = next(reader)
        except StopIteration:
            raise EventLogError(
                self.path, 1, "header", "", "empty file: missing header line " + ",".join(HEADER)
            ) from None
        except csv.Error as exc:
            raise EventLogError(self.path, 1, "header", "", f"malformed CSV: {exc}") from None
        names = [name.strip() for name in first]
        if sorted(names) == sorted(HEADER):
            order = tuple(names.index(name) for name in HEADER)
            return None if order == tuple(range(len(HEADER))) else order
        if first and first[0].strip().isdigit():
            reason = "missing header: the first line must be " + ",".join(HEADER)
        else:
            reason = "the header must name the columns " + ",".join(HEADER)
        raise EventLogError(self.path, 1, "header", ",".join(first), reason)

    def _parse(
        self, record: list[str], order: tuple[int, ...] | None, start: int, end: int
    ) -> EventRow:
        lines = self._lines
        assert lines is not None
        if len(record) != len(HEADER):
            reason = f"expected {len(HEADER)} comma-separated fields, got {len(record)}"
            if not lines.last_terminated and end == lines.line_no:
                reason += " (the last line has no line terminator: truncated file?)"
            raise EventLogError(self.path, start, "columns", ",".join(record), reason)
        values = record if order is None else [record[i] for i in order]
        if lines.bad_utf8 and any(n in lines.bad_utf8 for n in range(start, end + 1)):
            for name, text in zip(HEADER, values):
                if _has_surrogate(text):
                    raw = text.encode("utf-8", "surrogateescape")
                    raise EventLogError(self.path, start, name, raw, "not valid UTF-8")
        ts_t, op, user_t, cohort_t, entity_t, type_t, weight_t = values
        uses = _USES.get(op)
        if uses is None:
            raise EventLogError(
                self.path, start, "op", op, "unknown op (expected one of " + ", ".join(OPS) + ")"
            )
        # fast paths for plain digits; anything else gets the full check and its error
        ts = int(ts_t) if 0 < len(ts_t) <= 19 and ts_t.isdigit() and ts_t.isascii() else -1
        if not 0 <= ts < _I63:
            ts = self._int("ts_ns", ts_t, op, start)
        user_id = self._int("user_id", user_t, op, start)
        for name, text in zip(_OPTIONAL, (cohort_t, entity_t, type_t, weight_t)):
            if text and name not in uses:
                raise EventLogError(self.path, start, name, text, f"must be empty for op {op}")
        if op == "signal":
            return SignalRow(
                start,
                ts,
                user_id,
                self._int("entity_id", entity_t, op, start),
                self._int("signal_type", type_t, op, start),
                self._weight(weight_t, start),
            )
        if op == "assign" or op == "purge":
            if not cohort_t:
                raise EventLogError(self.path, start, "cohort", cohort_t, f"required for op {op}")
            try:
                cohort = check_cohort(cohort_t, allow_community=(op == "purge"))
            except InvalidArgument as exc:
                raise EventLogError(self.path, start, "cohort", cohort_t, exc.reason) from None
            if op == "assign":
                return AssignRow(start, ts, user_id, cohort)
            return PurgeRow(start, ts, user_id, cohort)
        if op == "leave":
            return LeaveRow(start, ts, user_id)
        return RejoinRow(start, ts, user_id)

    def _int(self, name: str, text: str, op: str, line: int) -> int:
        """An integer field: ``ts_ns`` in ``[0, 2**63)``, an id in ``[0, 2**64)``."""
        if 0 < len(text) < 20 and text.isdigit() and text.isascii() and name != "ts_ns":
            return int(text)  # at most 19 digits: below 2**64
        if not text:
            raise EventLogError(self.path, line, name, text, f"required for op {op}")
        body = text[1:] if text[0] in "+-" else text
        if not (body.isascii() and body.isdigit()):
            raise EventLogError(self.path, line, name, text, "must be an integer")
        try:
            value = int(text)
        except ValueError:  # more digits than int() takes: far out of range anyway
            raise EventLogError(self.path, line, name, text, "out of range") from None
        try:
            if name == "ts_ns":
                return check_timestamp(name, value)
            return check_id(name, value)
        except InvalidArgument as exc:
            raise EventLogError(self.path, line, name, text, exc.reason) from None

    def _weight(self, text: str, line: int) -> float:
        """A signal's weight: a finite decimal ``>= 0`` within the float32 range."""
        if not text:
            raise EventLogError(self.path, line, "weight", text, "required for op signal")
        if _DECIMAL.fullmatch(text) is None:
            raise EventLogError(self.path, line, "weight", text, "must be a decimal number")
        weight = float(text)
        if not 0.0 <= weight <= 3.0e38:  # below float32's max: no overflow possible
            try:
                check_weight(weight)
            except InvalidArgument as exc:
                raise EventLogError(self.path, line, "weight", text, exc.reason) from None
        return weight


def read_events(path: str | Path, *, skip_invalid: bool = False) -> Iterator[EventRow]:
    """Yield the typed rows of the event log at ``path``; see :class:`EventLogReader`.

    Raises:
        EventLogError: an invalid row (unless ``skip_invalid``) or header.
        OSError: the file cannot be read.
    """
    return iter(EventLogReader(path, skip_invalid=skip_invalid))


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


class EventSink(Protocol):
    """The part of the database API that :func:`apply_events` drives."""

    def assign_cohort(self, user_id: int, cohort: str) -> None: ...

    def signal_batch(self, signals: Iterable[Signal]) -> None: ...

    def leave_community_layer(self, user_id: int) -> None: ...

    def rejoin_community_layer(self, user_id: int) -> None: ...

    def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> tuple[PurgeId, PurgeManifest]: ...


@dataclass
class ApplyCounts:
    """What :func:`apply_events` has applied so far (updated in place as it goes).

    ``manifest_entries`` is the number of contribution records listed in the
    manifests returned, ``manifest_evicted`` the sum of their ``evicted`` (records
    of the purged pairs the log had evicted before the purge); ``first_ts_ns`` / ``max_ts_ns`` bound the event times seen
    (int ns, None before the first row); ``last_ts_ns`` is the last row's time and
    ``back_in_time`` counts the rows earlier than the row before them (legal: each
    row is applied at its own ``ts_ns``; an equal time is not earlier).
    """

    rows: int = 0
    signals: int = 0
    assigns: int = 0
    leaves: int = 0
    rejoins: int = 0
    purges: int = 0
    manifests: int = 0
    manifest_entries: int = 0
    manifest_evicted: int = 0
    first_ts_ns: int | None = None
    max_ts_ns: int | None = None
    last_ts_ns: int | None = None
    back_in_time: int = 0


def apply_events(
    db: EventSink,
    rows: Iterable[EventRow],
    clock: ManualClock,
    *,
    batch_size: int = 1024,
    counts: ApplyCounts | None = None,
    manifests: list[PurgeManifest] | None = None,
    on_call: Callable[..., None] | None = None,
    rebuilds: Any = None,
) -> ApplyCounts:
    """Apply ``rows`` to ``db`` in order, each at its own event time.

    ``clock`` (the database's clock) is set to each row's ``ts_ns`` before the row
    is applied, so a leave's ``left_at_ns`` and a manifest's ``created_at_ns`` are
    their rows' times. Signals carry their row's ``ts_ns`` explicitly and are sent
    with ``db.signal_batch`` in runs of at most ``batch_size``; a pending run is sent
    before any control row, so every operation sees exactly the signals before it.

    Args:
        db: a ``TidalDb`` or anything with the same API (:class:`EventSink`).
        rows: typed rows, e.g. from :class:`EventLogReader`.
        clock: the ``ManualClock`` the database was opened with.
        batch_size: the longest run of signals sent in one ``signal_batch`` (>= 1).
        counts: updated in place (so a caller still has the counts if a row raises);
            a new one is made if None.
        manifests: if given, every manifest returned by a purge is appended to it.
        on_call: if given, called after each database call as ``on_call(op,
            seconds)`` (``op``: ``"assign"``, ``"leave"``, ``"rejoin"``, ``"purge"``),
            or ``on_call("signal", seconds, n)`` for a run of ``n`` signals; wall
            seconds from ``time.perf_counter``.
        rebuilds: if given, a :class:`~tidal_actors.eventlog.rebuilds.EventTimeRebuilds`:
            told of every purge applied, and run (pending signals sent first) before
            the first row whose ``ts_ns`` reaches its ``next_due_ns``, so purged
            cohorts are re-materialized at event times the log alone determines.

    Returns:
        ``counts``.

    Raises:
        Whatever ``rows`` raises (e.g. :class:`EventLogError`) or ``db`` raises; every
        row before the failing one has been applied (pending signals are sent first).
    """
    if counts is None:
        counts = ApplyCounts()
    batch_size = max(1, int(batch_size))
    pending: list[Signal] = []

    now = time.perf_counter

    def send() -> None:
        run = list(pending)
        pending.clear()
        t = now()
        db.signal_batch(run)
        if on_call is not None:
            on_call("signal", now() - t, len(run))

    try:
        for row in rows:
            ts = row.ts_ns
            if rebuilds is not None and ts >= rebuilds.next_due_ns:
                if pending:
                    send()
                rebuilds.run_due(db, clock, ts)
            if counts.first_ts_ns is None:
                counts.first_ts_ns = ts
            if counts.max_ts_ns is None or ts > counts.max_ts_ns:
                counts.max_ts_ns = ts
            if counts.last_ts_ns is not None and ts < counts.last_ts_ns:
                counts.back_in_time += 1
            counts.last_ts_ns = ts
            if isinstance(row, SignalRow):
                clock.set(ts)
                pending.append(Signal(row.user_id, row.entity_id, row.signal_type, row.weight, ts))
                counts.signals += 1
                counts.rows += 1
                if len(pending) >= batch_size:
                    send()
                continue
            if pending:
                send()
            clock.set(ts)
            t = now()
            if isinstance(row, AssignRow):
                db.assign_cohort(row.user_id, row.cohort)
                op = "assign"
                counts.assigns += 1
            elif isinstance(row, LeaveRow):
                db.leave_community_layer(row.user_id)
                op = "leave"
                counts.leaves += 1
            elif isinstance(row, RejoinRow):
                db.rejoin_community_layer(row.user_id)
                op = "rejoin"
                counts.rejoins += 1
            else:
                _, manifest = db.request_community_purge(row.user_id, row.cohort)
                op = "purge"
                counts.purges += 1
                counts.manifests += 1
                counts.manifest_entries += len(manifest.entries)
                counts.manifest_evicted += manifest.evicted
                if manifests is not None:
                    manifests.append(manifest)
                if rebuilds is not None:
                    rebuilds.purged(row.cohort, ts)
            if on_call is not None:
                on_call(op, now() - t)
            counts.rows += 1
    finally:
        if pending:
            send()
    return counts


def settle_rematerializations(db: Any, cohorts: Iterable[str | None]) -> None:
    """Re-materialize each purged cohort now (runtime or reference model), so that a
    comparison does not depend on when the background rebuilds ran.

    A purge retracts the pair's live records at once; its cohort's re-materialization
    (which also leaves out the records the log had evicted) follows
    ``Config.rematerialize_after_ms`` later in the runtime, and only on request in the
    reference model. Once the log has evicted records, the aggregates differ until
    both have run it; a reopen resumes a pending one. Settling before every
    comparison (the check, and the figures taken before a close) compares the same
    thing on both sides. A cohort that never had a contribution is skipped.
    """
    for cohort in sorted({c for c in cohorts if c is not None}):
        with contextlib.suppress(UnknownCohort):
            db.rematerialize(cohort)
