"""The command line keeps a store safe across runs (outside review, items 10-12).

- 10: ``replay`` refuses a ``--data-dir`` that already holds a store unless
  ``--append`` is given (a log replayed twice is applied twice).
- 11: Ctrl-C (SIGINT) stops ``replay`` at a row boundary and ``simulate`` at a safe
  point: the store flushed and closed, the settings file written, exit 130, and
  for replay ``--skip-rows N --append`` goes on to the store one uninterrupted
  replay gives.
- 12: a purge's re-materialization time during a replay is an event time the log
  alone determines (the purge's ``ts_ns`` + ``rematerialize_after_ms``, later
  purges of the cohort within that delay coalesced), however fast the replay ran.

Expected values are computed by hand or by the reference model, never read back
from the code under test. Subprocesses import this worktree's code (PYTHONPATH).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._types import COMMUNITY
from tidal_actors.cli import commands as cli_module
from tidal_actors.cli import store
from tidal_actors.eventlog.log import (
    AssignRow,
    EventLogReader,
    EventRow,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
    apply_events,
    write_events,
)
from tidal_actors.loadsim.interrupt import StopOnSigint
from tidal_actors.loadsim.simulate import generate_events, load_scenario
from tidal_actors.testing.reference import ReferenceModel

from . import test_cli
from .test_cli import HAND_FLAGS, HAND_LOG, H, Run, T, _subprocess_run, read_scores

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model

ROOT = Path(__file__).resolve().parents[1]
S = 1_000_000_000  # one second in ns

# A wrapper that runs the command line with every row of the log read slowly from
# row AFTER on (a "slow path" for the tests), touching MARKER (holding the path of
# the tidal_actors it imported) when it gets there.
SLOW_CLI = """
import sys, time, pathlib
import tidal_actors, tidal_actors.eventlog.log as ev
marker, after, pause = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
orig, seen = ev.EventLogReader._parse, [0]
def slow(self, *args):
    seen[0] += 1
    if seen[0] == after:
        marker.write_text(tidal_actors.__file__)
    if seen[0] >= after:
        time.sleep(pause)
    return orig(self, *args)
ev.EventLogReader._parse = slow
from tidal_actors.cli import main
main(sys.argv[4:])
"""

# simulate, with its runtime pass slowed from row AFTER on (same marker).
SLOW_SIMULATE = """
import sys, time, pathlib
import tidal_actors, tidal_actors.loadsim.simulate as sim
marker, after, pause = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
orig = sim._apply_measured
def slow_apply(db, rows, *args):
    def slowly():
        for i, row in enumerate(rows):
            if i == after:
                marker.write_text(tidal_actors.__file__)
            if i >= after:
                time.sleep(pause)
            yield row
    return orig(db, slowly(), *args)
