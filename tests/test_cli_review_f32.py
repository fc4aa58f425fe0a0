"""What a new user's review of the command line found (round 32): a bad row inside
the rows ``--skip-rows`` was to skip, links to a store's environment, stores made
inside another store, settings overrides on ``--append``, and wording.

Expected values are worked out from the logs written here, not copied from the code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal_actors import Config, InvalidArgument

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


def test_a_bad_value_in_toml_is_named_by_its_dotted_path_in_tomls_words(tmp_path: Path) -> None:
    toml = tmp_path / "f.toml"
    toml.write_text("[window]\nwindow_buckets = 1000.0\n")
    with pytest.raises(InvalidArgument) as info:
        Config.from_toml(toml)
    assert str(info.value) == (
        f"invalid config.window.window_buckets=1000.0: must be a positive int (in {toml})"
    )
    # TOML has no null: off is `false` (rematerialize_after_ms has a default: not "omit")
    toml.write_text("[purge]\nrematerialize_after_ms = true\n")
    with pytest.raises(InvalidArgument) as info:
        Config.from_toml(toml)
    assert str(info.value) == (
        "invalid config.purge.rematerialize_after_ms=True: must be false or in "
        f"[0, 86400000] (in {toml})"
    )
    # store_layout's default is None: false, or leaving it out
    toml.write_text('[storage]\nstore_layout = "one"\n')
    with pytest.raises(InvalidArgument) as info:
        Config.from_toml(toml)
    assert str(info.value).startswith(
        "invalid config.storage.store_layout='one': must be false or left out (the host's"
    ), info.value
    # from Python, None is Python's word
    with pytest.raises(InvalidArgument, match=r"must be None or in \[0, 86400000\]$"):
        Config(rematerialize_after_ms=True)


def test_a_per_type_half_life_key_must_be_an_int(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        Config(half_life_ns_by_type={"3": "1d"})  # type: ignore[dict-item]
    assert str(info.value) == (
        "invalid half_life_ns_by_type['3']='1d': keys must be int signal type ids in "
        "[0, 2**64), not str"
    )
    with pytest.raises(InvalidArgument) as info:
        Config(half_life_ns_by_type={-1: 5})
    assert str(info.value) == (
        "invalid half_life_ns_by_type[-1]=5: keys must be int signal type ids in [0, 2**64)"
    )
    assert Config(half_life_ns_by_type={3: "1d"}).half_life_ns_by_type == {3: 86_400 * 10**9}


def test_inspect_cohorts_says_the_members_are_todays(tmp_path: Path) -> None:
    log, data = tmp_path / "log.csv", tmp_path / "D"
    log.write_text(GOOD_LOG + "3000,leave,1,,,,\n")
    assert run("replay", log, "--data-dir", data, "-q").code == 0
    res = run("inspect", "cohorts", "--data-dir", data, "--at", 1500)
    assert res.code == 0, res
    header = res.out.splitlines()[1].split()
    assert header == ["cohort", "members", "(now)", "keys"], res.out


def test_ray_address_without_the_ray_host_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        Config(host="pykka", ray_address="local")
    assert str(info.value) == (
        "invalid ray_address='local': means something only with host='ray' (host is "
        "'pykka'): set host='ray', or leave ray_address out"
    )
    with pytest.raises(InvalidArgument, match=r"^invalid ray_address='10.0.0.2:6379': "):
        Config(ray_address="10.0.0.2:6379")  # host's default is pykka
    assert Config(host="ray", ray_address="local").ray_address == "local"


def test_replays_host_takes_the_place_of_the_files(tmp_path: Path) -> None:
    """``replay --host ray --config f.toml`` where the file names only the cluster
    (docs/cluster.md), and ``--host pykka`` on a file made for Ray: the run's host is
    the flag's, and a cluster address goes with the Ray host only."""
    from tidal_actors.cli.store import build_config

    toml = tmp_path / "f.toml"
    toml.write_text('[runtime]\nray_address = "10.0.0.2:6379"\n')
    config = build_config(None, toml, None, None, None, host="ray")
    assert (config.host, config.ray_address) == ("ray", "10.0.0.2:6379")
    toml.write_text('[runtime]\nhost = "ray"\nray_address = "auto"\n')
    config = build_config(None, toml, None, None, None, host="pykka")
    assert (config.host, config.ray_address) == ("pykka", None)
    config = build_config(None, toml, None, None, None)
    assert (config.host, config.ray_address) == ("ray", "auto")
