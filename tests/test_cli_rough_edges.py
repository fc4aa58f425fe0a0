"""The command line's first-hour rough edges: option placement, listing a
store's users and cohorts, unknown cohorts, wording, closed pipes, ``python -m``,
timestamps going backwards.

Expected values are worked out from the logs written here, not copied from the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidal_actors._text import plural
from tidal_actors.cli import commands as cli_module

from . import test_cli
from .test_cli import HAND_FLAGS, HAND_LOG, ROOT, H, Run, T, _subprocess_run

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model

# HAND_LOG, then user 2 leaves: user 1 is in a (active), user 2 in a and b (left).
# At T+3H cohort a holds keys (10, 1) and (20, 2); b none (user 2's only signal to it
# was purged); @community the same two keys as a.
USERS_LOG = HAND_LOG + f"{T + 3 * H},leave,2,,,,\n"


def _replayed(run: Run, tmp_path: Path, log_text: str = USERS_LOG) -> Path:
    log, data = tmp_path / "log.csv", tmp_path / "data"
    log.write_text(log_text)
    res = run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet")
    assert res.code == 0, res
    return data


# ---------------------------------------------------------------- item 2


@pytest.mark.parametrize(
    "sub", [["user", "2"], ["top", "a"], ["manifests", "2"], ["users"], ["cohorts"]]
)
def test_data_dir_is_accepted_after_the_subcommand(
    run: Run, tmp_path: Path, sub: list[str]
) -> None:
    data = _replayed(run, tmp_path)
    before = run("inspect", "--data-dir", data, *sub)
    after = run("inspect", *sub, "--data-dir", data)
    assert before.code == 0 and after.code == 0, (before, after)
    assert after.out == before.out and after.out


def test_data_dir_after_purge_subcommand(tmp_path: Path) -> None:
    data = _replayed(_subprocess_run, tmp_path)
    res = _subprocess_run("inspect", "manifests", 2, "--data-dir", data)
    pid = next(w for w in res.out.split() if len(w) == 32)
    res = _subprocess_run("inspect", "purge", pid, "--data-dir", data)
    assert res.code == 0 and f"purge {pid}" in res.out and "cohort      b" in res.out, res


@pytest.mark.parametrize("sub", ["user", "users", "cohorts", "top", "manifests", "purge"])
def test_each_inspect_subcommand_help_lists_data_dir(sub: str) -> None:
    res = CliRunner().invoke(cli_module.cli, ["inspect", sub, "--help"])
    assert res.exit_code == 0, res.output
    assert "--data-dir" in res.stdout


def test_missing_data_dir_still_says_so() -> None:
    res = CliRunner().invoke(cli_module.cli, ["inspect", "users"])
    assert res.exit_code == 2 and "Missing option '--data-dir'" in res.stderr


# ---------------------------------------------------------------- item 3


def test_inspect_users_lists_status_and_cohort_counts(run: Run, tmp_path: Path) -> None:
    data = _replayed(run, tmp_path)
    res = run("inspect", "users", "--data-dir", data)
    assert res.code == 0, res
    lines = res.out.splitlines()
    assert lines[0].startswith("2 users: 1 active, 1 left")
    rows = [line.split() for line in lines[2:]]
    assert rows == [["1", "Active", "1"], ["2", "Left", "2"]]


def test_inspect_cohorts_lists_members_and_keys(run: Run, tmp_path: Path) -> None:
    data = _replayed(run, tmp_path)
    res = run("inspect", "cohorts", "--data-dir", data)
    assert res.code == 0, res
    lines = res.out.splitlines()
    assert lines[0].startswith("2 cohorts and @community at ")
    rows = [line.split() for line in lines[2:]]
    assert rows == [["@community", "-", "2"], ["a", "2", "2"], ["b", "1", "0"]]


def test_top_of_an_unknown_cohort_names_the_closest(run: Run, tmp_path: Path) -> None:
    data = _replayed(run, tmp_path)
    res = run("inspect", "top", "bb", "--data-dir", data)
    assert res.code == 2, res
    assert res.out == ""
    assert "cohort='bb'" in res.err and "did you mean 'b'" in res.err, res.err
    res = run("inspect", "top", "zzzzz", "--data-dir", data)
    assert res.code == 2 and "inspect cohorts" in res.err, res
    # a known cohort with nothing left in it is not an error
    res = run("inspect", "top", "b", "--data-dir", data)
    assert res.code == 0 and "no contributions" in res.out, res


# ---------------------------------------------------------------- item 8


@pytest.mark.parametrize(
    ("n", "want"), [(0, "0 rows"), (1, "1 row"), (2, "2 rows"), (1000, "1,000 rows")]
)
def test_plural(n: int, want: str) -> None:
    assert plural(n, "row") == want
    assert plural(1, "entry", "entries") == "1 entry"


def test_replay_summary_of_one_row_is_singular(run: Run, tmp_path: Path) -> None:
    log = tmp_path / "one.csv"
    log.write_text(HAND_LOG.splitlines()[0] + f"\n{T},assign,1,a,,,\n")
    res = run("replay", log)
    assert res.code == 0, res
    assert "replayed 1 row of" in res.out
    assert "in 0 manifests" in res.out
    log.write_text(
        HAND_LOG.splitlines()[0] + f"\n{T},assign,1,a,,,\n{T},signal,1,,1,1,1.0\n{T},purge,1,a,,,\n"
    )
    res = run("replay", log)
    assert res.code == 0 and "replayed 3 rows" in res.out and "in 1 manifest\n" in res.out, res


# ---------------------------------------------------------------- item 9


def test_python_dash_m_runs_the_cli() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "tidal_actors", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replay" in proc.stdout and "inspect" in proc.stdout


def _piped_to_head(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """``tidal-actors ARGS | head -1`` with a pipe that the reader closes at once."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidal_actors", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, b"", err)


