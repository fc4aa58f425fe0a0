"""``replay`` of a log whose header is bad: only the error (no summary of 0 rows
before it, which read as a run), exit status 2, the message naming the file and what
is wrong with the header; nothing is opened or made (no ``--data-dir``, no
``--report-out``). And :meth:`EventLogReader.check_header`, which reads the header
alone. Expected messages are written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal_actors.eventlog.log import EventLogError, EventLogReader

from . import test_cli
from .test_cli import HAND_LOG, Run

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model

COLUMNS = "ts_ns,op,user_id,cohort,entity_id,signal_type,weight"
BODY = HAND_LOG.split("\n", 1)[1]  # the hand log's rows, valid under a right header


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (
            "ts,op,user_id,cohort,entity_id,signal_type,weight",
            "invalid header='ts,op,user_id,cohort,entity_id,signal_type,weight': the header "
            f"must name the columns {COLUMNS} (missing: 'ts_ns'; unknown: 'ts')",
        ),
        (
            f"{COLUMNS},extra",
            f"invalid header='{COLUMNS},extra': the header must name the columns {COLUMNS} "
            "(unknown: 'extra')",
        ),
        (
            "ts_ns,op,op,user_id,cohort,entity_id,signal_type",
            "invalid header='ts_ns,op,op,user_id,cohort,entity_id,signal_type': the header "
            f"must name the columns {COLUMNS} (missing: 'weight'; twice: 'op')",
        ),
    ],
)
def test_a_bad_header_is_only_an_error(run: Run, tmp_path: Path, header: str, said: str) -> None:
    log, data, report = tmp_path / "log.csv", tmp_path / "data", tmp_path / "r.json"
    log.write_text(f"{header}\n{BODY}", encoding="utf-8")
    res = run("replay", log, "--data-dir", data, "--report-out", report, "--quiet")
    assert res.code == 2, res
    assert res.out == ""
    assert res.err == f"tidal-actors: error: {log}:1: {said}\n"
    assert not data.exists() and not report.exists()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", f"invalid header='': empty file: missing header line {COLUMNS}"),
        (
            b"1,leave,1,,,,\n",
            f"invalid header='1,leave,1,,,,': missing header: the first line must be {COLUMNS}",
        ),
        (
            b"\xff\xfets_ns\n1,leave,1,,,,\n",
            "invalid header=b'\\xff\\xfets_ns': not valid UTF-8 (an event log is UTF-8 CSV)",
        ),
    ],
)
def test_an_empty_headless_or_undecodable_log_is_only_an_error(
    run: Run, tmp_path: Path, content: bytes, said: str
) -> None:
    log = tmp_path / "log.csv"
    log.write_bytes(content)
    res = run("replay", log, "--quiet")
    assert (res.code, res.out, res.err) == (2, "", f"tidal-actors: error: {log}:1: {said}\n")


def test_check_header_reads_the_header_alone(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    # a reordered header is fine; the bad row on line 2 is not the header's business
    good.write_text("op,ts_ns,user_id,cohort,entity_id,signal_type,weight\nnope\n")
    reader = EventLogReader(good)
    reader.check_header()
    assert (reader.rows, reader.bytes_read) == (0, 0)  # nothing read for iteration
    with pytest.raises(EventLogError) as info:
        list(reader)  # iterating still reports the row
    assert (info.value.line, info.value.field) == (2, "columns")

    bad = tmp_path / "bad.csv"
    bad.write_text("ts_ns,op\n")
    with pytest.raises(EventLogError) as info:
        EventLogReader(bad).check_header()
    assert (info.value.path, info.value.line, info.value.field) == (str(bad), 1, "header")
    assert info.value.reason == (
        f"the header must name the columns {COLUMNS} "
        "(missing: 'user_id', 'cohort', 'entity_id', 'signal_type', 'weight')"
    )
    with pytest.raises(FileNotFoundError):
        EventLogReader(tmp_path / "absent.csv").check_header()
