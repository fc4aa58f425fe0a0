"""The event-log format: reading and validating rows, writing them, applying them in event time.

Runs against the reference model, so it needs no runtime.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, TidalError
from tidal_actors._types import COMMUNITY, MembershipStatus, Signal
from tidal_actors.eventlog.log import (
    HEADER,
    ApplyCounts,
    AssignRow,
    EventLogError,
    EventLogReader,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
    apply_events,
    read_events,
    write_events,
)
from tidal_actors.testing.reference import ReferenceModel

H = 3_600_000_000_000
T = 10 * H
HEAD = ",".join(HEADER) + "\n"


def write(tmp_path: Path, text: str | bytes, name: str = "events.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", newline="")
    else:
        path.write_bytes(text)
    return path


def test_reads_every_op_as_typed_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + (
            "5,assign,1,a,,,\n"
            "6,signal,1,,10,2,0.5\n"
            "7,leave,1,,,,\n"
            "8,rejoin,1,,,,\n"
            "9,purge,1,a,,,\n"
            "10,purge,1,@community,,,\n"
        ),
    )
    assert list(read_events(path)) == [
        AssignRow(2, 5, 1, "a"),
        SignalRow(3, 6, 1, 10, 2, 0.5),
        LeaveRow(4, 7, 1),
        RejoinRow(5, 8, 1),
        PurgeRow(6, 9, 1, "a"),
        PurgeRow(7, 10, 1, COMMUNITY),
    ]


def test_header_may_reorder_columns_and_quoting_bom_crlf_blank_lines_are_fine(
    tmp_path: Path,
) -> None:
    text = (
        "\ufeffop,ts_ns,user_id,weight,signal_type,entity_id,cohort\r\n"
        'assign,5,1,,,,"x,y ""z"""\r\n'
        "\r\n"
        "signal,6,1,2,3,4,\r\n"
    )
    path = write(tmp_path, text)
    assert list(read_events(path)) == [AssignRow(2, 5, 1, 'x,y "z"'), SignalRow(4, 6, 1, 4, 3, 2.0)]


def test_a_final_line_without_terminator_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "5,leave,1,,,,")
    assert list(read_events(path)) == [LeaveRow(2, 5, 1)]


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    rows = [
        AssignRow(2, 1, 7, "c,1"),
        SignalRow(3, 2, 7, 9, 1, 0.1),
        LeaveRow(4, 3, 7),
        RejoinRow(5, 4, 7),
        PurgeRow(6, 5, 7, "c,1"),
    ]
    path = tmp_path / "out.csv"
    assert write_events(path, rows) == 5
    assert list(read_events(path)) == rows
    buf = io.StringIO()
    write_events(buf, rows[:1])
    assert buf.getvalue() == HEAD + '1,assign,7,"c,1",,,\n'


BAD_ROWS = [
    # (row, field, value)
    ("5,subscribe,1,,,,", "op", "subscribe"),
    ("x5,leave,1,,,,", "ts_ns", "x5"),
    ("-1,leave,1,,,,", "ts_ns", "-1"),
    ("9223372036854775808,leave,1,,,,", "ts_ns", "9223372036854775808"),
    (",leave,1,,,,", "ts_ns", ""),
    ("5,leave,,,,,", "user_id", ""),
    ("5,leave,18446744073709551616,,,,", "user_id", "18446744073709551616"),
    ("5,leave,1.0,,,,", "user_id", "1.0"),
    ("5,leave,1,a,,,", "cohort", "a"),
    ("5,assign,1,,,,", "cohort", ""),
    ("5,assign,1,@community,,,", "cohort", "@community"),
    ("5,assign,1," + "x" * 201 + ",,,", "cohort", "x" * 201),
    ("5,purge,1,@other,,,", "cohort", "@other"),
    ("5,signal,1,,,1,1.0", "entity_id", ""),
    ("5,signal,1,,10,,1.0", "signal_type", ""),
    ("5,signal,1,,10,1,", "weight", ""),
    ("5,signal,1,,10,1,abc", "weight", "abc"),
    ("5,signal,1,,10,1,nan", "weight", "nan"),
    ("5,signal,1,,10,1,inf", "weight", "inf"),
    ("5,signal,1,,10,1,-1.0", "weight", "-1.0"),
    ("5,signal,1,,10,1,1e39", "weight", "1e39"),
    ("5,signal,1,a,10,1,1.0", "cohort", "a"),
    ("5,leave,1,,,,,", "columns", "5,leave,1,,,,,"),
    ("5,leave,1,,,", "columns", "5,leave,1,,,"),
    ("9" * 5000 + ",leave,1,,,,", "ts_ns", None),
    ("5,leave," + "9" * 5000 + ",,,,", "user_id", "9" * 5000),
]


