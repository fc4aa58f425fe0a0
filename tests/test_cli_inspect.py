"""``tidal-actors inspect``: where ``--data-dir`` may go, a user the store never saw,
an unknown purge id, what a purge's status line counts, and the users table's width.

Expected values are worked out from the logs written here, not copied from the code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_cli import HAND_FLAGS, HAND_LOG, H, Run, T, _subprocess_run
from .test_cli import run as run  # noqa: F401  (the fixture)
from .test_cli_rough_edges import USERS_LOG, _replayed

HEADER = HAND_LOG.splitlines()[0]


@pytest.mark.parametrize("sub", [["user", "2"], ["users"], ["top", "a"], ["manifests", "2"]])
def test_data_dir_before_the_subcommand_at_the_top(
    run: Run, tmp_path: Path, sub: list[str]
) -> None:
    data = _replayed(run, tmp_path)
    after = run("inspect", *sub, "--data-dir", data)
    top = run("--data-dir", data, "inspect", *sub)
    assert after.code == 0 and top.code == 0, (after, top)
    assert top.out == after.out and top.out


def test_data_dir_at_the_top_for_replay_and_two_different_ones_refused(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text(USERS_LOG)
    res = _subprocess_run("--data-dir", tmp_path / "d", "replay", log, *HAND_FLAGS, "-q")
    assert res.code == 0 and (tmp_path / "d" / "data.mdb").exists(), res
    (tmp_path / "other").mkdir()
    res = _subprocess_run(
        "--data-dir", tmp_path / "d", "inspect", "user", 2, "--data-dir", tmp_path / "other"
    )
    assert res.code == 2 and "--data-dir given twice" in res.err, res
    res = _subprocess_run("--data-dir", tmp_path / "missing", "inspect", "users")
    assert res.code == 2 and "no such directory" in res.err and not (tmp_path / "missing").exists()


def test_a_user_the_store_never_saw_is_said_so(run: Run, tmp_path: Path) -> None:
    data = _replayed(run, tmp_path)
    res = run("inspect", "user", 99999, "--data-dir", data)
    assert res.code == 0, res
    assert res.out.startswith("user 99999: the store has no record of this user"), res.out
    assert "status" not in res.out
    # a user it holds is shown as before: user 2 left at T+3H, in a and b
    res = run("inspect", "user", 2, "--data-dir", data)
    assert "status         Left" in res.out and "cohorts        a, b" in res.out, res.out


def test_an_unknown_purge_id_names_the_id_only(tmp_path: Path) -> None:
    data = _replayed(_subprocess_run, tmp_path)
    unknown = "00000000000000000000000000000abc"
    res = _subprocess_run("inspect", "purge", unknown.upper(), "--data-dir", data)
    assert res.code == 2 and res.out == "", res
    assert res.err.strip() == f"tidal-actors: error: no purge with id {unknown} in {data}"


def test_the_users_table_is_as_wide_as_its_widest_id(run: Run, tmp_path: Path) -> None:
    data = _replayed(run, tmp_path, USERS_LOG + f"{T + 3 * H},assign,123456,a,,,\n")
    lines = run("inspect", "users", "--data-dir", data).out.splitlines()
    # the id column is 7 wide ("user_id"; 123456 has 6 digits), not 20
    assert lines[1] == "  user_id  status   cohorts"
    assert lines[2:] == [
        "        1  Active         1",
        "        2  Left           2",
        "   123456  Active         1",
    ]


def test_a_purge_status_says_what_the_rebuild_also_left_out(tmp_path: Path) -> None:
    # a log of 2 records: user 1's 3 signals to a (6 records: a and @community) are
    # evicted by user 2's 4 signals (8 records, to b and @community) before the purge
    config = tmp_path / "c.toml"
    config.write_text("[contribution_log]\nmax_contribution_log_entries = 2\n")
    rows = [f"{T},assign,1,a,,,", f"{T},assign,2,b,,,"]
    rows += [f"{T + i},signal,1,,7,1,1.0" for i in range(1, 4)]
    rows += [f"{T + 10 + i},signal,2,,8,1,1.0" for i in range(4)]
    rows += [f"{T + 100},purge,1,a,,,", f"{T + 5 * H},signal,2,,8,1,1.0"]  # the rebuild is due
    log = tmp_path / "log.csv"
    log.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    data = tmp_path / "d"
    res = _subprocess_run("replay", log, "--config", config, "--data-dir", data, "-q")
    assert res.code == 0, res
    res = _subprocess_run("inspect", "manifests", 1, "--data-dir", data)
    assert "entries     0   evicted before the purge: 3" in res.out, res.out
    pid = next(w for w in res.out.split() if len(w) == 32)
    res = _subprocess_run("inspect", "purge", pid, "--data-dir", data)
    assert res.code == 0, res
    assert "retracted live 0, re-materialized at " in res.out
    assert "the rebuild also left out 3 records the log no longer held" in res.out, res.out
    # the hand log's purge (user 2's one record to b, live): nothing more, nothing said
    (tmp_path / "h").mkdir()
    hand = _replayed(_subprocess_run, tmp_path / "h")
    res = _subprocess_run("inspect", "manifests", 2, "--data-dir", hand)
    assert "left out" not in res.out and "re-materialized at" in res.out, res.out
