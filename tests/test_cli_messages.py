"""What the command line says to a newcomer's slips (found following README.md and
docs/cli.md from a clean shell): a word where a number goes is called not an
integer (click's own type said "not a valid integer range"). Expected texts are
written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tidal_actors.cli import commands as cli_module

from .test_cli import HAND_LOG


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
