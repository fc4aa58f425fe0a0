"""Settings given by a name that is not one (issue 18): ``Config(bogus=1)``, a typo of
a setting's name, in keywords and in TOML, and a TOML section that does not exist.
Each error names the setting (a TOML key by its dotted path) and the value, says
which names are close (``difflib``'s closest, computed here the same way from the
field list, not copied from the code) or, when none is, lists them all; nothing is
built.

The expected names come from ``dataclasses.fields(Config)`` and the section list of
``config/default.toml`` (parsed here), not from the module that checks them.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from pathlib import Path

import pytest

from tidal_actors import Config, InvalidArgument

ROOT = Path(__file__).resolve().parents[1]
FIELDS = sorted(f.name for f in dataclasses.fields(Config))
# the sections of the documented default file, and the settings each holds (those
# left unset there are commented out: `# name = value` inside their section)
DEFAULT_TEXT = (ROOT / "config" / "default.toml").read_text()
DEFAULT = tomllib.loads(DEFAULT_TEXT)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    section = None
    for line in text.splitlines():
        if head := re.fullmatch(r"\[(\w+)\]\s*", line):
            section = head.group(1)
            out[section] = set()
        elif sub := re.fullmatch(r"\[(\w+)\.(\w+)\]\s*", line):
            out[sub.group(1)].add(sub.group(2))  # a setting that is a table
            section = None  # its keys are not settings
        elif section is not None and (key := re.match(r"#?\s*([a-z_]+)\s*=", line)):
            out[section].add(key.group(1))
    return {k: sorted(v) for k, v in out.items()}


SECTIONS = _sections(DEFAULT_TEXT)


def _closest(name: str, names: list[str]) -> list[str]:
    return difflib.get_close_matches(name, names, n=3)


def _raised(make: object) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        make()  # type: ignore[operator]
    return err.value


def test_the_default_file_has_the_sections_this_test_expects() -> None:
    assert "decay" in SECTIONS and "window" in SECTIONS and len(SECTIONS) >= 8
    assert sorted(k for ks in SECTIONS.values() for k in ks) == FIELDS
    assert Config.from_mapping(DEFAULT) == Config()  # the file is the defaults


@pytest.mark.parametrize("name", ["bogus", "half_life", "windw_buckets", "ledgershards", "hots"])
def test_an_unknown_keyword_names_the_closest_settings_or_all(name: str) -> None:
    for make in (lambda: Config(**{name: 7}), lambda: Config().replace(**{name: 7})):
        err = _raised(make)
        assert (err.field, err.value) == (name, 7)
        close = _closest(name, FIELDS)
        if close:
            assert str(err).endswith(f"did you mean {', '.join(close)}?")
        else:
            assert str(err).endswith(f"; the settings: {', '.join(FIELDS)}")
        assert str(err).startswith(f"invalid {name}=7: not a setting of Config; ")


def test_typos_do_name_a_setting_and_nonsense_lists_them() -> None:
    """The two branches above are both taken (the parameters are not all one kind)."""
    assert _closest("windw_buckets", FIELDS) == ["window_buckets"]
    assert _closest("bogus", FIELDS) == []


def test_an_unknown_toml_section_is_called_a_section(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[bogus]\nwindow_buckets = 4\n")
    err = _raised(lambda: Config.from_toml(cfg))
    assert (err.field, err.value) == ("config.bogus", {"window_buckets": 4})
    listed = ", ".join(f"[{s}]" for s in sorted(SECTIONS))
    assert err.reason == (
        f"unknown section; the sections: {listed} (a setting may also sit at the top "
        f"level) (in {cfg})"
    )
    assert "setting" not in err.reason.split(";")[0]
    cfg.write_text("[windw]\nwindow_buckets = 4\n")
    err = _raised(lambda: Config.from_toml(cfg))
    assert err.reason.startswith("unknown section; did you mean [window]? ")


@pytest.mark.parametrize(
    ("text", "field", "value", "known"),
    [
        ('halflife_ns = "7d"\n', "config.halflife_ns", "7d", FIELDS),
        ("qqqq = 4\n", "config.qqqq", 4, FIELDS),
        ("[window]\nwindow_bukets = 4\n", "config.window.window_bukets", 4, SECTIONS["window"]),
        ("[window]\nqqqq = 4\n", "config.window.qqqq", 4, SECTIONS["window"]),
    ],
)
def test_an_unknown_toml_setting_names_its_path_and_value(
    tmp_path: Path, text: str, field: str, value: object, known: list[str]
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    err = _raised(lambda: Config.from_toml(cfg))
    assert (err.field, err.value) == (field, value)
    name = field.rpartition(".")[2]
    close = _closest(name, known)
    hint = f"did you mean {', '.join(close)}?" if close else ", ".join(known)
    assert err.reason.endswith(f"{hint} (in {cfg})"), err.reason
    assert str(err).startswith(f"invalid {field}={value!r}: ")


def test_a_setting_in_another_section_names_its_home(tmp_path: Path) -> None:
    home = next(s for s, keys in SECTIONS.items() if "window_buckets" in keys)
    err = _raised(lambda: Config.from_mapping({"decay": {"window_buckets": 4}}))
    assert (err.field, err.value) == ("config.decay.window_buckets", 4)
    assert err.reason == f"not a setting of section [decay]; it belongs in [{home}]"


def test_a_setting_set_twice_names_both_places() -> None:
    err = _raised(
        lambda: Config.from_mapping({"window_buckets": 3, "window": {"window_buckets": 4}})
    )
    assert (err.field, err.value) == ("config.window.window_buckets", 4)
    assert err.reason == "set twice (also as config.window_buckets)"


def test_the_command_line_says_unknown_section_with_exit_2(tmp_path: Path) -> None:
    from .test_cli import HAND_LOG, _subprocess_run

    log, cfg = tmp_path / "log.csv", tmp_path / "c.toml"
    log.write_text(HAND_LOG)
    cfg.write_text("[bogus]\nx = 1\n")
    res = _subprocess_run("replay", log, "--config", cfg)
    assert (res.code, res.out) == (2, "")
    assert res.err.startswith(
        "tidal-actors: error: invalid config.bogus={'x': 1}: unknown section;"
    )
