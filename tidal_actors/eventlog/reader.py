"""Reading an event log: the validating reader that turns a CSV file into typed rows
(`rows`), naming the file, line, field and value of the first bad row (or skipping
and counting bad rows).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tidal_actors._errors import InvalidArgument
from tidal_actors.core.validate import check_cohort, check_id, check_timestamp, check_weight
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

__all__ = ["EventLogReader", "read_events"]

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


def _header_diff(names: list[str]) -> str:
    """What a header's column ``names`` lack or have too much of, against
    :data:`HEADER` (``" (missing: ts_ns; unknown: ts)"``; empty if nothing to say)."""
    missing = [name for name in HEADER if name not in names]
    unknown = [name for name in names if name not in HEADER]
    twice = [name for name in HEADER if names.count(name) > 1]
    parts = [
        f"{what}: {', '.join(map(repr, which))}"
        for what, which in (("missing", missing), ("unknown", unknown), ("twice", twice))
        if which
    ]
    return f" ({'; '.join(parts)})" if parts else ""


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
        path: the CSV file (the format: `rows`).
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

    def check_header(self) -> None:
        """Read and check the file's header line only (what iterating checks first),
        so that a caller can refuse a log with a bad header before doing any work.

        Raises:
            EventLogError: line 1, field ``header``: an empty file, a header that is
                not valid UTF-8, or one that does not name the columns of
                :data:`~tidal_actors.eventlog.rows.HEADER` (each once, in any order).
            OSError: the file cannot be read.
        """
        with open(self.path, "rb") as fh:
            lines = _Lines(fh)
            self._read_header(csv.reader(lines, strict=True), lines)

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
            order = self._read_header(reader, lines)
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

    def _read_header(self, reader: Any, lines: _Lines) -> tuple[int, ...] | None:
        """The column order: indices of :data:`HEADER`'s names, None if canonical."""
        try:
            first = next(reader)
        except StopIteration:
            raise EventLogError(
                self.path, 1, "header", "", "empty file: missing header line " + ",".join(HEADER)
            ) from None
        except csv.Error as exc:
            raise EventLogError(self.path, 1, "header", "", f"malformed CSV: {exc}") from None
        if 1 in lines.bad_utf8:
            raw = ",".join(first).encode("utf-8", "surrogateescape")
            raise EventLogError(
                self.path, 1, "header", raw, "not valid UTF-8 (an event log is UTF-8 CSV)"
            )
        names = [name.strip() for name in first]
        if sorted(names) == sorted(HEADER):
            order = tuple(names.index(name) for name in HEADER)
            return None if order == tuple(range(len(HEADER))) else order
        if first and first[0].strip().isdigit():
            reason = "missing header: the first line must be " + ",".join(HEADER)
        else:
            reason = "the header must name the columns " + ",".join(HEADER) + _header_diff(names)
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
