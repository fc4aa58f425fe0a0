"""Issue 8: hostile input across the public API and the event-log reader.

Each bad input raises the documented error (an `InvalidArgument` naming the argument,
an `EventLogError` naming the line and field) and changes nothing: a full export of
the database (aggregate rows, statuses, leave histories, cohorts, manifests of every
user involved, and the intake counters) is the same before and after, no actor
failed, and the store still reopens to the same export.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    InvalidArgument,
    ManualClock,
    Signal,
    TidalDb,
)
from tidal_actors.eventlog.log import EventLogError, apply_events, read_events

from ._setups import every_read
from .conftest import HOUR, T0

USERS = (0, 1, 2, 3)
GOOD = Signal(1, 1, 1, 1.0, T0)
HEADER = "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n"


def export(db: TidalDb) -> Any:
    stats = db.stats()
    return (
        *every_read(db, USERS),
        {
            k: stats[k]
            for k in (
                "signals",
                "forwarded",
                "gated",
                "records",
                "purges",
                "retracted",
                "handler_errors",
            )
        },
    )


def _deep(n):
    d: dict = {}
    x = d
    for _ in range(n):
        x["a"] = {}
        x = x["a"]
    return d


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")


def _gen_good_then_bad():
    yield GOOD
    yield GOOD
    yield Signal(1, 1, 1, math.nan)


# (id, call, expected field): every call must raise InvalidArgument for that field
API_CASES: list[Any] = [
    # ids
    ("user bool", lambda db: db.signal_with_context(True, 1, 1), "user_id"),
    ("user negative", lambda db: db.signal_with_context(-1, 1, 1), "user_id"),
    ("user 2**64", lambda db: db.signal_with_context(2**64, 1, 1), "user_id"),
    ("user float", lambda db: db.signal_with_context(1.0, 1, 1), "user_id"),
    ("user str", lambda db: db.signal_with_context("1", 1, 1), "user_id"),
    ("user None", lambda db: db.signal_with_context(None, 1, 1), "user_id"),
    ("user np.int64 negative", lambda db: db.signal_with_context(np.int64(-5), 1, 1), "user_id"),
    ("user np.bool_", lambda db: db.signal_with_context(np.bool_(True), 1, 1), "user_id"),
    ("user np.float64", lambda db: db.signal_with_context(np.float64(1.0), 1, 1), "user_id"),
    ("user np.float32", lambda db: db.signal_with_context(np.float32(1.0), 1, 1), "user_id"),
    ("entity 2**64", lambda db: db.signal_with_context(1, 2**64, 1), "entity_id"),
    ("entity huge", lambda db: db.signal_with_context(1, 10**40, 1), "entity_id"),
    ("type negative", lambda db: db.signal_with_context(1, 1, -1), "signal_type"),
    ("type np.int8 negative", lambda db: db.signal_with_context(1, 1, np.int8(-1)), "signal_type"),
    # weights
    ("weight nan", lambda db: db.signal_with_context(1, 1, 1, math.nan), "weight"),
    ("weight inf", lambda db: db.signal_with_context(1, 1, 1, math.inf), "weight"),
    ("weight -inf", lambda db: db.signal_with_context(1, 1, 1, -math.inf), "weight"),
    ("weight negative", lambda db: db.signal_with_context(1, 1, 1, -1.0), "weight"),
    ("weight tiny negative", lambda db: db.signal_with_context(1, 1, 1, -1e-300), "weight"),
    ("weight str", lambda db: db.signal_with_context(1, 1, 1, "1.0"), "weight"),
    ("weight bool", lambda db: db.signal_with_context(1, 1, 1, True), "weight"),
    ("weight beyond float32", lambda db: db.signal_with_context(1, 1, 1, 1e39), "weight"),
    (
        "weight np.float32 nan",
        lambda db: db.signal_with_context(1, 1, 1, np.float32("nan")),
        "weight",
    ),
    (
        "weight np.float64 inf",
        lambda db: db.signal_with_context(1, 1, 1, np.float64("inf")),
        "weight",
    ),
    ("weight None", lambda db: db.signal_with_context(1, 1, 1, None), "weight"),
    ("weight complex", lambda db: db.signal_with_context(1, 1, 1, 1 + 0j), "weight"),
    ("weight huge int", lambda db: db.signal_with_context(1, 1, 1, 10**400), "weight"),
    # timestamps
    ("ts negative", lambda db: db.signal_with_context(1, 1, 1, 1.0, -1), "timestamp_ns"),
    ("ts 2**63", lambda db: db.signal_with_context(1, 1, 1, 1.0, 2**63), "timestamp_ns"),
    ("ts float", lambda db: db.signal_with_context(1, 1, 1, 1.0, 1.5e18), "timestamp_ns"),
    ("ts bool", lambda db: db.signal_with_context(1, 1, 1, 1.0, True), "timestamp_ns"),
    ("ts str", lambda db: db.signal_with_context(1, 1, 1, 1.0, "now"), "timestamp_ns"),
    # contexts
    ("context list", lambda db: db.signal_with_context(1, 1, 1, 1.0, None, [1, 2]), "context"),
    ("context str", lambda db: db.signal_with_context(1, 1, 1, 1.0, None, "ctx"), "context"),
    (
        "context object value",
        lambda db: db.signal_with_context(1, 1, 1, 1.0, None, {"x": object()}),
        "context",
    ),
    (
        "context set value",
        lambda db: db.signal_with_context(1, 1, 1, 1.0, None, {"x": {1, 2}}),
        "context",
    ),
    (
        "context int too big",
        lambda db: db.signal_with_context(1, 1, 1, 1.0, None, {"x": 2**70}),
        "context",
    ),
    (
        "context nested too deep",
        lambda db: db.signal_with_context(1, 1, 1, 1.0, None, _deep(5000)),
        "context",
    ),
    (
        "context lone surrogate key",
        lambda db: db.signal_with_context(1, 1, 1, 1.0, None, {"\ud800": 1}),
        "context",
    ),
    ("user with a raising repr", lambda db: db.signal_with_context(_BadRepr(), 1, 1), "user_id"),
    ("user a megabyte long", lambda db: db.signal_with_context("9" * 2**20, 1, 1), "user_id"),
    # batches: validated whole before anything is queued
    ("batch int", lambda db: db.signal_batch(5), "signals"),
    ("batch str", lambda db: db.signal_batch("abc"), "signals"),
    ("batch dict", lambda db: db.signal_batch({"a": 1}), "signals"),
    ("batch None", lambda db: db.signal_batch(None), "signals"),
    ("batch tuple element", lambda db: db.signal_batch([GOOD, (1, 1, 1)]), "signals[1]"),
    (
        "batch bad last",
        lambda db: db.signal_batch([GOOD] * 3 + [Signal(1, 1, 1, math.nan)]),
        "signals[3].weight",
    ),
    ("batch bad user", lambda db: db.signal_batch([Signal(-1, 1, 1)]), "signals[0].user_id"),
    ("batch generator", lambda db: db.signal_batch(_gen_good_then_bad()), "signals[2].weight"),
    (
        "batch bad ts",
        lambda db: db.signal_batch([GOOD, Signal(1, 1, 1, 1.0, -5)]),
        "signals[1].timestamp_ns",
    ),
    # cohort names
    ("cohort empty", lambda db: db.assign_cohort(1, ""), "cohort"),
    ("cohort @", lambda db: db.assign_cohort(1, "@x"), "cohort"),
    ("cohort @community", lambda db: db.assign_cohort(1, COMMUNITY), "cohort"),
    ("cohort 201 bytes", lambda db: db.assign_cohort(1, "a" * 201), "cohort"),
    ("cohort 202 utf-8 bytes", lambda db: db.assign_cohort(1, "é" * 101), "cohort"),
    ("cohort lone surrogate", lambda db: db.assign_cohort(1, "c\ud800"), "cohort"),
    ("cohort bytes", lambda db: db.assign_cohort(1, b"c"), "cohort"),
    ("cohort None", lambda db: db.assign_cohort(1, None), "cohort"),
    ("cohort int", lambda db: db.assign_cohort(1, 5), "cohort"),
    ("cohort beyond LMDB key limit", lambda db: db.assign_cohort(1, "k" * 600), "cohort"),
    ("assign user negative", lambda db: db.assign_cohort(-1, "c"), "user_id"),
    ("unassign @community", lambda db: db.unassign_cohort(1, COMMUNITY), "cohort"),
    ("unassign user bool", lambda db: db.unassign_cohort(False, "c"), "user_id"),
    # membership
    ("leave bool", lambda db: db.leave_community_layer(True), "user_id"),
    ("leave 2**64", lambda db: db.leave_community_layer(2**64), "user_id"),
    ("rejoin str", lambda db: db.rejoin_community_layer("2"), "user_id"),
    ("rejoin np negative", lambda db: db.rejoin_community_layer(np.int32(-2)), "user_id"),
    # purges
    ("purge @other", lambda db: db.request_community_purge(1, "@other"), "cohort_name"),
    ("purge empty", lambda db: db.request_community_purge(1, ""), "cohort_name"),
    ("purge 201 bytes", lambda db: db.request_community_purge(1, "x" * 201), "cohort_name"),
    ("purge user negative", lambda db: db.request_community_purge(-1, "c"), "user_id"),
    ("purge cohort None", lambda db: db.request_community_purge(1, None), "cohort_name"),
    ("purge_status negative", lambda db: db.purge_status(-1), "purge_id"),
    ("purge_status bool", lambda db: db.purge_status(True), "purge_id"),
    ("rematerialize @x", lambda db: db.rematerialize("@x"), "cohort"),
    # reads
    ("score cohort @nope", lambda db: db.read_decay_score("@nope", 1, 1), "cohort"),
    ("score at negative", lambda db: db.read_decay_score("c", 1, 1, -1), "at_ns"),
    ("score at 2**63", lambda db: db.read_decay_score("c", 1, 1, 2**63), "at_ns"),
    ("score entity bool", lambda db: db.read_decay_score("c", True, 1), "entity_id"),
    ("window type 2**64", lambda db: db.read_window("c", 1, 2**64), "signal_type"),
    ("window at float", lambda db: db.read_window("c", 1, 1, 1.0), "at_ns"),
    ("top k 0", lambda db: db.top_entities("c", 1, 0), "k"),
    ("top k negative", lambda db: db.top_entities("c", 1, -1), "k"),
    ("top k 2**31", lambda db: db.top_entities("c", 1, 2**31), "k"),
    ("top k bool", lambda db: db.top_entities("c", 1, True), "k"),
    ("top k float", lambda db: db.top_entities("c", 1, 2.0), "k"),
    ("status None", lambda db: db.community_layer_status(None), "user_id"),
    ("history negative", lambda db: db.community_leave_history(-1), "user_id"),
    ("manifests 2**64", lambda db: db.list_purge_manifests(2**64), "user_id"),
    ("cohorts_of str", lambda db: db.cohorts_of("1"), "user_id"),
    ("rows at negative", lambda db: db.aggregate_rows(-5), "at_ns"),
]

# (id, file bytes, expected field): the bad row is the first data row, so nothing before it
EVENT_CASES: list[tuple[str, bytes, str]] = [
    ("empty file", b"", "header"),
    ("wrong header", b"a,b,c\n1,leave,1,,,,\n", "header"),
    ("missing header", b"1,leave,1,,,,\n", "header"),
    ("bad op", (HEADER + "1,jump,1,,,,\n").encode(), "op"),
    ("ts negative", (HEADER + "-1,leave,1,,,,\n").encode(), "ts_ns"),
    ("ts 2**63", (HEADER + f"{2**63},leave,1,,,,\n").encode(), "ts_ns"),
    ("ts decimal", (HEADER + "1.5,leave,1,,,,\n").encode(), "ts_ns"),
    ("ts with spaces", (HEADER + " 5,leave,1,,,,\n").encode(), "ts_ns"),
    ("user negative", (HEADER + "1,leave,-1,,,,\n").encode(), "user_id"),
    ("user 2**64", (HEADER + f"1,leave,{2**64},,,,\n").encode(), "user_id"),
    ("user word", (HEADER + "1,leave,abc,,,,\n").encode(), "user_id"),
    ("user underscores", (HEADER + "1,leave,1_000,,,,\n").encode(), "user_id"),
    ("user arabic digits", (HEADER + "1,leave,\u0663,,,,\n").encode(), "user_id"),
    ("user 5000 digits", (HEADER + "1,leave," + "9" * 5000 + ",,,,\n").encode(), "user_id"),
    ("weight nan", (HEADER + "1,signal,1,,1,1,nan\n").encode(), "weight"),
    ("weight inf", (HEADER + "1,signal,1,,1,1,inf\n").encode(), "weight"),
    ("weight negative", (HEADER + "1,signal,1,,1,1,-1\n").encode(), "weight"),
    ("weight beyond float32", (HEADER + "1,signal,1,,1,1,1e39\n").encode(), "weight"),
    ("weight hex", (HEADER + "1,signal,1,,1,1,0x10\n").encode(), "weight"),
    ("weight fullwidth", (HEADER + "1,signal,1,,1,1,\uff11\n").encode(), "weight"),
    ("signal without entity", (HEADER + "1,signal,1,,,1,1.0\n").encode(), "entity_id"),
    ("signal with cohort", (HEADER + "1,signal,1,c,1,1,1.0\n").encode(), "cohort"),
    ("assign @cohort", (HEADER + "1,assign,1,@x,,,\n").encode(), "cohort"),
    ("assign @community", (HEADER + "1,assign,1,@community,,,\n").encode(), "cohort"),
    ("assign no cohort", (HEADER + "1,assign,1,,,,\n").encode(), "cohort"),
    ("assign 201 bytes", (HEADER + "1,assign,1," + "a" * 201 + ",,,\n").encode(), "cohort"),
    ("leave with cohort", (HEADER + "1,leave,1,c,,,\n").encode(), "cohort"),
    ("purge @other", (HEADER + "1,purge,1,@other,,,\n").encode(), "cohort"),
    ("too many columns", (HEADER + "1,leave,1,,,,,\n").encode(), "columns"),
    ("too few columns", (HEADER + "1,leave,1\n").encode(), "columns"),
    ("unterminated quote", (HEADER + '1,assign,1,"c\n').encode(), "csv"),
    ("non-utf8 cohort", HEADER.encode() + b"1,assign,1,c\xff\xfe,,,\n", "cohort"),
    ("truncated file", (HEADER + "2,signal,1,,5").encode(), "columns"),
]


def _case_id(case):
    return case.id if hasattr(case, "id") else case[0]


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory):
    """A persistent database with some of everything in it, shared by the table."""
    path = str(tmp_path_factory.mktemp("hostile") / "db")
    clock = ManualClock(T0)
    db = TidalDb.open(path, config=Config(ledger_shards=2, membership_shards=2), clock=clock)
    db.assign_cohort(1, "c")
    db.assign_cohort(2, "c")
    db.assign_cohort(2, "d")
    db.signal_batch(
        [Signal(u, e, 1, float(e + 1), T0 - e * HOUR) for u in (1, 2, 3) for e in range(4)]
    )
    db.leave_community_layer(3)
    db.request_community_purge(2, "d")
    db.flush()
    yield db, path, clock
    db.close()


def _check_unchanged(db, before):
    db.flush()
    assert export(db) == before
    assert all(ref.is_alive() for ref in db._core.host._refs.values())


@pytest.mark.parametrize("case", API_CASES, ids=[_case_id(c) for c in API_CASES])
def test_bad_api_input_raises_invalid_argument_and_changes_nothing(hostile_db, case):
    db, _, _ = hostile_db
    _, call, field = case
    before = export(db)
    with pytest.raises(InvalidArgument) as info:
        call(db)
    assert info.value.field == field, str(info.value)
    assert field in str(info.value) and len(str(info.value)) < 1200
    _check_unchanged(db, before)


@pytest.mark.parametrize("case", EVENT_CASES, ids=[c[0] for c in EVENT_CASES])
def test_bad_event_log_raises_event_log_error_and_changes_nothing(hostile_db, tmp_path, case):
    db, _, clock = hostile_db
    _, data, field = case
    path = tmp_path / "events.csv"
    path.write_bytes(data)
    before = export(db)
    now = clock.now_ns()
    with pytest.raises(EventLogError) as info:
        apply_events(db, read_events(path), clock)
    err = info.value
    assert isinstance(err, InvalidArgument) and err.field == field, str(err)
    assert str(err).startswith(f"{path}:") and "\n" not in str(err)
    clock.set(now)
    _check_unchanged(db, before)


def test_event_log_error_mid_file_applies_exactly_the_rows_before_it(tmp_path):
    """Documented: a bad row stops the application; every row before it is applied."""
    from tidal_actors.testing import ReferenceModel

    good = HEADER + "".join(f"{T0 + i},signal,{i % 3},,{i % 4},1,1.5\n" for i in range(50))
    path = tmp_path / "e.csv"
    path.write_text(good + f"{T0 + 99},leave,-4,,,,\n" + f"{T0 + 100},signal,1,,1,1,1\n")
    clock, mclock = ManualClock(T0), ManualClock(T0)
    model = ReferenceModel(clock=mclock)
    with TidalDb.open(clock=clock) as db:
        for target, c in ((db, clock), (model, mclock)):
            with pytest.raises(EventLogError, match=":52: invalid user_id"):
                apply_events(target, read_events(path), c)
        got, want = db.aggregate_rows(T0 + HOUR), model.aggregate_rows(T0 + HOUR)
        assert [r[:3] + r[4:5] for r in got] == [r[:3] + r[4:5] for r in want]
        assert [r[3] for r in got] == pytest.approx([r[3] for r in want], rel=1e-12)
        assert sum(r[4] for r in db.aggregate_rows(T0 + HOUR)) == 50


def test_hostile_inputs_left_the_store_as_it_was(hostile_db):
    """Runs after the tables (file order): the store reopens to the same export."""
    db, path, clock = hostile_db
    before = export(db)
    db.close()
    reopened = TidalDb.open(path, config=db.config, clock=clock)
    try:
        assert export(reopened)[:2] == before[:2]
    finally:
        reopened.close()


OPEN_CASES: list[tuple[str, Callable[[Path], Any], str]] = [
    ("path int", lambda p: TidalDb.open(5), "path"),
    ("config str", lambda p: TidalDb.open(config="x"), "config"),
    ("clock without now_ns", lambda p: TidalDb.open(clock=object()), "clock"),
    ("shards zero", lambda p: Config(membership_shards=0), "membership_shards"),
    ("half-life bool", lambda p: Config(half_life_ns=True), "half_life_ns"),
    (
        "max map below map",
        lambda p: Config(map_size_bytes=2**20, max_map_size_bytes=2**19),
        "max_map_size_bytes",
    ),
    (
        "flush interval nan",
        lambda p: Config(signal_flush_interval_ms=math.nan),
        "signal_flush_interval_ms",
    ),
    ("mailbox negative", lambda p: Config(mailbox_capacity=-1), "mailbox_capacity"),
]


@pytest.mark.parametrize("case", OPEN_CASES, ids=[c[0] for c in OPEN_CASES])
def test_bad_open_arguments_raise_invalid_argument(tmp_path, case):
    _, call, field = case
    with pytest.raises(InvalidArgument) as info:
        call(tmp_path)
    assert info.value.field == field


def test_reopen_with_other_membership_shards_is_refused_and_changes_nothing(tmp_path):
    path = str(tmp_path / "db")
    with TidalDb.open(path, config=Config(membership_shards=2)) as db:
        db.assign_cohort(7, "c")
    with pytest.raises(InvalidArgument) as info:
        TidalDb.open(path, config=Config(membership_shards=3))
    assert info.value.field == "membership_shards"
    with TidalDb.open(path, config=Config(membership_shards=2)) as db:
        assert db.cohorts_of(7) == {"c"}


def test_numpy_scalars_are_taken_as_their_values(db):
    db.assign_cohort(np.uint64(2**64 - 1), "c")
    db.signal_with_context(
        np.uint64(2**64 - 1), np.int32(3), np.int8(1), np.float32(0.5), np.int64(T0)
    )
    assert db.read_decay_score("c", 3, 1, T0) == 0.5


def test_a_failed_open_does_not_leave_the_directory_locked(tmp_path):
    """Found here: an open failing after the in-process registration (here the lock
    file is a directory) left the path registered, so every later open in the
    process said "already open". Each failure is a StorageError, and a repaired
    directory opens."""
    from tidal_actors import StorageError

    path = tmp_path / "db"
    (path / "tidal.lock").mkdir(parents=True)
    with pytest.raises(StorageError):
        TidalDb.open(path)
    (path / "tidal.lock").rmdir()
    TidalDb.open(path).close()
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.mdb").write_bytes(b"not an lmdb file" * 512)
    with pytest.raises(StorageError, match="not an LMDB file"):
        TidalDb.open(other)
    (other / "data.mdb").unlink()
    (other / "lock.mdb").unlink(missing_ok=True)
    with TidalDb.open(other) as db:
        db.assign_cohort(1, "c")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError):
        TidalDb.open(tmp_path / "file")
