"""The ``tidal-actors`` command line, end to end.

Each scenario runs twice: in a subprocess on the real runtime (``TidalDb`` on LMDB),
and in process with the database swapped for the reference model (which checks the
command line's own logic, and agrees with the runtime by construction of the check).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._durations import format_duration, parse_duration
from tidal_actors._errors import InvalidArgument
from tidal_actors._types import COMMUNITY
from tidal_actors.cli import commands as cli_module
from tidal_actors.cli import progress, store
from tidal_actors.eventlog.log import HEADER, EventLogReader, apply_events, read_events
from tidal_actors.loadsim.simulate import (
    Scenario,
    builtin_scenarios,
    generate_events,
    load_scenario,
    run_simulation,
)
from tidal_actors.testing.reference import ReferenceModel

ROOT = Path(__file__).resolve().parents[1]
SE_EVENTS = Path(__file__).resolve().parents[1].parent / "shared/data/history-meta-se/events.csv"
SCENARIOS = ROOT / "tidal_actors" / "scenarios"


H = 3_600_000_000_000
T = 10 * H


def _log(*lines: str) -> str:
    """An event log's text: the header, then ``lines``."""
    return "".join(f"{line}\n" for line in (",".join(HEADER), *lines))


# A small log whose scores are computed by hand below (half-life 1h, 1h x 2 buckets).
HAND_LOG = _log(
    f"{T},assign,1,a,,,",
    f"{T},assign,2,a,,,",
    f"{T},assign,2,b,,,",
    f"{T},signal,1,,10,1,1.0",
    f"{T + H},signal,2,,10,1,2.0",
    f"{T + H},leave,1,,,,",
    f"{T + 2 * H},signal,1,,10,1,4.0",  # gated: user 1 has left
    f"{T + 2 * H},rejoin,1,,,,",
    f"{T + 2 * H},signal,1,,20,2,0.5",
    f"{T + 3 * H},purge,2,b,,,",  # retracts user 2's 2.0 from b: b has nothing left
)
HAND_FLAGS = ["--half-life", "1h", "--window-width", "1h", "--window-buckets", "2"]

# At T+3H: e10 got 1.0 at T and 2.0 at T+H (buckets 10, 11: outside the window 12..13);
# e20 got 0.5 at T+2H (bucket 12).
HAND_SCORES = [
    (COMMUNITY, 10, 1, 1.0 * 2**-3 + 2.0 * 2**-2, 0, 0.0),
    (COMMUNITY, 20, 2, 0.5 * 2**-1, 1, 0.5),
    ("a", 10, 1, 1.0 * 2**-3 + 2.0 * 2**-2, 0, 0.0),
    ("a", 20, 2, 0.5 * 2**-1, 1, 0.5),
]
# At T+2H (--at): the window 11..12 holds the 2.0 at T+H.
HAND_SCORES_AT_2H = [
    (COMMUNITY, 10, 1, 1.0 * 2**-2 + 2.0 * 2**-1, 1, 2.0),
    (COMMUNITY, 20, 2, 0.5, 1, 0.5),
    ("a", 10, 1, 1.0 * 2**-2 + 2.0 * 2**-1, 1, 2.0),
    ("a", 20, 2, 0.5, 1, 0.5),
]

BAD_LOG = _log(
    f"{T},assign,1,a,,,",
    f"{T},signal,1,,10,1,1.0",
    f"{T + H},leave,1,,,,",
    f"{T + H},signal,1,,10,1,abc",  # line 5
    f"{T + 2 * H},rejoin,1,,,,",
    f"{T + 2 * H},signal,1,,11,1,1.0",
)


class Result(NamedTuple):
    code: int
    out: str
    err: str


Run = Callable[..., Result]


def _subprocess_run(*args: object) -> Result:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "tidal_actors.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(params=["subprocess", "reference"])
def run(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """Runs the command line: in a subprocess on TidalDb, or in process on the reference model."""
    if request.param == "subprocess":
        yield _subprocess_run
        return
    stores: dict[str, ReferenceModel] = {}

    def open_reference(
        data_dir: Path | None, config: Config, clock: ManualClock, read_only: bool = False
    ) -> Any:
        if data_dir is None:
            return ReferenceModel(config=config, clock=clock)
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "reference.marker").touch()
        model = stores.setdefault(str(data_dir), ReferenceModel(config=config, clock=clock))
        model.clock = clock
        return model

    monkeypatch.setattr(store, "open_db", open_reference)
    runner = CliRunner()

    def invoke(*args: object) -> Result:
        res = runner.invoke(cli_module.cli, [str(a) for a in args], catch_exceptions=False)
        return Result(res.exit_code, res.stdout, res.stderr)

    yield invoke


