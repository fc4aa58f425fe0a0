"""A new user's first hour: a ``--data-dir`` that cannot be made and output files that
cannot be written end a command at once with one line and exit status 2, before any
work and with nothing written; an unknown or bad setting is named with where it came
from; the top-level help lists every exit status; ``inspect top`` with nothing above
0 says how to read at another time.

Expected messages name what the user typed (the option, the path); they are not
copied from the code.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidal_actors import Config, InvalidArgument, ManualClock, TidalDb
from tidal_actors.cli import commands as cli_module
from tidal_actors.cli import store
from tidal_actors.loadsim import simulate as loadsim_simulate

from .test_cli import HAND_FLAGS, HAND_LOG, _subprocess_run

ROOT_USER = os.geteuid() == 0  # as root, chmod does not stop a write


def _invoke(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(cli_module.cli, [str(a) for a in args])
    return res.exit_code, res.stderr


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any work a command starts fail the test: opening a store, generating events."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the command started its work before checking its paths")

    monkeypatch.setattr(store, "open_db", refuse)
    monkeypatch.setattr(loadsim_simulate, "generate_events", refuse)


def _one_clean_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tidal-actors: error: "), err
    return lines[0]


# ---------------------------------------------------------------- --data-dir


@pytest.mark.parametrize("command", ["simulate", "replay"])
def test_a_data_dir_under_a_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    _no_work(monkeypatch)
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "sub"
    args = ["--scale", "0.01", "-q"] if command == "simulate" else [_log(tmp_path), "-q"]
    code, err = _invoke(command, *args, "--data-dir", target)
    assert code == 2
    line = _one_clean_line(err)
    assert str(target) in line and f"{tmp_path / 'afile'} is a file" in line


def test_a_data_dir_that_cannot_be_created_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_work(monkeypatch)
    parent = tmp_path / "locked"
    parent.mkdir()
    target = parent / "store"
    if ROOT_USER:  # chmod cannot refuse root: the OS's refusal is simulated
        real_mkdir = Path.mkdir

        def mkdir(self: Path, *args: object, **kwargs: object) -> None:
            if self == target:
                raise PermissionError(13, "Permission denied", str(self))
            real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "mkdir", mkdir)
    else:
        parent.chmod(0o500)
    try:
        code, err = _invoke("simulate", "--scale", "0.01", "-q", "--data-dir", target)
    finally:
        parent.chmod(0o700)
    assert code == 2
    line = _one_clean_line(err)
    assert f"cannot create --data-dir {target}: Permission denied" in line
    assert not target.exists()


# ---------------------------------------------------------------- outputs


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "log.csv"
    log.write_text(HAND_LOG)
    return log


@pytest.mark.parametrize(
    "command,option",
    [
        ("replay", "--scores-out"),
        ("replay", "--report-out"),
        ("simulate", "--report-out"),
        ("simulate", "--events-out"),
        ("simulate", "--plot"),
    ],
)
def test_an_output_in_a_missing_directory_stops_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, option: str
) -> None:
    _no_work(monkeypatch)
    data = tmp_path / "data"
    out = tmp_path / "missing" / "out.file"
    if command == "replay":
        args = [_log(tmp_path), *HAND_FLAGS]
    else:
        args = ["--scenario", "small", "--scale", "0.01"]
    code, err = _invoke(command, *args, "--data-dir", data, option, out, "-q")
    assert code == 2
    line = _one_clean_line(err)
    assert f"{option} {out}" in line and "does not exist" in line
    assert not data.exists() and not out.parent.exists()  # nothing written


def test_an_output_under_a_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_work(monkeypatch)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "s.csv"
    code, err = _invoke("replay", _log(tmp_path), "--scores-out", out)
    assert code == 2
    assert f"{tmp_path / 'afile'} is not a directory" in _one_clean_line(err)


@pytest.mark.skipif(ROOT_USER, reason="as root, chmod does not stop a write")
def test_an_output_in_a_read_only_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_work(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, err = _invoke("replay", _log(tmp_path), "--report-out", ro / "r.json")
    finally:
        ro.chmod(0o700)
    assert code == 2
    assert "not writable" in _one_clean_line(err)


def test_writable_outputs_are_still_written(tmp_path: Path) -> None:
    scores, report = tmp_path / "s.csv", tmp_path / "r.json"
    code, err = _invoke(
        "replay", _log(tmp_path), *HAND_FLAGS, "--scores-out", scores, "--report-out", report, "-q"
    )
    assert code == 0, err
    assert scores.read_text().startswith("cohort,entity_id")
    assert '"rows": ' in report.read_text()


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "make,field,hint",
    [
        (lambda: Config(foo=1), "foo", None),
        (lambda: Config(half_life=5), "half_life", "half_life_ns"),
        (lambda: Config().replace(window_bucket=3), "window_bucket", "window_buckets"),
    ],
)
def test_an_unknown_setting_is_invalid_argument_naming_it(make, field, hint) -> None:
    with pytest.raises(InvalidArgument) as err:
        make()
    assert err.value.field == field
    assert f"invalid {field}=" in str(err.value) and "not a setting of Config" in str(err.value)
    if hint is not None:
        assert hint in str(err.value)


def test_known_settings_still_construct() -> None:
    cfg = Config(half_life_ns="1h", window_buckets=3)
    assert (cfg.half_life_ns, cfg.window_buckets) == (3_600 * 10**9, 3)
    assert list(inspect.signature(Config).parameters)[:2] == [
        "half_life_ns",
        "half_life_ns_by_type",
    ]


@pytest.mark.parametrize(
    "toml,field",
    [
        ("[purge]\nrematerialize_after_ms = 1e12\n", "config.purge.rematerialize_after_ms"),
        ("[ingest]\ninflight_budget_ms = 60001\n", "config.ingest.inflight_budget_ms"),
        ("[purge]\nfoo = 1\n", "config.purge.foo"),
    ],
)
def test_a_bad_setting_in_a_config_file_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, field: str
) -> None:
    _no_work(monkeypatch)
    cfg = tmp_path / "settings.toml"
    cfg.write_text(toml)
    with pytest.raises(InvalidArgument) as err:
        Config.from_toml(cfg)
    assert err.value.field == field and f"(in {cfg})" in str(err.value)
    code, err_text = _invoke("replay", _log(tmp_path), "--config", cfg, "-q")
    assert code == 2
    assert str(cfg) in _one_clean_line(err_text)


# ---------------------------------------------------------------- the CLI's words


def test_the_top_level_help_lists_every_exit_status() -> None:
    res = CliRunner().invoke(cli_module.cli, ["--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for status in ("0 ok", "2 bad input", "1 the run failed", "130 stopped", "141 standard output"):
        assert status in text, status


def test_inspect_top_with_every_score_zero_hints_at_at(tmp_path: Path) -> None:
    """A store the library wrote (no last event recorded) read at the wall clock: a
    weight of 2.0 stamped in 2001 with a 1 h half-life has decayed to 0.0 by now."""
    path = tmp_path / "store"
    t = 10**18
    cfg = Config(half_life_ns="1h", rematerialize_after_ms=None)
    with TidalDb.open(path, config=cfg, clock=ManualClock(t)) as db:
        db.assign_cohort(1, "a")
        db.signal_with_context(1, 7, 1, 2.0)
    res = _subprocess_run("inspect", "top", "a", "--data-dir", path)
    assert res.code == 0, res
    assert "--at TIME" in res.err and "the wall clock" in res.err
    at_signal = _subprocess_run("inspect", "top", "a", "--data-dir", path, "--at", str(t))
    assert "score 2.0" in at_signal.out and "--at TIME" not in at_signal.err