@pytest.mark.parametrize(("row", "field", "value"), BAD_ROWS)
def test_a_bad_row_names_file_line_field_and_value(
    tmp_path: Path, row: str, field: str, value: str | None
) -> None:
    path = write(tmp_path, HEAD + "1,leave,1,,,,\n" + row + "\n2,rejoin,1,,,,\n")
    reader = EventLogReader(path)
    it = iter(reader)
    assert next(it) == LeaveRow(2, 1, 1)
    with pytest.raises(EventLogError) as info:
        next(it)
    err = info.value
    assert isinstance(err, InvalidArgument) and isinstance(err, TidalError)
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    if value is not None:
        assert err.value == value
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"{path}:3: invalid {field}=")


def test_skip_invalid_skips_and_counts(tmp_path: Path) -> None:
    text = HEAD + "".join(r + "\n" for r, _, _ in BAD_ROWS[:5]) + "1,leave,1,,,,\n"
    reader = EventLogReader(write(tmp_path, text), skip_invalid=True)
    assert list(reader) == [LeaveRow(7, 1, 1)]
    assert (reader.rows, reader.skipped) == (1, 5)
    assert [e.line for e in reader.skip_errors] == [2, 3, 4, 5, 6]


def test_truncated_final_line_is_reported_as_such(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "1,leave,1,,,,\n2,signal,1,,10")
    with pytest.raises(EventLogError, match="truncated") as info:
        list(read_events(path))
    assert (info.value.line, info.value.field) == (3, "columns")
    reader = EventLogReader(path, skip_invalid=True)
    assert list(reader) == [LeaveRow(2, 1, 1)] and reader.skipped == 1


def test_non_utf8_bytes_name_their_field(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD.encode() + b"1,assign,1,caf\xe9,,,\n2,leave,1,,,,\n")
    with pytest.raises(EventLogError, match="UTF-8") as info:
        list(read_events(path))
    assert (info.value.line, info.value.field, info.value.value) == (2, "cohort", b"caf\xe9")
    reader = EventLogReader(path, skip_invalid=True)
    assert list(reader) == [LeaveRow(3, 2, 1)] and reader.skipped == 1


def test_malformed_quoting_is_a_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + '1,assign,1,"a"b,,,\n2,leave,1,,,,\n')
    with pytest.raises(EventLogError, match="malformed CSV"):
        list(read_events(path))
    reader = EventLogReader(path, skip_invalid=True)
    assert list(reader) == [LeaveRow(3, 2, 1)] and reader.skipped == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty file"),
        ("1,leave,1,,,,\n", "missing header"),
        ("ts_ns,op,user_id\n1,leave,1\n", "must name the columns"),
        ("ts_ns,op,user_id,cohort,entity_id,signal_type,weight,extra\n", "must name the columns"),
    ],
)
def test_a_missing_or_wrong_header_always_fails(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, text)
    for skip in (False, True):
        with pytest.raises(EventLogError, match=reason) as info:
            list(EventLogReader(path, skip_invalid=skip))
        assert (info.value.line, info.value.field) == (1, "header")


def test_progress_counters(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "1,leave,1,,,,\n")
    reader = EventLogReader(path)
    rows = list(reader)
    assert rows and reader.bytes_read == reader.size == path.stat().st_size


# ---------------------------------------------------------------- applying