def read_scores(path: Path) -> list[tuple[str, int, int, float, int, float]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        assert next(reader) == [
            "cohort",
            "entity_id",
            "signal_type",
            "decay_score",
            "window_count",
            "window_weight",
        ]
        return [(c, int(e), int(t), float(s), int(n), float(w)) for c, e, t, s, n, w in reader]


def assert_scores(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], rel: float) -> None:
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for g, w in zip(got, want):
        assert math.isclose(g[3], w[3], rel_tol=rel, abs_tol=0.0), (g, w)
        assert g[4] == w[4], (g, w)
        assert math.isclose(g[5], w[5], rel_tol=rel, abs_tol=0.0), (g, w)


# ---------------------------------------------------------------- replay


def test_replay_of_a_small_log_matches_hand_computed_scores(run: Run, tmp_path: Path) -> None:
    log = tmp_path / "hand.csv"
    log.write_text(HAND_LOG)
    scores, report = tmp_path / "scores.csv", tmp_path / "report.json"
    res = run("replay", log, *HAND_FLAGS, "--scores-out", scores, "--report-out", report)
    assert res.code == 0, res
    assert_scores(read_scores(scores), HAND_SCORES, 1e-12)
    data = json.loads(report.read_text())
    assert {
        k: data[k]
        for k in (
            "rows",
            "signals",
            "forwarded",
            "gated",
            "contribution_records",
            "purges",
            "retracted_records",
            "manifests",
            "leaves",
            "rejoins",
            "assigns",
            "skipped_rows",
        )
    } == {
        "rows": 10,
        "signals": 4,
        "forwarded": 3,
        "gated": 1,
        "contribution_records": 7,
        "purges": 1,
        "retracted_records": 1,
        "manifests": 1,
        "leaves": 1,
        "rejoins": 1,
        "assigns": 3,
        "skipped_rows": 0,
    }
    assert data["elapsed_s"] > 0 and data["signals_per_s"] > 0
    assert "replayed 10 rows" in res.out and "ephemeral" in res.out
    assert data["host"] == "pykka" and "\n  host       pykka\n" in res.out  # the default
    assert res.err == ""

    res = run("replay", log, *HAND_FLAGS, "--at", T + 2 * H, "--scores-out", scores, "--quiet")
    assert res.code == 0, res
    assert_scores(read_scores(scores), HAND_SCORES_AT_2H, 1e-12)


def test_replay_settings_come_from_a_config_file(run: Run, tmp_path: Path) -> None:
    log = tmp_path / "hand.csv"
    log.write_text(HAND_LOG)
    config = tmp_path / "c.toml"
    config.write_text(
        "[decay]\nhalf_life_ns = 3600000000000\n"
        "[window]\nwindow_width_ns = 3600000000000\nwindow_buckets = 2\n"
    )
    scores = tmp_path / "scores.csv"
    res = run("replay", log, "--config", config, "--scores-out", scores)
    assert res.code == 0, res
    assert_scores(read_scores(scores), HAND_SCORES, 1e-12)