sim._apply_measured = slow_apply
from tidal_actors.cli import main
main(sys.argv[4:])
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_run(
    tmp_path: Path, script: str, after: int, pause: float, *args: object
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (SLOW_CLI or SLOW_SIMULATE) with ``args``; send SIGINT once it has
    reached row ``after`` (while it goes slowly); return the finished process."""
    wrapper, marker = tmp_path / "slow.py", tmp_path / "reached"
    wrapper.write_text(script)
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), str(marker), str(after), str(pause), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
        # a terminal's Ctrl-C, even when this suite runs with SIGINT ignored (nohup)
        preexec_fn=_sigint_default,
    )
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.exists(), proc.communicate()
    # the subprocess runs this worktree's code, not another installed copy
    assert Path(marker.read_text()).resolve().is_relative_to(ROOT), marker.read_text()
    time.sleep(10 * pause)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------- logs


def _generated_log(rows: int, seed: int, purge_every: int, step_ns: int = S) -> list[EventRow]:
    """A log of ``rows`` rows, one every ``step_ns``: 40 users in 1-2 of 4 cohorts,
    signals, a purge every ``purge_every`` rows (cohorts and @community), leaves,
    rejoins and late assigns."""
    rng = random.Random(seed)
    cohorts = ["c0", "c1", "c2", "c3"]
    out: list[EventRow] = []
    t = 1_600_000_000 * S
    for user in range(1, 41):
        for cohort in rng.sample(cohorts, rng.choice([1, 2])):
            t += step_ns
            out.append(AssignRow(0, t, user, cohort))
    while len(out) < rows:
        t += step_ns
        i, user = len(out), rng.randint(1, 40)
        if i % purge_every == 0:
            out.append(PurgeRow(0, t, user, rng.choice(cohorts + [COMMUNITY])))
        elif i % 89 == 0:
            out.append(LeaveRow(0, t, user))
        elif i % 97 == 0:
            out.append(RejoinRow(0, t, user))
        elif i % 211 == 0:
            out.append(AssignRow(0, t, user, rng.choice(cohorts)))
        else:
            out.append(
                SignalRow(
                    0,
                    t,
                    user,
                    rng.randint(1, 30),
                    rng.randint(1, 2),
                    rng.choice([0.5, 1.0, 2.0, 3.25]),
                )
            )
    return out


def _expected_rebuild_times(
    rows: list[EventRow], delay_ns: int, complete: bool
) -> list[int | None]:
    """By hand, the rule of docs/cli.md: the rematerialized_at_ns of each purge row in order
    (None: still pending). A purge of cohort c at ts makes c due at ts + delay unless
    c is due already; c is rebuilt at its due time before the first row at or after
    it; at the end of a complete replay, every cohort still due at its due time."""
    due: dict[str, tuple[int, list[int]]] = {}
    times: list[int | None] = []
    for row in rows:
        for cohort in [c for c, (d, _) in due.items() if row.ts_ns >= d]:
            d, members = due.pop(cohort)
            for k in members:
                times[k] = d
        if isinstance(row, PurgeRow):
            times.append(None)
            if row.cohort in due:
                due[row.cohort][1].append(len(times) - 1)
            else:
                due[row.cohort] = (row.ts_ns + delay_ns, [len(times) - 1])
    if complete:
        for d, members in due.values():
            for k in members:
                times[k] = d
    return times


def _open_read_only(data_dir: Path, at_ns: int) -> Any:
    from tidal_actors.facades.blocking import TidalDb, open_core

    state = json.loads((data_dir / store.STATE_FILE).read_text())
    config = Config.from_mapping(state["config"])
    return TidalDb(open_core(str(data_dir), config, ManualClock(at_ns), read_only=True))


def _users_state(db: Any, users: range) -> dict[int, Any]:
    out = {}
    for u in users:
        status = db.community_layer_status(u)
        manifests = [
            (int(m.purge_id), m.cohort, m.created_at_ns, m.entries, m.evicted)
            for m in db.list_purge_manifests(u)
        ]
        out[u] = (
            status.status.name,
            status.left_at_ns,
            db.community_leave_history(u),
            sorted(db.cohorts_of(u)),
            manifests,
        )
    return out


def _store_state(data_dir: Path, at_ns: int, users: range) -> dict[str, Any]:
    """Everything the store answers: aggregates at ``at_ns``, users, purge statuses."""
    with _open_read_only(data_dir, at_ns) as db:
        people = _users_state(db, users)
        pids = sorted(m[0] for u in people.values() for m in u[4])
        return {
            "rows": db.aggregate_rows(at_ns),
            "users": people,
            "statuses": [db.purge_status(pid) for pid in pids],
        }


def _assert_rows_close(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for g, w in zip(got, want):
        assert math.isclose(g[3], w[3], rel_tol=1e-9, abs_tol=1e-12), (g, w)
        assert g[4] == w[4], (g, w)
        assert math.isclose(g[5], w[5], rel_tol=1e-9, abs_tol=1e-12), (g, w)


def _assert_statuses(statuses: list[Any], rows: list[EventRow], expected: list[int | None]) -> None:
    """Each purge row's status (purge ids follow the rows' order) against ``expected``."""
    purges = [r for r in rows if isinstance(r, PurgeRow)]
    assert len(statuses) == len(purges) == len(expected)
    for st, row, at in zip(statuses, purges, expected):
        assert (st.user_id, st.cohort) == (row.user_id, row.cohort)
        assert (st.rematerialized, st.rematerialized_at_ns) == (at is not None, at), (st, row)
        assert st.excluded_by_rematerialization == 0  # the log evicted nothing


# ---------------------------------------------------------------- 10: --append


def test_replay_refuses_a_store_unless_append(run: Run, tmp_path: Path) -> None:
    log, data, scores = tmp_path / "hand.csv", tmp_path / "data", tmp_path / "s.csv"
    log.write_text(HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "-q").code == 0

    res = run("replay", log, *HAND_FLAGS, "--data-dir", data, "-q")
    assert res.code == 2, res
    assert "--append" in res.err and "--data-dir" in res.err and "already holds" in res.err
    # nothing was applied: a's entity 10 at T+3H is still 1.0 * 2**-3 + 2.0 * 2**-2
    res = run("inspect", "--data-dir", data, "top", "a", "--type", 1)
    assert f"score {1.0 * 2**-3 + 2.0 * 2**-2!r}" in res.out, res
    res = run("inspect", "--data-dir", data, "user", 1)
    assert "leave history  1 epoch\n" in res.out, res

    # --append applies it again: the reference model given the log twice
    res = run("replay", log, "--data-dir", data, "--append", "--scores-out", scores, "-q")
    assert res.code == 0, res
    clock = ManualClock(0)
    model = ReferenceModel(
        config=Config(half_life_ns=H, window_width_ns=H, window_buckets=2), clock=clock
    )
    rows = list(EventLogReader(log))
    apply_events(model, rows, clock)
    apply_events(model, rows, clock)
    want = model.aggregate_rows(T + 3 * H)
    _assert_rows_close(read_scores(scores), want)
    assert ("a", 10, 1) in [r[:3] for r in want]
    res = run("inspect", "--data-dir", data, "top", "a", "--type", 1)
    assert f"score {2 * (1.0 * 2**-3 + 2.0 * 2**-2)!r}" in res.out, res
    res = run("inspect", "--data-dir", data, "user", 1)
    assert "leave history  2 epochs\n" in res.out, res


def test_replay_into_a_new_or_empty_dir_needs_no_append(tmp_path: Path) -> None:
    log = tmp_path / "hand.csv"
    log.write_text(HAND_LOG)
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a store")
    runner = CliRunner()
    for target in ("new", "empty"):
        res = runner.invoke(
            cli_module.cli, ["replay", str(log), "-q", "--data-dir", str(tmp_path / target)]
        )
        assert res.exit_code == 0, res.output
    # a directory of other files: a new or empty one is the way, --append is not
    res = runner.invoke(cli_module.cli, ["replay", str(log), "--data-dir", str(tmp_path / "other")])
    err = " ".join(res.stderr.split())
    assert res.exit_code == 2 and "holds no tidal_actors store" in err, res.stderr
    assert "new or empty directory" in err and "--append" not in err
    # and --append does not make a store among them
    res = runner.invoke(
        cli_module.cli, ["replay", str(log), "--append", "--data-dir", str(tmp_path / "other")]
    )
    err = " ".join(res.stderr.split())
    assert res.exit_code == 2 and "no store to --append to" in err and "new or empty" in err
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------- 11: Ctrl-C


def test_stop_on_sigint_asks_once_then_raises() -> None:
    # as in a terminal, even when the suite itself runs with SIGINT ignored (nohup, a
    # background job: StopOnSigint then leaves it ignored, the next test)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        with StopOnSigint() as stop:
            assert not stop.requested()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler runs in the main thread
            assert stop.requested()
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, outer)


def test_stop_on_sigint_keeps_sigint_ignored_when_it_was() -> None:
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopOnSigint() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            assert not stop.requested()  # ignored, as the caller chose
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)


def test_skip_rows(run: Run, tmp_path: Path) -> None:
    log, report = tmp_path / "hand.csv", tmp_path / "r.json"
    log.write_text(HAND_LOG)
    res = run("replay", log, *HAND_FLAGS, "--skip-rows", 3, "--report-out", report, "-q")
    assert res.code == 0, res
    got = json.loads(report.read_text())
    # rows 4-10 of HAND_LOG: 4 signals (one gated: user 1 has left), leave, rejoin, purge
    assert (
        got["rows"],
        got["skipped_first_rows"],
        got["signals"],
        got["assigns"],
        got["leaves"],
        got["purges"],
    ) == (7, 3, 4, 0, 1, 1)
    assert "after skipping the first 3" in res.out

    res = run("replay", log, "--skip-rows", 11)
    assert res.code == 2 and "--skip-rows=11" in res.err and "only 10 rows" in res.err, res
    assert "replayed" not in res.out, res  # no summary of a replay that did nothing


def test_sigint_stops_a_replay_at_a_row_boundary_and_append_goes_on(tmp_path: Path) -> None:
    rows = _generated_log(3000, seed=5, purge_every=15)
    log, config = tmp_path / "gen.csv", tmp_path / "c.toml"
    write_events(log, rows)
    delay_ns = 20 * S  # 20 rows: some purge is always waiting for its rebuild
    config.write_text("[purge]\nrematerialize_after_ms = 20000\n")
    data, whole = tmp_path / "data", tmp_path / "whole"

    proc = _interrupted_run(
        tmp_path, SLOW_CLI, 1200, 0.01, "replay", log, "--config", config, "--data-dir", data
    )
    assert proc.returncode == 130, proc
    assert "Aborted" not in proc.stderr and "interrupted after" in proc.stderr, proc.stderr
    hint = next(line for line in proc.stdout.splitlines() if "to go on" in line)
    n = int(hint.split("--skip-rows ")[1].split()[0])
    assert hint.endswith(f"--data-dir {data} --skip-rows {n} --append"), hint
    assert 1200 <= n < 3000, proc.stdout
    assert proc.stdout.startswith(f"interrupted after {n:,} rows"), proc.stdout

    # the settings file is there (inspect reads at the last applied event)...
    state = json.loads((data / "tidal-actors-cli.json").read_text())
    assert state["config"]["rematerialize_after_ms"] == 20000
    assert state["last_event_ns"] == rows[n - 1].ts_ns
    assert state["stopped"] == {"after_rows": n, "why": "interrupted"}
    assert state["pending_rematerializations"], state  # the case worth testing
    res = _subprocess_run("inspect", "--data-dir", data, "user", 1)
    assert res.code == 0, res

    # ... and the store holds exactly the first n rows: the reference model's state
    clock = ManualClock(0)
    model = ReferenceModel(config=Config(), clock=clock)
    apply_events(model, rows[:n], clock)
    at = rows[n - 1].ts_ns
    got = _store_state(data, at, range(1, 41))
    _assert_rows_close(got["rows"], model.aggregate_rows(at))
    assert got["users"] == _users_state(model, range(1, 41))
    _assert_statuses(got["statuses"], rows[:n], _expected_rebuild_times(rows[:n], delay_ns, False))

    # --skip-rows n --append: the store of one uninterrupted replay
    res = _subprocess_run("replay", log, "--data-dir", data, "--skip-rows", n, "--append", "-q")
    assert res.code == 0, res
    assert f"replayed {3000 - n:,} rows" in res.out and f"skipping the first {n:,}" in res.out
    res = _subprocess_run("replay", log, "--config", config, "--data-dir", whole, "-q")
    assert res.code == 0, res
    end = rows[-1].ts_ns
    resumed, uninterrupted = (
        _store_state(data, end, range(1, 41)),
        _store_state(whole, end, range(1, 41)),
    )
    assert resumed == uninterrupted
    _assert_statuses(uninterrupted["statuses"], rows, _expected_rebuild_times(rows, delay_ns, True))
    model = ReferenceModel(config=Config(), clock=clock)
    apply_events(model, rows, clock)
    _assert_rows_close(uninterrupted["rows"], model.aggregate_rows(end))
    for d in (data, whole):
        state = json.loads((d / "tidal-actors-cli.json").read_text())
        assert "stopped" not in state and state["pending_rematerializations"] == {}
        assert state["last_event_ns"] == end


def test_sigint_stops_simulate_and_a_second_simulate_explains(tmp_path: Path) -> None:
    data = tmp_path / "sim"
    proc = _interrupted_run(
        tmp_path,
        SLOW_SIMULATE,
        400,
        0.01,
        "simulate",
        "--scenario",
        "small",
        "--data-dir",
        data,
        "-q",
    )
    assert proc.returncode == 130, proc
    assert "Aborted" not in proc.stderr and "interrupted after" in proc.stderr, proc.stderr
    events = generate_events(load_scenario("small"))
    first = proc.stdout.splitlines()[0]
    assert first.startswith("interrupted after ") and f" of {len(events):,} rows" in first, first
    n = int(first.split()[2].replace(",", ""))
    assert 400 <= n < len(events)
    assert "a simulation cannot be resumed" in proc.stdout

    state = json.loads((data / "tidal-actors-cli.json").read_text())
    assert state["stopped"]["after_rows"] == n and state["last_event_ns"] == events[n - 1].ts_ns
    # the store reopens and holds the first n rows (the reference model's aggregates)
    config = load_scenario("small").build_config()
    clock = ManualClock(0)
    model = ReferenceModel(config=config, clock=clock)
    apply_events(model, events[:n], clock)
    at = events[n - 1].ts_ns
    with _open_read_only(data, at) as db:
        _assert_rows_close(db.aggregate_rows(at), model.aggregate_rows(at))
        assert db.stats()["signals"] == 0  # counters count since the open
    res = _subprocess_run("inspect", "--data-dir", data, "user", events[0].user_id)
    assert res.code == 0, res

    res = _subprocess_run("simulate", "--scenario", "small", "--data-dir", data, "-q")
    assert res.code == 2, res
    assert "not empty" in res.err and "simulate small seed 7" in res.err
    assert f"interrupted after {n:,} of {len(events):,} rows" in res.err
    assert "new or empty directory" in res.err


# ---------------------------------------------------------------- 12: event time


# purges at known times (default delay: 1,000 ms = 1 s of event time)
REMAT_LOG = "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n" + "".join(
    f"{line}\n"
    for line in [
        f"{T},assign,1,a,,,",
        f"{T},assign,2,a,,,",
        f"{T},signal,1,,10,1,1.0",
        f"{T},signal,2,,10,1,2.0",
        f"{T + S},purge,1,a,,,",  # a due at T+2s
        f"{T + 3 * S // 2},purge,2,a,,,",  # coalesced into that rebuild
        f"{T + 3 * S // 2},signal,2,,11,1,1.0",
        f"{T + 2 * S},signal,1,,12,1,1.0",  # a is rebuilt before this row, at T+2s
        f"{T + 4 * S},purge,2,a,,,",  # due T+5s: after the last row
        f"{T + 4 * S},purge,1,@community,,,",
    ]
)
# (user, cohort, retracted live, rematerialized at), by hand
REMAT_EXPECTED = [
    (1, "a", 1, T + 2 * S),
    (2, "a", 1, T + 2 * S),
    (2, "a", 1, T + 5 * S),
    (1, COMMUNITY, 2, T + 5 * S),
]


def _purge_lines(data: Path, users: list[int]) -> dict[str, str]:
    """``inspect purge`` output of every purge of ``users``, by purge id (in process,
    on the real store: many commands, so no interpreter start for each)."""
    runner, out = CliRunner(), {}
    for u in users:
        res = runner.invoke(
            cli_module.cli, ["inspect", "--data-dir", str(data), "manifests", str(u)]
        )
        assert res.exit_code == 0, res.output
        for pid in [w for w in res.stdout.split() if len(w) == 32]:
            res = runner.invoke(cli_module.cli, ["inspect", "--data-dir", str(data), "purge", pid])
            assert res.exit_code == 0, res.output
            out[pid] = res.stdout
    return out


def test_rematerialization_times_are_event_times_by_hand(tmp_path: Path) -> None:
    log, data = tmp_path / "remat.csv", tmp_path / "data"
    log.write_text(REMAT_LOG)
    res = _subprocess_run("replay", log, "--data-dir", data, "-q")
    assert res.code == 0, res
    with _open_read_only(data, T + 4 * S) as db:
        manifests = sorted(
            (m for u in (1, 2) for m in db.list_purge_manifests(u)), key=lambda m: m.purge_id
        )
        got = [db.purge_status(m.purge_id) for m in manifests]
    assert [
        (s.user_id, s.cohort, s.retracted_live, s.rematerialized_at_ns) for s in got
    ] == REMAT_EXPECTED
    assert all(s.rematerialized and s.excluded_by_rematerialization == 0 for s in got)
    lines = _purge_lines(data, [1])
    assert any(f"re-materialized at {T + 2 * S} " in text for text in lines.values()), lines

    # with the delay off, every purged cohort is rebuilt at the end, at the last event
    config, off = tmp_path / "off.toml", tmp_path / "off"
    config.write_text("[purge]\nrematerialize_after_ms = false\n")
    res = _subprocess_run("replay", log, "--config", config, "--data-dir", off, "-q")
    assert res.code == 0, res
    with _open_read_only(off, T + 4 * S) as db:
        got = [db.purge_status(m.purge_id) for m in manifests]
    assert [(s.user_id, s.cohort, s.rematerialized_at_ns) for s in got] == [
        (u, c, T + 4 * S) for u, c, _, _ in REMAT_EXPECTED
    ]


def test_two_replays_at_different_speeds_record_the_same_purge_statuses(tmp_path: Path) -> None:
    rows = _generated_log(700, seed=11, purge_every=40)
    users = sorted({r.user_id for r in rows if isinstance(r, PurgeRow)})
    log = tmp_path / "gen.csv"
    write_events(log, rows)
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    res = _subprocess_run("replay", log, "--data-dir", fast, "-q")
    assert res.code == 0, res
    # the slow one takes ~2 s of wall time: the runtime's 1 s timer would fire in it
    wrapper = tmp_path / "slow.py"
    wrapper.write_text(SLOW_CLI)
    proc = subprocess.run(
        [
            sys.executable,
            str(wrapper),
            str(tmp_path / "m"),
            "1",
            "0.003",
            "replay",
            log,
            "--data-dir",
            slow,
            "--batch-size",
            "1",
            "-q",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc
    end = rows[-1].ts_ns
    a, b = _store_state(fast, end, range(1, 41)), _store_state(slow, end, range(1, 41))
    assert a["statuses"] == b["statuses"]
    _assert_statuses(a["statuses"], rows, _expected_rebuild_times(rows, S, True))
    lines = _purge_lines(fast, users)
    assert len(lines) == len(a["statuses"]) and lines == _purge_lines(slow, users)


def test_the_go_on_command_keeps_skip_invalid():
    """``--skip-rows N`` counts valid rows when invalid ones were skipped: the command
    printed to go on must skip them the same way, or it stops at a row already passed."""
    from tidal_actors.cli.safety import go_on_command

    cmd = go_on_command(Path("log.csv"), Path("db dir"), 551, skip_invalid=True)
    assert (
        cmd
        == "tidal-actors replay log.csv --data-dir 'db dir' --skip-rows 551 --append --skip-invalid"
    )
    assert go_on_command(Path("log.csv"), Path("d"), 3).endswith("--skip-rows 3 --append")
    outputs = {"--scores-out": Path("s.csv"), "--report-out": None}
    assert go_on_command(Path("l"), Path("d"), 3, outputs=outputs).endswith(
        "--append --scores-out s.csv"
    )


def test_the_settings_file_leaves_out_where_the_actors_ran(tmp_path: Path) -> None:
    """The next command picks its host again (docs/cluster.md): a run on the Ray host
    does not record it, nor a default pykka one it did not choose."""
    cfg = Config(host="ray", ray_address="auto", ledger_shards=3)
    store.write_state(tmp_path, cfg, 5, "test")
    state = json.loads((tmp_path / store.STATE_FILE).read_text())
    assert "host" not in state["config"] and "ray_address" not in state["config"]
    again = store.stored_config(tmp_path)
    assert again is not None
    assert (again.host, again.ray_address, again.ledger_shards) == ("pykka", None, 3)


def test_a_stop_asked_after_the_last_model_row_stops_before_the_comparison() -> None:
    """A stop asked after both passes took their last row (the last time the run
    asks, found by a first run that is never stopped) stops it before the
    comparison, as a stop during the model's pass does (phase "check")."""
    from tidal_actors import TidalDb
    from tidal_actors.loadsim.interrupt import Interrupted
    from tidal_actors.loadsim.simulate import run_simulation

    scenario = load_scenario("small")
    events = generate_events(scenario)

    def run(stop_at: int | None) -> int:
        asked = {"n": 0}

        def stop() -> bool:
            asked["n"] += 1
            return asked["n"] == stop_at

        result = run_simulation(
            scenario,
            lambda cfg, clk: TidalDb.open(None, config=cfg, clock=clk),
            reference=ReferenceModel,
            events=events,
            stop=stop,
        )
        assert result.ok
        return asked["n"]

    last = run(None)  # how many times a whole run asks
    assert last > 2 * len(events)  # before each row of both passes, and more
    with pytest.raises(Interrupted) as info:
        run(last)
    assert info.value.phase == "check" and info.value.rows == len(events)
