"""What a new user's review of the command line found (round 32): a bad row inside
the rows ``--skip-rows`` was to skip, links to a store's environment, stores made
inside another store, settings overrides on ``--append``, and wording.

Expected values are worked out from the logs written here, not copied from the code.
"""

from __future__ import annotations

import json
from pathlib import Path

from .test_cli import _subprocess_run as run

# row 3 (line 4) is bad; rows 1 and 2 are good, row 4 good
BAD_LOG = (
    "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n"
    "1000,assign,1,c1,,,\n"
    "2000,signal,1,,5,1,1.0\n"
    "3000,signal,1,,x,1,1.0\n"
    "4000,signal,1,,6,1,1.0\n"
)


def _stopped(data: Path) -> object:
    return json.loads((data / "tidal-actors-cli.json").read_text()).get("stopped")


def test_a_bad_row_inside_the_skipped_rows_is_the_error(tmp_path: Path) -> None:
    log, data = tmp_path / "bad.csv", tmp_path / "D"
    log.write_text(BAD_LOG)
    first = run("replay", log, "--data-dir", data, "-q")
    assert first.code == 2 and f"fix {log}:4, then:" in first.out, first
    assert first.out.rstrip().endswith("--skip-rows 2 --append"), first
    assert _stopped(data) == {"after_rows": 2, "why": "bad row"}
    # the user steps over the bad row by count: the row is the error, not the log's length
    again = run("replay", log, "--data-dir", data, "--append", "--skip-rows", 3, "-q")
    assert again.code == 2, again
    assert f"{log}:4: invalid entity_id='x'" in again.err, again
    assert "only 2 rows" not in again.err, again
    assert "--skip-rows 2 --append --skip-invalid" in again.err, again
    # nothing was applied: the position recorded by the first run stands
    assert _stopped(data) == {"after_rows": 2, "why": "bad row"}
    # the command the hint gives applies row 4 alone: 2 signals in all
    go_on = run("replay", log, "--data-dir", data, "--append", "--skip-rows", 2, "--skip-invalid")
    assert go_on.code == 0 and _stopped(data) is None, go_on
    res = run("inspect", "top", "c1", "--data-dir", data)
    entities = [line.split()[2] for line in res.out.splitlines() if "  entity " in line]
    assert res.code == 0 and sorted(entities) == ["5", "6"], res


GOOD_LOG = (
    "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n"
    "1000,assign,1,c1,,,\n"
    "2000,signal,1,,5,1,1.0\n"
)


def _config(data: Path) -> dict[str, object]:
    config = json.loads((data / "tidal-actors-cli.json").read_text())["config"]
    assert isinstance(config, dict)
    return config


def test_append_refuses_an_override_that_changes_the_stores_settings(tmp_path: Path) -> None:
    log, data = tmp_path / "log.csv", tmp_path / "D"
    log.write_text(GOOD_LOG)
    assert run("replay", log, "--data-dir", data, "--half-life", "7d", "-q").code == 0
    before = (data / "tidal-actors-cli.json").read_text()
    res = run("replay", log, "--data-dir", data, "--append", "--skip-rows", 2, "--half-life", "3d")
    assert res.code == 2 and res.out == "", res
    assert res.err.strip() == (
        f"tidal-actors: error: --append keeps the settings of the store in {data}: "
        "its half_life_ns is 7d, --half-life gives 3d. Leave the option out, or "
        "replay into a new directory to use other settings"
    ), res
    assert (data / "tidal-actors-cli.json").read_text() == before
    toml = tmp_path / "w.toml"
    toml.write_text("[window]\nwindow_buckets = 12\n")
    res = run("replay", log, "--data-dir", data, "--append", "--skip-rows", 2, "--config", toml)
    assert res.code == 2 and "its window_buckets is 24, --config gives 12" in res.err, res
    # the same value, or none, is no change: accepted
    res = run("replay", log, "--data-dir", data, "--append", "--skip-rows", 2, "--half-life", "7d")
    assert res.code == 0, res
    assert _config(data)["half_life_ns"] == 7 * 86_400 * 10**9