def test_inspect_reads_the_data_dir_a_replay_left(run: Run, tmp_path: Path) -> None:
    log, data = tmp_path / "hand.csv", tmp_path / "data"
    log.write_text(HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0

    res = run("inspect", "--data-dir", data, "user", 1)
    assert res.code == 0, res
    assert "status         Active" in res.out
    assert f"left {T + H} " in res.out and f"rejoined {T + 2 * H} " in res.out
    assert "cohorts        a" in res.out and "manifests      0" in res.out

    res = run("inspect", "--data-dir", data, "user", 2)
    assert res.code == 0, res
    assert "cohorts        a, b" in res.out and "manifests      1" in res.out
    assert f"cohort b  created {T + 3 * H} " in res.out and "1 entry, 0 evicted" in res.out

    # default read time: the last replayed event, with the replay's half-life
    res = run("inspect", "--data-dir", data, "top", "a")
    assert res.code == 0, res
    assert f"at {T + 3 * H} " in res.out
    assert "entity 10" in res.out and "score 0.625" in res.out
    assert "signal type 2: top 1" in res.out and "score 0.25" in res.out

    res = run(
        "inspect", "--data-dir", data, "top", COMMUNITY, "--type", 1, "-k", 1, "--at", T + 2 * H
    )
    assert res.code == 0, res
    assert "signal type 1: top 1" in res.out and "score 1.25" in res.out
    assert "signal type 2" not in res.out

    res = run("inspect", "--data-dir", data, "top", "b")
    assert res.code == 0 and "no contributions" in res.out

    res = run("inspect", "--data-dir", data, "manifests", 2)
    assert res.code == 0, res
    assert "user 2: 1 manifest" in res.out and "cohort      b" in res.out
    assert f"entity 10  type 1  weight 2.0  ts {T + H} " in res.out

    res = run("inspect", "--data-dir", data, "manifests", 1)
    assert res.code == 0 and "user 1: 0 manifests" in res.out


def test_a_bad_row_stops_the_replay_and_the_rows_before_it_stay(run: Run, tmp_path: Path) -> None:
    log, data, report = tmp_path / "bad.csv", tmp_path / "data", tmp_path / "r.json"
    log.write_text(BAD_LOG)
    res = run("replay", log, "--data-dir", data, "--report-out", report)
    assert res.code == 2, res
    lines = res.err.strip().splitlines()
    assert len(lines) == 1
    assert f"{log}:5:" in lines[0] and "weight" in lines[0] and "'abc'" in lines[0]
    assert json.loads(report.read_text())["rows"] == 3

    res = run("inspect", "--data-dir", data, "user", 1)
    assert res.code == 0, res
    assert "status         Left" in res.out and f"left_at_ns     {T + H} " in res.out
    res = run("inspect", "--data-dir", data, "top", "a")
    assert "entity 10" in res.out and "entity 11" not in res.out


def test_skip_invalid_skips_and_counts_bad_rows(run: Run, tmp_path: Path) -> None:
    log, data, report = tmp_path / "bad.csv", tmp_path / "data", tmp_path / "r.json"
    log.write_text(BAD_LOG)
    res = run("replay", log, "--data-dir", data, "--report-out", report, "--skip-invalid")
    assert res.code == 0, res
    got = json.loads(report.read_text())
    assert (got["rows"], got["skipped_rows"], got["signals"], got["gated"]) == (5, 1, 2, 0)
    assert "1 invalid row skipped" in res.out and f"{log}:5:" in res.out

    res = run("inspect", "--data-dir", data, "user", 1)
    assert "status         Active" in res.out
    res = run("inspect", "--data-dir", data, "top", "a")
    assert "entity 10" in res.out and "entity 11" in res.out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "missing.csv"], "does not exist"),
        (["replay", "{log}", "--half-life", "7x"], "7x"),
        (["replay", "{log}", "--half-life", "0s"], "must be positive"),
        (["replay", "{log}", "--window-buckets", "0"], "window-buckets"),
        (["replay", "{log}", "--at", "-1"], "--at"),
        (["replay", "{log}", "--config", "{cfg}"], "unknown setting"),
        (["inspect", "--data-dir", "{tmp}", "user", str(2**64)], "USER_ID"),
        (["inspect", "--data-dir", "{tmp}/nope", "user", "1"], "does not exist"),
        (["inspect", "--data-dir", "{empty}", "user", "1"], "empty directory"),
        (["inspect", "--data-dir", "{tmp}", "top", "@nope"], "reserved"),
        (["simulate", "--scenario", "no-such-scenario"], "no such file or built-in scenario"),
        (["simulate", "--scenario", "{cfg}"], "unknown key"),
        (["simulate", "--scenario", "small", "--data-dir", "{tmp}"], "not empty"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    # in process: each fails before any database is opened
    (tmp_path / "log.csv").write_text(HAND_LOG)
    (tmp_path / "c.toml").write_text("nonsense = 1\n")
    (tmp_path / "empty").mkdir()
    fill = {
        "log": tmp_path / "log.csv",
        "cfg": tmp_path / "c.toml",
        "tmp": tmp_path,
        "empty": tmp_path / "empty",
    }
    res = CliRunner().invoke(cli_module.cli, [a.format(**fill) for a in args])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr


def test_help_lists_the_commands() -> None:
    res = _subprocess_run("--help")
    assert res.code == 0
    for command in ("replay", "inspect", "simulate"):
        assert command in res.out


@pytest.mark.skipif(not SE_EVENTS.is_file(), reason=f"{SE_EVENTS} is not present")
def test_replay_of_the_stack_exchange_log(run: Run, tmp_path: Path) -> None:
    scores, report, data = tmp_path / "scores.csv", tmp_path / "report.json", tmp_path / "data"
    res = run(
        "replay", SE_EVENTS, "--data-dir", data, "--scores-out", scores, "--report-out", report
    )
    assert res.code == 0, res
    got = json.loads(report.read_text())
    assert (
        got["rows"],
        got["signals"],
        got["assigns"],
        got["leaves"],
        got["rejoins"],
        got["purges"],
        got["manifests"],
        got["skipped_rows"],
    ) == (5751, 4905, 766, 44, 21, 15, 15, 0)
    assert got["forwarded"] + got["gated"] == 4905

    # the same operations through the reference model, in process
    clock = ManualClock(0)
    model = ReferenceModel(config=Config(), clock=clock)
    counts = apply_events(model, read_events(SE_EVENTS), clock)
    stats = model.stats()
    assert (
        got["forwarded"],
        got["gated"],
        got["contribution_records"],
        got["retracted_records"],
    ) == (stats["forwarded"], stats["gated"], stats["records"], stats["retracted"])
    assert_scores(read_scores(scores), model.aggregate_rows(counts.max_ts_ns), 1e-9)

    res = run("inspect", "--data-dir", data, "user", 1002)
    assert res.code == 0 and "manifests      1" in res.out


# ---------------------------------------------------------------- simulate


def test_simulate_small_agrees_with_the_reference(run: Run, tmp_path: Path) -> None:
    data, events, report = tmp_path / "data", tmp_path / "events.csv", tmp_path / "r.json"
    res = run(
        "simulate",
        "--scenario",
        SCENARIOS / "small.toml",
        "--data-dir",
        data,
        "--events-out",
        events,
        "--report-out",
        report,
    )
    assert res.code == 0, res
    assert "check      OK" in res.out and "signals/s" in res.out
    got = json.loads(report.read_text())
    assert got["check_ok"] and got["signals"] == 3000 and got["mismatches"] == 0
    assert got["aggregate_rows"] > 0 and got["manifests_compared"] == got["purges"] > 0

    # the generated log replays to the same counters
    res = run(
        "replay",
        events,
        "--config",
        _config_file(tmp_path, "small"),
        "--report-out",
        tmp_path / "r2.json",
    )
    assert res.code == 0, res
    again = json.loads((tmp_path / "r2.json").read_text())
    assert (again["forwarded"], again["gated"], again["contribution_records"]) == (
        got["stats"]["forwarded"],
        got["stats"]["gated"],
        got["stats"]["records"],
    )

    user = next(r.user_id for r in generate_events(load_scenario("small")) if r.op == "purge")
    res = run("inspect", "--data-dir", data, "manifests", user)
    assert res.code == 0 and "manifest " in res.out


def _config_file(tmp_path: Path, scenario: str) -> Path:
    """The scenario's settings as a config file (durations and by-type half-lives)."""
    cfg = load_scenario(scenario).build_config()
    lines = [
        f"half_life_ns = {cfg.half_life_ns}",
        f"window_width_ns = {cfg.window_width_ns}",
        f"window_buckets = {cfg.window_buckets}",
        f"membership_shards = {cfg.membership_shards}",
        "[half_life_ns_by_type]",
    ]
    lines += [f'"{k}" = {v}' for k, v in cfg.half_life_ns_by_type.items()]
    path = tmp_path / f"{scenario}-config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_simulate_eviction_scenario(run: Run) -> None:
    res = run("simulate", "--scenario", "eviction", "--quiet", "--seed", 3)
    assert res.code == 0, res
    assert "(seed 3)" in res.out and "check      OK" in res.out


@pytest.mark.slow
def test_simulate_default_scenario() -> None:
    res = _subprocess_run("simulate", "--quiet")
    assert res.code == 0, res
    assert "scenario default" in res.out and "check      OK" in res.out


class _Lossy(ReferenceModel):
    """A broken runtime: drops every 97th signal."""

    def signal_batch(self, signals: Any) -> None:
        signals = list(signals)
        super().signal_batch([s for i, s in enumerate(signals) if i % 97 != 5])


def test_simulate_exits_1_when_the_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        store, "open_db", lambda data_dir, config, clock: _Lossy(config=config, clock=clock)
    )
    res = CliRunner().invoke(cli_module.cli, ["simulate", "--scenario", "small"])
    assert res.exit_code == 1, res.output
    assert "check      FAILED" in res.stdout and "aggregate" in res.stdout