class Recorder:
    """Records the calls apply_events makes, with the clock's time at each."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.calls: list[tuple[object, ...]] = []

    def assign_cohort(self, user_id: int, cohort: str) -> None:
        self.calls.append(("assign", self.clock.now_ns(), user_id, cohort))

    def signal_batch(self, signals: list[Signal]) -> None:
        self.calls.append(
            ("batch", self.clock.now_ns(), [(s.user_id, s.timestamp_ns) for s in signals])
        )

    def leave_community_layer(self, user_id: int) -> None:
        self.calls.append(("leave", self.clock.now_ns(), user_id))

    def rejoin_community_layer(self, user_id: int) -> None:
        self.calls.append(("rejoin", self.clock.now_ns(), user_id))

    def request_community_purge(self, user_id: int, cohort: str) -> tuple[object, object]:
        self.calls.append(("purge", self.clock.now_ns(), user_id, cohort))
        return None, ReferenceModel().request_community_purge(user_id, cohort)[1]


def test_apply_batches_signals_flushes_before_control_rows_and_sets_the_clock() -> None:
    clock = ManualClock(0)
    rec = Recorder(clock)
    rows = [
        SignalRow(0, 1, 1, 1, 1, 1.0),
        SignalRow(0, 2, 2, 1, 1, 1.0),
        SignalRow(0, 3, 3, 1, 1, 1.0),
        LeaveRow(0, 4, 1),
        SignalRow(0, 5, 4, 1, 1, 1.0),
        PurgeRow(0, 6, 1, "a"),
    ]
    counts = apply_events(rec, rows, clock, batch_size=2)
    assert rec.calls == [
        ("batch", 2, [(1, 1), (2, 2)]),
        ("batch", 3, [(3, 3)]),
        ("leave", 4, 1),
        ("batch", 5, [(4, 5)]),
        ("purge", 6, 1, "a"),
    ]
    assert (counts.rows, counts.signals, counts.leaves, counts.purges, counts.manifests) == (
        6,
        4,
        1,
        1,
        1,
    )
    assert (counts.first_ts_ns, counts.max_ts_ns) == (1, 6)


def test_apply_sends_pending_signals_when_the_input_fails() -> None:
    clock = ManualClock(0)
    rec = Recorder(clock)

    def rows():  # type: ignore[no-untyped-def]
        yield SignalRow(2, 1, 1, 1, 1, 1.0)
        raise EventLogError("f.csv", 3, "weight", "x", "bad")

    counts = ApplyCounts()
    with pytest.raises(EventLogError):
        apply_events(rec, rows(), clock, counts=counts)
    assert rec.calls == [("batch", 1, [(1, 1)])]
    assert counts.signals == 1


def test_apply_hand_computed_scores_on_the_reference_model() -> None:
    config = Config(half_life_ns=H, window_width_ns=H, window_buckets=2)
    clock = ManualClock(0)
    model = ReferenceModel(config=config, clock=clock)
    rows = [
        AssignRow(2, T, 1, "a"),
        AssignRow(3, T, 2, "a"),
        AssignRow(4, T, 2, "b"),
        SignalRow(5, T, 1, 10, 1, 1.0),
        SignalRow(6, T + H, 2, 10, 1, 2.0),
        LeaveRow(7, T + H, 1),
        SignalRow(8, T + 2 * H, 1, 10, 1, 4.0),  # gated
        RejoinRow(9, T + 2 * H, 1),
        SignalRow(10, T + 2 * H, 1, 20, 2, 0.5),
        PurgeRow(11, T + 3 * H, 2, "b"),
    ]
    manifests: list = []
    counts = apply_events(model, rows, clock, manifests=manifests)
    assert counts.rows == 10 and counts.manifest_entries == 1
    assert model.community_layer_status(1).status is MembershipStatus.Active
    assert model.community_leave_history(1) == [(T + H, T + 2 * H)]
    assert [m.created_at_ns for m in manifests] == [T + 3 * H]
    got = model.aggregate_rows(T + 3 * H)
    want = [
        (COMMUNITY, 10, 1, 0.625, 0, 0.0),
        (COMMUNITY, 20, 2, 0.25, 1, 0.5),
        ("a", 10, 1, 0.625, 0, 0.0),
        ("a", 20, 2, 0.25, 1, 0.5),
    ]
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for g, w in zip(got, want):
        assert math.isclose(g[3], w[3], rel_tol=1e-12) and g[4:] == w[4:]