def test_a_closed_pipe_ends_replay_and_inspect_quietly(tmp_path: Path) -> None:
    # many lines, so that the writer is still writing when the reader goes
    lines = [f"{T},assign,{u},c{u % 7},,," for u in range(3000)]
    log = tmp_path / "log.csv"
    log.write_text(HAND_LOG.splitlines()[0] + "\n" + "\n".join(lines) + "\n")
    data = tmp_path / "data"
    res = _piped_to_head(["replay", str(log), "--data-dir", str(data), "-q"], tmp_path)
    assert res.returncode in (0, 141) and b"Traceback" not in res.stderr, res
    res = _piped_to_head(["inspect", "users", "--data-dir", str(data)], tmp_path)
    assert res.returncode in (0, 141), res
    assert res.stderr == b"", res.stderr


def test_the_plot_hint_names_an_install_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    res = CliRunner().invoke(cli_module.cli, ["simulate", "--scenario", "small", "--plot", "x.png"])
    assert res.exit_code == 2, res.output
    assert "pip install -e '.[plot]'" in res.stderr
    assert "tidal_actors[plot]" not in res.stderr


# ---------------------------------------------------------------- item 15


def test_rows_earlier_than_the_row_before_are_counted(run: Run, tmp_path: Path) -> None:
    header = HAND_LOG.splitlines()[0]
    # times: T, T+2H, T+H (back), T+H (equal: not back), T (back), T+3H
    log = tmp_path / "back.csv"
    log.write_text(
        header
        + "\n"
        + "\n".join(
            [
                f"{T},assign,1,a,,,",
                f"{T + 2 * H},signal,1,,10,1,1.0",
                f"{T + H},signal,1,,11,1,1.0",
                f"{T + H},signal,1,,12,1,1.0",
                f"{T},signal,1,,13,1,1.0",
                f"{T + 3 * H},signal,1,,14,1,1.0",
            ]
        )
        + "\n"
    )
    report = tmp_path / "r.json"
    res = run("replay", log, "--report-out", report)
    assert res.code == 0, res
    assert json.loads(report.read_text())["rows_back_in_time"] == 2
    assert "2 rows earlier than the row before" in res.out, res.out
    res = run("replay", tmp_path / "back.csv", "--report-out", report, "--skip-rows", 3)
    assert json.loads(report.read_text())["rows_back_in_time"] == 1

    log.write_text(HAND_LOG)  # in order
    res = run("replay", log, "--report-out", report)
    assert json.loads(report.read_text())["rows_back_in_time"] == 0
    assert "earlier than the row before" not in res.out


def test_simulate_output_separates_numbers_and_counts_users_once(run: Run) -> None:
    from tidal_actors.loadsim.simulate import generate_events, load_scenario

    scenario = load_scenario("small")
    with_events = len({r.user_id for r in generate_events(scenario)})
    res = run("simulate", "--scenario", "small", "--quiet")
    assert res.code == 0, res
    lines = res.out.splitlines()
    idle = scenario.users - with_events
    header = f"{scenario.users:,} users" + (
        f" ({idle:,} of them without any event)" if idle else ""
    )
    assert header in lines[0], lines[0]
    assert f"{with_events:,} users (every user with an event)" in res.out, res.out
    start = next(i for i, line in enumerate(lines) if line.startswith("  latency"))
    rows = []
    for line in lines[start + 1 :]:  # the table: lines indented 4, up to the next section
        if not line.startswith("    ") or line[4] == " ":
            break
        if not line.startswith("    ("):
            rows.append(line)
    assert rows, res.out
    for row in rows:
        name_width = 4 + 19
        numbers = row[name_width:].split()
        assert len(numbers) == 5, row  # p50 p99 p99.9 max count: each its own token
        assert all(float(n.replace(",", "")) >= 0 for n in numbers), row
    ack = next(r for r in rows if r.strip().startswith("signal ack"))
    assert int(ack.split()[-1].replace(",", "")) == scenario.signals
    assert "weighted by its signals" in res.out
    assert " 1 signal types" not in res.out and "1 manifests" not in res.out


def test_ctrl_c_ends_the_trio_example_with_one_line() -> None:
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "trio_app.py"), "--signals", "100000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # not ignored
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("running:")  # the database is open
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["interrupted (Ctrl-C): stopped, database closed"], err