# ---------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("90d", 90 * 86_400 * 10**9),
        ("12h", 12 * 3600 * 10**9),
        ("30m", 30 * 60 * 10**9),
        ("15s", 15 * 10**9),
        ("250ms", 250 * 10**6),
        ("7us", 7000),
        ("5ns", 5),
        ("123", 123),
        (" 2h ", 2 * 3600 * 10**9),
        (42, 42),
    ],
)
def test_parse_duration(text: str | int, ns: int) -> None:
    assert parse_duration(text) == ns
    assert parse_duration(format_duration(ns)) == ns


@pytest.mark.parametrize(
    "text", ["", "h", "1.5h", "-3s", "3 s", "3S", "1w", "1e9", "٣s", True, None]
)
def test_parse_duration_rejects(text: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_duration(text, field="--half-life")
    assert info.value.field == "--half-life"


def test_builtin_scenarios_are_shipped_and_copied_to_config() -> None:
    assert {"default", "small", "eviction"} <= set(builtin_scenarios())
    for path in SCENARIOS.glob("*.toml"):
        assert (ROOT / "config" / "scenarios" / path.name).read_text() == path.read_text()
    default = load_scenario(None)
    assert (default.users, default.cohorts, default.entities, default.signals) == (
        2000,
        20,
        5000,
        50_000,
    )


def test_generation_is_deterministic_from_the_seed() -> None:
    small = load_scenario("small")
    assert generate_events(small) == generate_events(load_scenario(SCENARIOS / "small.toml"))
    assert generate_events(small) != generate_events(small.with_seed(8))
    rows = generate_events(small)
    assert [r.ts_ns for r in rows] == sorted(r.ts_ns for r in rows)
    assert {r.op for r in rows} == {"assign", "signal", "leave", "rejoin", "purge"}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"users": 0}, "scenario.users"),
        ({"zipf_exponent": -1}, "scenario.zipf_exponent"),
        ({"cohorts": 2, "cohorts_per_user": [1, 3]}, "scenario.cohorts_per_user"),
        ({"signal_types": []}, "scenario.signal_types"),
        ({"signal_types": [{"id": 1}, {"id": 1}]}, "scenario.signal_types"),
        ({"duration": "soon"}, "scenario.duration"),
        ({"config": {"bogus": 1}}, "config.bogus"),
        ({"colour": "blue"}, "scenario.colour"),
    ],
)
def test_bad_scenarios_are_rejected(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scenario.from_mapping(data)
    assert info.value.field == field


def test_run_simulation_reference_against_itself() -> None:
    result = run_simulation(
        load_scenario("small"),
        lambda config, clock: ReferenceModel(config=config, clock=clock),
        reference=ReferenceModel,
    )
    assert result.check.ok and result.check.mismatches == 0
    assert result.counts.signals == 3000 and result.signals_per_s > 0


def _md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def test_inspect_writes_nothing_and_runs_no_pending_rebuild(tmp_path: Path) -> None:
    """inspect opens the store read-only: data.mdb is byte for byte what it was, and a
    purge whose re-materialization the owner left pending stays pending (a read-write
    open would resume it, erase history, and write a snapshot at close)."""
    from tidal_actors import TidalDb

    data = tmp_path / "s"
    cfg = Config(rematerialize_after_ms=None)
    with TidalDb.open(str(data), config=cfg, clock=ManualClock(T)) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 5, 1, 1.0, T)
        pid, _ = db.request_community_purge(1, "c")
    before = _md5(data / "data.mdb")
    for _ in range(2):
        res = _subprocess_run("inspect", "--data-dir", data, "purge", f"{int(pid):032x}")
        assert res.code == 0, res
        assert "re-materialization pending" in res.out, res.out
        res = _subprocess_run("inspect", "--data-dir", data, "user", 1)
        assert res.code == 0 and "manifests      1" in res.out, res
    assert _md5(data / "data.mdb") == before
    with TidalDb.open(str(data), config=cfg, clock=ManualClock(T)) as db:
        assert not db.purge_status(pid).rematerialized  # the owner's setting held


