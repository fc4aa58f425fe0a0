"""What the command line says to a newcomer's slips (found following README.md and
docs/cli.md from a clean shell): a word where a number goes is called not an
integer (click's own type said "not a valid integer range"); ``inspect top --type
N`` of a type the cohort has no contribution of says so and names the types it has
(it printed "top 0" and a note blaming the read time), and ``inspect top`` of a
cohort with no contribution left says only that (no note on the read time, which
is not the reason); a misspelt setting or scenario key is named with the closest
ones. Expected texts are written out by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidal_actors._errors import InvalidArgument
from tidal_actors.cli import commands as cli_module
from tidal_actors.loadsim.scenario import FILE_KEYS, Scenario

from . import test_cli
from .test_cli import HAND_FLAGS, HAND_LOG, Run

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model


def _invoke(*args: object) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli_module.cli, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["replay", "{log}", "--skip-rows", "x"], "Invalid value for '--skip-rows': 'x'"),
        (["replay", "{log}", "--batch-size", "1k"], "Invalid value for '--batch-size': '1k'"),
        (
            ["replay", "{log}", "--window-buckets", "two"],
            "Invalid value for '--window-buckets': 'two'",
        ),
        (["inspect", "user", "abc", "--data-dir", "{dir}"], "Invalid value for 'USER_ID': 'abc'"),
        (
            ["inspect", "manifests", "u1", "--data-dir", "{dir}"],
            "Invalid value for 'USER_ID': 'u1'",
        ),
        (
            ["inspect", "top", "a", "--type", "x", "--data-dir", "{dir}"],
            "Invalid value for '--type': 'x'",
        ),
        (
            ["inspect", "top", "a", "-k", "ten", "--data-dir", "{dir}"],
            "Invalid value for '-k': 'ten'",
        ),
    ],
)
def test_a_word_for_a_number_is_not_an_integer(tmp_path: Path, args: list[str], said: str) -> None:
    log = tmp_path / "log.csv"
    log.write_text(HAND_LOG)
    code, out, err = _invoke(*(a.format(log=log, dir=tmp_path) for a in args))
    assert (code, out) == (2, "")
    assert err.endswith(f"Error: {said} is not a valid integer.\n"), err


def test_a_number_out_of_range_still_names_the_range(tmp_path: Path) -> None:
    code, _, err = _invoke("inspect", "top", "a", "-k", "0", "--data-dir", tmp_path)
    assert code == 2
    assert err.endswith("Error: Invalid value for '-k': 0 is not in the range 1<=x<=2147483647.\n")


def test_top_of_a_signal_type_the_cohort_lacks_names_the_ones_it_has(
    run: Run, tmp_path: Path
) -> None:
    """Cohort a of the hand log holds types 1 (entity 10) and 2 (entity 20) at T+3H."""
    log, data = tmp_path / "log.csv", tmp_path / "data"
    log.write_text(HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0
    res = run("inspect", "top", "a", "--type", "5", "--data-dir", data)
    assert (res.code, res.err) == (0, ""), res
    assert res.out == (
        "cohort a at 46800000000000 (1970-01-01 13:00:00.000 UTC)\n"
        "  signal type 5: no contribution in this cohort (its signal types: 1, 2)\n"
    )
    res = run("inspect", "top", "a", "--type", "2", "--data-dir", data)
    assert (res.code, res.err) == (0, ""), res
    assert res.out == (
        "cohort a at 46800000000000 (1970-01-01 13:00:00.000 UTC)\n"
        "  signal type 2: top 1\n"
        f"       1  entity 20                    score {0.5 * 2**-1!r}\n"
    )


def test_top_of_a_cohort_with_nothing_left_has_no_note_on_the_read_time(
    run: Run, tmp_path: Path
) -> None:
    """Cohort b of the hand log: user 2 is a member, their only signal to it purged."""
    log, data = tmp_path / "log.csv", tmp_path / "data"
    log.write_text(HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0
    res = run("inspect", "top", "b", "--data-dir", data)
    assert (res.code, res.err) == (0, ""), res
    assert (
        res.out == "cohort b at 46800000000000 (1970-01-01 13:00:00.000 UTC)\n  no contributions\n"
    )
    # before its contributions, a cohort that has some still gets the note
    res = run("inspect", "top", "a", "--type", "2", "--at", "1970-01-01", "--data-dir", data)
    assert res.code == 0, res
    assert res.out == "cohort a at 0 (1970-01-01 00:00:00.000 UTC)\n  signal type 2: top 0\n"
    assert res.err.startswith(
        "tidal-actors: note: no score above 0 at 0 (1970-01-01 00:00:00.000 UTC)"
    )


def test_a_misspelt_setting_names_the_closest(tmp_path: Path) -> None:
    log, cfg = tmp_path / "log.csv", tmp_path / "c.toml"
    log.write_text(HAND_LOG)
    for text, said in [
        (
            'half_life = "7d"\n',
            "invalid config.half_life='7d': unknown setting; did you mean half_life_ns, "
            "half_life_ns_by_type?",
        ),
        (
            '[decay]\nhalf_life = "7d"\n',
            "invalid config.decay.half_life='7d': not a setting of section [decay]; did you "
            "mean half_life_ns, half_life_ns_by_type?",
        ),
        (
            "[decay]\nwindow_buckets = 4\n",
            "invalid config.decay.window_buckets=4: not a setting of section [decay]; it "
            "belongs in [window]",
        ),
        (
            "[decay]\nqqqq = 4\n",
            "invalid config.decay.qqqq=4: not a setting of section [decay]; the settings of "
            "[decay]: half_life_ns, half_life_ns_by_type",
        ),
    ]:
        cfg.write_text(text)
        code, out, err = _invoke("replay", log, "--config", cfg)
        assert (code, out) == (2, "")
        assert err == f"tidal-actors: error: {said} (in {cfg})\n"


def test_a_misspelt_scenario_key_names_the_closest(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text('users = 10\nhalflife = "1h"\n')
    code, out, err = _invoke("simulate", "--scenario", scenario)
    assert (code, out) == (2, "")
    assert err == (
        "tidal-actors: error: invalid scenario.halflife='1h': unknown key; did you mean "
        f"half_life? (in {scenario})\n"
    )
    scenario.write_text("qqqq = 1\n")  # nothing close: no suggestion
    assert _invoke("simulate", "--scenario", scenario)[2] == (
        f"tidal-actors: error: invalid scenario.qqqq=1: unknown key (in {scenario})\n"
    )


def test_the_suggested_scenario_keys_are_the_documented_ones() -> None:
    """FILE_KEYS (what an unknown key's error suggests) is the table in docs/cli.md,
    and each is a key the scenario reader takes (a bad value is refused as bad, not
    as unknown)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    table = doc.split("| key | type | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = {
        name.strip("[]")
        for row in table.splitlines()[2:]
        if row.startswith("|")
        for name in re.findall(r"`([^`]+)`", row.split("|")[1])
    }
    assert documented == set(FILE_KEYS)
    for key in FILE_KEYS:
        with pytest.raises(InvalidArgument) as info:
            Scenario.from_mapping({key: object()})
        assert info.value.field.startswith(f"scenario.{key}")
        assert "unknown key" not in info.value.reason