def test_replay_finishes_the_purges_rebuilds_before_closing(tmp_path: Path) -> None:
    """A replay's store and scores do not depend on how fast it ran: the purged
    cohorts are re-materialized before the replay closes (each at its purge's ts_ns +
    rematerialize_after_ms, in event time; see tests/test_cli_safety.py)."""
    log, data = tmp_path / "hand.csv", tmp_path / "data"
    log.write_text(HAND_LOG)
    res = _subprocess_run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet")
    assert res.code == 0, res
    res = _subprocess_run("inspect", "--data-dir", data, "manifests", 2)
    assert res.code == 0, res
    pid = next(w for w in res.out.split() if len(w) == 32)
    res = _subprocess_run("inspect", "--data-dir", data, "purge", pid)
    assert res.code == 0, res
    assert "re-materialized" in res.out and "pending" not in res.out, res.out


@pytest.mark.parametrize("bad", ["1799", "xyz", "0" * 31, "0" * 33, "-" + "0" * 31])
def test_inspect_purge_id_must_be_32_hex_digits(tmp_path: Path, bad: str) -> None:
    from tidal_actors import TidalDb

    with TidalDb.open(str(tmp_path / "s")):
        pass
    res = _subprocess_run("inspect", "--data-dir", tmp_path / "s", "purge", bad)
    assert res.code == 2 and "must be 32 hex digits" in res.err, res


def test_inspect_unknown_purge_id_is_bad_input(tmp_path: Path) -> None:
    from tidal_actors import TidalDb

    with TidalDb.open(str(tmp_path / "s")):
        pass
    res = _subprocess_run("inspect", "--data-dir", tmp_path / "s", "purge", "0" * 31 + "1")
    assert res.code == 2 and f"no purge with id {'0' * 31}1 in" in res.err, res
    assert "UnknownPurge" not in res.err and "PurgeId(" not in res.err, res


def test_simulate_on_a_data_dir_times_the_reopen(tmp_path: Path) -> None:
    import json

    res = _subprocess_run(
        "simulate",
        "--scenario",
        "small",
        "--scale",
        "0.2",
        "--data-dir",
        tmp_path / "d",
        "--report-out",
        tmp_path / "r.json",
        "-q",
    )
    assert res.code == 0, res
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["restore_s"] is not None and report["restore_s"] > 0, report


def test_inspect_negative_user_id_is_named(tmp_path: Path) -> None:
    from tidal_actors import TidalDb

    with TidalDb.open(str(tmp_path / "s")):
        pass
    for cmd in ("user", "manifests"):
        res = _subprocess_run("inspect", "--data-dir", tmp_path / "s", cmd, "-1")
        assert res.code == 2 and "USER_ID" in res.err and "-1" in res.err, res


def test_the_replay_bar_says_it_counts_bytes_and_shows_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = tmp_path / "hand.csv"
    log.write_text(HAND_LOG)
    screen = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    reader = EventLogReader(log)
    size = log.stat().st_size
    with progress.read_bar(size, "B", False, "hand.csv: bytes of the file read") as bar:
        bar.mininterval = bar.miniters = 0  # draw every update, not 10 a second
        rows = list(progress.with_progress(reader, bar, lambda: reader.bytes_read))
        assert bar.n == size  # the whole file read
    # the last state drawn (the bar is cleared when it closes)
    shown = [ln for ln in screen.getvalue().replace("\r", "\n").splitlines() if ln.strip()][-1]
    assert "bytes of the file read" in shown and f"{len(rows)} rows" in shown, shown
    assert len(rows) == HAND_LOG.count("\n") - 1  # the header is no row
